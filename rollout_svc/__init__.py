"""rollout_svc: one rollout replica -- a vLLM engine generating from the ``prompts`` stream
into ``rollouts``, with in-place weight updates from the weight channel (docs/rollout.md).

Entry point: ``python -m rollout_svc --config job.yaml``. Importing this package is cheap
(no torch/vLLM); the heavy modules are imported by the entry point after argument parsing.
"""
