"""Building blocks of :mod:`trainer_svc.core_algos`.

Import the public names from ``trainer_svc.core_algos``; the modules here are split only
to keep each file small:

- ``functional``: masked reductions, whitening, entropy, ``agg_loss``, ``kl_penalty``;
- ``registry``: the advantage-estimator / policy-loss registries and config access;
- ``advantage``: the advantage estimators (GAE, GRPO, RLOO, REINFORCE++, ReMax, ...);
- ``policy_loss``: the policy, value and entropy losses;
- ``off_policy``: rollout-correction weights (truncated IS, decoupled PPO);
- ``kl_control``: KL-in-reward controllers and ``apply_kl_penalty``.
"""
