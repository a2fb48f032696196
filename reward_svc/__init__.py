"""reward_svc: scores generated samples (``rollouts`` -> ``experience``, gRPC ``Score``).

See docs/reward.md; the whole system: docs/architecture.md.
"""
