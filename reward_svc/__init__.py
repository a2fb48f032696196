"""reward_svc: see ../shared DESIGN.md and docs/."""
