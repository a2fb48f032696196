"""Building blocks of :mod:`trainer_svc.core_algos`.

Import the public names from ``trainer_svc.core_algos`` (verl's import path); the modules
here group the algorithms by family:

- ``functional``: masked reductions, whitening, entropy, ``agg_loss``, ``kl_penalty``;
- ``registry``: the advantage-estimator / policy-loss registries and config access;
- ``advantage_group``: group-relative outcome advantages (GRPO, RLOO, OPO, GPG,
  REINFORCE++-baseline, GDPO);
- ``advantage_returns``: advantages from returns-to-go (GAE, REINFORCE++, ReMax);
- ``advantage_token_baseline``: the optimal-token-baseline estimators;
- ``policy_loss_common``: the policy-loss signature, argument checks, clip ranges, aggregation;
- ``policy_loss_ppo``: importance-ratio surrogates (vanilla PPO, GSPO, GMPO, SAPO);
- ``policy_loss_reinforce``: policy-gradient losses with detached ratios (GPG, CISPO, DPPO,
  DRO, REINFORCE, bypass mode);
- ``policy_loss_covariance``: Clip-Cov and KL-Cov;
- ``value_entropy_loss``: the critic's value loss and the entropy loss;
- ``off_policy``: rollout-correction weights (truncated IS, decoupled PPO);
- ``kl_control``: KL-in-reward controllers and ``apply_kl_penalty``.
"""
