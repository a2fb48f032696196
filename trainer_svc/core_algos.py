"""meshrl's RL algorithms, with the names, keyword arguments, defaults and return values of
verl's ``verl.trainer.ppo.core_algos`` so that verl users' estimators and losses plug in
unchanged (``from trainer_svc.core_algos import register_adv_est, agg_loss, ...``).

What is here (details and worked examples in docs/algorithms.md):

- advantage estimators, registered by name (``ADV_ESTIMATOR_REGISTRY``,
  ``register_adv_est``, ``get_adv_estimator_fn``, ``AdvantageEstimator``): ``gae``,
  ``grpo`` (``norm_adv_by_std_in_grpo``; Dr.GRPO is its ``False`` setting together with
  ``loss_agg_mode="seq-mean-token-sum-norm"``), ``grpo_vectorized``, ``grpo_passk``,
  ``rloo``, ``rloo_vectorized``, ``reinforce_plus_plus``,
  ``reinforce_plus_plus_baseline``, ``remax``, ``opo``, ``gpg``, ``gdpo``,
  ``optimal_token_baseline``, ``tir_optimal_token_baseline``;
- ``kl_penalty`` (``kl``/``k1``, ``abs``, ``mse``/``k2``, ``low_var_kl``/``k3``, the
  straight-through ``+`` variants; ``full`` raises ``NotImplementedError`` as in verl);
- ``agg_loss`` (``token-mean``, ``seq-mean-token-sum``, ``seq-mean-token-mean``,
  ``seq-mean-token-sum-norm``, with verl's global-batch arguments);
- policy losses by name (``POLICY_LOSS_REGISTRY``, ``register_policy_loss``,
  ``get_policy_loss_fn``): ``vanilla`` (clip, asymmetric clip, dual clip), ``gspo``,
  ``gpg``, ``dppo_tv``, ``dppo_kl``, ``sapo``, ``cispo``, ``geo_mean``, ``dro``,
  ``clip_cov``, ``kl_cov``, ``bypass_mode``; the deprecated 4-tuple ``compute_policy_loss``; ``compute_value_loss``,
  ``compute_entropy_loss``;
- KL in reward: ``compute_rewards``, ``FixedKLController``, ``AdaptiveKLController``,
  ``get_kl_controller``, ``apply_kl_penalty``;
- off-policy correction from ``rollout_log_probs`` (``compute_off_policy_weights``:
  ``none`` / ``tis`` / ``decoupled``; ``compute_rollout_correction_weights``), fed to any
  policy loss as ``rollout_is_weights``;
- ``compute_advantage``: the dispatcher over a DataProto, as verl's trainer calls the
  estimators.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from trainer_svc.algos.advantage_group import (
    compute_gdpo_outcome_advantage,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
)
from trainer_svc.algos.advantage_returns import (
    compute_gae_advantage_return,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    expand_remax_baselines,
)
from trainer_svc.algos.advantage_token_baseline import (
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
)
from trainer_svc.algos import functional as _functional
from trainer_svc.algos.functional import (  # noqa: F401 -- re-exported (__all__)
    AGG_LOSS_MODES,
    KL_PENALTY_TYPES,
    UnknownKLPenaltyError,
    agg_loss,
    clip_by_value,
    entropy_from_logits,
    kl_penalty,
    kl_penalty_forward,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from trainer_svc.algos.kl_control import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    compute_pf_ppo_reweight_data,
    compute_rewards,
    get_kl_controller,
)
from trainer_svc.algos.off_policy import (
    OFF_POLICY_MODES,
    compute_off_policy_weights,
    compute_rollout_correction_weights,
    parse_rollout_is_threshold,
)
from trainer_svc.algos.policy_loss_common import global_batch_kwargs
from trainer_svc.algos.policy_loss_covariance import compute_policy_loss_clip_cov, compute_policy_loss_kl_cov
from trainer_svc.algos.policy_loss_ppo import (
    compute_policy_loss,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gspo,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
)
from trainer_svc.algos.policy_loss_reinforce import (
    compute_policy_loss_bypass_mode,
    compute_policy_loss_cispo,
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_dro,
    compute_policy_loss_gpg,
    compute_policy_loss_reinforce,
)
from trainer_svc.algos.value_entropy_loss import compute_entropy_loss, compute_value_loss
from trainer_svc.algos.registry import (
    ADV_ESTIMATOR_REGISTRY,
    POLICY_LOSS_REGISTRY,
    AdvantageEstimator,
    PolicyLossFn,
    cfg_get,
    get_adv_estimator_fn,
    get_policy_loss_fn,
    register_adv_est,
    register_policy_loss,
)

__all__ = [  # and, re-exported, every name of trainer_svc.algos.functional
    *_functional.__all__,
    "ADV_ESTIMATOR_REGISTRY",
    "OFF_POLICY_MODES",
    "POLICY_LOSS_REGISTRY",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "FixedKLController",
    "PolicyLossFn",
    "apply_kl_penalty",
    "cfg_get",
    "compute_advantage",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_gdpo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_off_policy_weights",
    "compute_opo_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_pf_ppo_reweight_data",
    "compute_policy_loss",
    "compute_policy_loss_bypass_mode",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dro",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_response_mask",
    "compute_rewards",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_rollout_correction_weights",
    "compute_value_loss",
    "expand_remax_baselines",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "global_batch_kwargs",
    "parse_rollout_is_threshold",
    "register_adv_est",
    "register_policy_loss",
]


_OTB_NAMES = (AdvantageEstimator.OPTIMAL_TOKEN_BASELINE.value, AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE.value)


def compute_response_mask(data: Any) -> torch.Tensor:
    """``[B, R]`` mask of the response tokens: the last ``R = responses.shape[1]`` columns
    of ``attention_mask`` (verl's ``compute_response_mask``)."""
    response_length = data.batch["responses"].size(1)
    return data.batch["attention_mask"][:, -response_length:]


def compute_advantage(
    data: Any,
    adv_estimator: str | AdvantageEstimator,
    gamma: float = 1.0,
    lam: float = 1.0,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool = True,
    config: Optional[Any] = None,
    multi_turn: bool = False,
) -> Any:
    """Fill ``data.batch["advantages"]`` and ``["returns"]`` (``[B, T]``) with the named
    estimator, calling it the way verl's trainer does so registered custom estimators
    receive the same arguments.

    Reads ``token_level_rewards`` and ``response_mask`` (computed from ``attention_mask``
    if absent); ``values`` for ``gae``; ``non_tensor_batch["uid"]`` as the group ``index``;
    ``reward_baselines`` when present (ReMax). ``gae`` gets ``gamma``/``lam``; ``grpo`` gets
    ``norm_adv_by_std_in_grpo`` (and, with ``multi_turn``, ``loss_mask`` as its mask); any
    other estimator gets ``token_level_rewards``, ``response_mask``, ``config`` and the
    optional ``index`` / ``reward_baselines``; ``gdpo`` also gets ``non_tensor_batch`` and
    ``batch``; the optimal-token-baseline estimators get ``sum_pi_squared``,
    ``old_log_probs`` and ``rollout_is_weights`` (or None). ``num_repeat`` is accepted
    for verl compatibility (unused there too).

    With ``gae`` and ``config.use_pf_ppo`` the batch is then resampled by
    :func:`compute_pf_ppo_reweight_data` (``config.pf_ppo.reweight_method/weight_pow``)
    and a *new* DataProto is returned — use the return value.

    Returns:
        ``data`` (modified in place), or the resampled batch with PF-PPO.
    """
    name = adv_estimator.value if isinstance(adv_estimator, AdvantageEstimator) else adv_estimator
    batch = data.batch
    if "response_mask" not in batch.keys():
        batch["response_mask"] = compute_response_mask(data)
    if name == AdvantageEstimator.GAE.value:
        if "values" not in batch.keys():
            raise ValueError("adv_estimator 'gae' needs data.batch['values'] from the critic")
        advantages, returns = compute_gae_advantage_return(
            token_level_rewards=batch["token_level_rewards"],
            values=batch["values"],
            response_mask=batch["response_mask"],
            gamma=gamma,
            lam=lam,
        )
        if cfg_get(config, "use_pf_ppo", False):
            batch["advantages"], batch["returns"] = advantages, returns
            pf = cfg_get(config, "pf_ppo", None)
            return compute_pf_ppo_reweight_data(
                data, cfg_get(pf, "reweight_method", "pow"), cfg_get(pf, "weight_pow", 2.0)
            )
    elif name == AdvantageEstimator.GRPO.value:
        mask = batch["response_mask"]
        if multi_turn:
            mask = batch["loss_mask"][:, -mask.shape[1] :]
        advantages, returns = compute_grpo_outcome_advantage(
            token_level_rewards=batch["token_level_rewards"],
            response_mask=mask,
            index=_uid_index(data, name),
            norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        )
    else:
        fn = get_adv_estimator_fn(name)
        kwargs: dict[str, Any] = {
            "token_level_rewards": batch["token_level_rewards"],
            "response_mask": batch["response_mask"],
            "config": config,
        }
        if "uid" in data.non_tensor_batch:
            kwargs["index"] = data.non_tensor_batch["uid"]
        if "reward_baselines" in batch.keys():
            kwargs["reward_baselines"] = batch["reward_baselines"]
        if name == AdvantageEstimator.GDPO.value:
            kwargs["non_tensor_batch"] = data.non_tensor_batch
            kwargs["batch"] = batch
        if name in _OTB_NAMES:
            if "sum_pi_squared" not in batch.keys():
                raise ValueError(f"adv_estimator {name!r} needs data.batch['sum_pi_squared'] from the actor")
            kwargs["sum_pi_squared"] = batch["sum_pi_squared"]
            kwargs["old_log_probs"] = batch["old_log_probs"]
            kwargs["rollout_is_weights"] = batch.get("rollout_is_weights", None)
        advantages, returns = fn(**kwargs)
    batch["advantages"] = advantages
    batch["returns"] = returns
    return data


def _uid_index(data: Any, name: str) -> Any:
    if "uid" not in data.non_tensor_batch:
        raise ValueError(f"adv_estimator {name!r} groups responses by prompt: data.non_tensor_batch['uid'] is missing")
    return data.non_tensor_batch["uid"]
