"""verl's further registered policy losses: ``dppo_tv``, ``dppo_kl``, ``sapo``, ``cispo``,
``geo_mean``, ``dro``, ``clip_cov``, ``kl_cov``, ``bypass_mode``.

Same signature and return shape as ``vanilla`` (see :mod:`trainer_svc.algos.policy_loss`).
Settings missing from ``config`` take verl's ``ActorConfig`` / ``PolicyLossConfig``
defaults (``clip_ratio_c`` 3.0, ``tau_pos`` 1.0, ``tau_neg`` 1.05, ``policy_loss.*``:
``clip_cov_ratio`` 2e-4, ``clip_cov_lb`` 1.0, ``clip_cov_ub`` 5.0, ``kl_cov_ratio`` 2e-4,
``ppo_kl_coef`` 0.1; ``dro_beta`` has no default).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from trainer_svc.algos.functional import agg_loss, masked_mean
from trainer_svc.algos.off_policy import compute_rollout_correction_weights
from trainer_svc.algos.policy_loss import (
    _check_same_shape,
    _clip_ranges,
    compute_policy_loss_vanilla,
    global_batch_kwargs,
)
from trainer_svc.algos.registry import cfg_get, register_policy_loss

__all__ = [
    "compute_policy_loss_bypass_mode",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dro",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_sapo",
]

Metrics = dict[str, Any]


def _policy_loss_cfg(config: Optional[Any], key: str, default: Any) -> Any:
    """``config.policy_loss.<key>`` (dict or object), or ``default``."""
    return cfg_get(cfg_get(config, "policy_loss", None), key, default)


def _log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    return torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)


def _aggregate(pg_losses: torch.Tensor, mask: torch.Tensor, mode: str, config: Any, weights: Optional[torch.Tensor]):
    if weights is not None:
        pg_losses = pg_losses * weights
    return agg_loss(loss_mat=pg_losses, loss_mask=mask, loss_agg_mode=mode, **global_batch_kwargs(config))


def _metrics(clipfrac: torch.Tensor | float, ppo_kl: torch.Tensor, clipfrac_lower: torch.Tensor | float) -> Metrics:
    return {
        "actor/pg_clipfrac": float(clipfrac),
        "actor/ppo_kl": float(ppo_kl.detach()),
        "actor/pg_clipfrac_lower": float(clipfrac_lower),
    }


def _dppo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_is_weights: Optional[torch.Tensor],
    divergence: str,
) -> tuple[torch.Tensor, Metrics]:
    """DPPO: REINFORCE with a truncated, stop-gradient ratio, masking tokens whose
    probability moved too far from the old policy in the direction the advantage pushes.

    ``tv``: mask if ``p - p_old > high`` (A > 0) or ``< -low`` (A <= 0).
    ``kl``: mask if the binary KL between ``p_old`` and ``p`` exceeds ``high`` while ``p``
    rose (A > 0), or exceeds ``low`` while ``p`` fell (A <= 0).
    """
    _check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask)
    low, high, _ = _clip_ranges(config)
    clip_c = float(cfg_get(config, "clip_ratio_c", 3.0))
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, response_mask)
    truncated = torch.clamp(ratio, max=clip_c).detach()
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    if divergence == "tv":
        keep_pos = (prob - old_prob) <= high
        keep_neg = (prob - old_prob) >= -low
    else:
        binary_kl = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
            (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
        )
        keep_pos = (binary_kl <= high) | (prob <= old_prob)
        keep_neg = (binary_kl <= low) | (prob >= old_prob)
    keep = torch.where(advantages > 0, keep_pos, keep_neg).detach().float()
    pg_losses = -advantages * truncated * log_prob * keep
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    clipfrac = masked_mean(1.0 - keep, response_mask)
    clipfrac_lower = masked_mean((ratio > clip_c).float() * keep, response_mask)
    return pg_loss, _metrics(clipfrac, ppo_kl, clipfrac_lower)


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[Any] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, Metrics]:
    """DPPO with a total-variation trust region (``clip_ratio_low/high`` bound ``p - p_old``)."""
    return _dppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, "tv")


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[Any] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, Metrics]:
    """DPPO with a binary-KL trust region (``clip_ratio_low/high`` bound the divergence)."""
    return _dppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, "kl")


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Optional[Any] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, Metrics]:
    """SAPO: a smooth gate ``sigmoid(tau (r - 1)) * 4 / tau`` replaces the hard clip, with
    ``tau_pos`` for positive and ``tau_neg`` for non-positive advantages. As in verl the
    loss is always aggregated ``seq-mean-token-mean``."""
    _check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask)
    tau_pos = torch.as_tensor(cfg_get(config, "tau_pos", 1.0), dtype=advantages.dtype, device=advantages.device)
    tau_neg = torch.as_tensor(cfg_get(config, "tau_neg", 1.05), dtype=advantages.dtype, device=advantages.device)
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    taus = torch.where(advantages > 0, tau_pos, tau_neg)
    gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)
    pg_loss = _aggregate(-gates * advantages, response_mask, "seq-mean-token-mean", config, rollout_is_weights)
    return pg_loss, _metrics(0.0, masked_mean(-log_ratio, response_mask), 0.0)


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[Any] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, Metrics]:
    """CISPO: REINFORCE weighted by the clipped, stop-gradient ratio — every token keeps
    its gradient, only the importance weight is clipped."""
    _check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask)
    low, high, _ = _clip_ranges(config)
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - low, 1 + high)
    pg_losses = -clipped.detach() * advantages * log_prob
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    clipfrac = masked_mean((ratio != clipped).float(), response_mask)
    return pg_loss, _metrics(clipfrac, masked_mean(-log_ratio, response_mask), 0.0)


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[Any] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, Metrics]:
    """GMPO: per-sequence geometric mean of token ratios, each log-ratio clipped to
    ``[-low, high]`` in the direction of the advantage; loss ``-mean_i(A_i * ratio_i)``
    (``loss_agg_mode`` unused; sequence-level advantages assumed). Importance weights are
    reduced to one per sequence by their geometric mean."""
    _check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask)
    low, high, _ = _clip_ranges(config)
    log_ratio = log_prob - old_log_prob
    ppo_kl = masked_mean(-log_ratio, response_mask)
    sign = torch.sign(advantages)
    clamped = torch.clamp(log_ratio, -low, high)
    log_ratio_min = sign * torch.min(sign * log_ratio, sign * clamped)
    lengths = response_mask.sum(dim=-1)
    ratio = torch.exp((log_ratio_min * response_mask).sum(dim=-1) / (lengths + 1e-8))
    seq_adv = (advantages * response_mask).sum(dim=-1) / (lengths + 1e-8)
    pg_losses = -seq_adv * ratio
    if rollout_is_weights is not None:
        seq_w = torch.exp((torch.log(rollout_is_weights + 1e-10) * response_mask).sum(dim=-1) / (lengths + 1e-8))
        pg_losses = pg_losses * seq_w
    pg_loss = torch.mean(pg_losses)
    clipped = torch.ne(log_ratio, clamped)
    clipfrac = masked_mean((clipped * (advantages > 0)).float(), response_mask)
    clipfrac_lower = masked_mean((clipped * (advantages < 0)).float(), response_mask)
    return pg_loss, _metrics(clipfrac, ppo_kl, clipfrac_lower)


@register_policy_loss("dro")
def compute_policy_loss_dro(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[Any] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, Metrics]:
    """DRO: ``-(log_prob * A - beta/2 * (log_prob - old)^2)`` with ``policy_loss.dro_beta``.

    Raises:
        ValueError: ``dro_beta`` missing or not positive.
    """
    _check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask)
    beta = _policy_loss_cfg(config, "dro_beta", None)
    if beta is None or beta <= 0:
        raise ValueError("policy_loss.dro_beta must be a positive value when using DRO")
    log_ratio = log_prob - old_log_prob
    pg_losses = -(log_prob * advantages - 0.5 * beta * log_ratio.square())
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, {"actor/ppo_kl": float(masked_mean(-log_ratio, response_mask).detach())}


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[Any] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, Metrics]:
    """Clip-Cov: PPO clipping, plus the gradient of a random ``clip_cov_ratio`` share of
    tokens whose advantage/log-prob covariance lies in ``(clip_cov_lb, clip_cov_ub)`` is
    cut. Uses the global torch RNG (``torch.randperm``), as verl does."""
    _check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask)
    ratio_share = _policy_loss_cfg(config, "clip_cov_ratio", 0.0002)
    lower = _policy_loss_cfg(config, "clip_cov_lb", 1.0)
    upper = _policy_loss_cfg(config, "clip_cov_ub", 5.0)
    if not ratio_share > 0:
        raise ValueError(f"policy_loss.clip_cov_ratio must be positive, got {ratio_share}")
    low, high, _ = _clip_ranges(config)
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, response_mask)
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    clipped_by_ppo = (losses2 > losses1) & (response_mask > 0)
    cov = (advantages - masked_mean(advantages, response_mask)) * (
        log_prob - masked_mean(log_prob.detach(), response_mask)
    )
    cov = cov.masked_fill((response_mask == 0) | clipped_by_ppo, -torch.inf)
    budget = max(int(ratio_share * response_mask.sum().item()), 1)
    candidates = torch.nonzero((cov < upper) & (cov > lower) & (response_mask > 0))
    if len(candidates) > 0:
        candidates = candidates[torch.randperm(len(candidates))[: min(budget, len(candidates))]]
    corr = torch.ones_like(advantages)
    corr[candidates[:, 0], candidates[:, 1]] = 0
    pg_losses = torch.maximum(losses1, losses2) * corr
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    clipfrac = masked_mean((corr == 0).float(), response_mask)
    return pg_loss, {"actor/pg_clipfrac": float(clipfrac), "actor/ppo_kl": float(ppo_kl.detach())}


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[Any] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, Metrics]:
    """KL-Cov: unclipped ``-A * ratio``, plus ``ppo_kl_coef * |log ratio|`` on the top
    ``kl_cov_ratio`` share of valid tokens by advantage/log-prob covariance."""
    _check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask)
    share = _policy_loss_cfg(config, "kl_cov_ratio", 0.0002)
    coef = _policy_loss_cfg(config, "ppo_kl_coef", 0.1)
    if not share > 0:
        raise ValueError(f"policy_loss.kl_cov_ratio must be positive, got {share}")
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    abs_kl = log_ratio.abs()
    pg_losses = -advantages * ratio
    valid = response_mask > 0
    flat_valid = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
    if flat_valid.numel() > 0:
        adv_v = advantages[valid].detach().reshape(-1)
        logp_v = log_prob[valid].detach().reshape(-1)
        cov = (adv_v - adv_v.mean()) * (logp_v - logp_v.mean())
        top = torch.topk(cov, max(1, int(len(cov) * share)), largest=True).indices
        rows, cols = flat_valid[top] // advantages.shape[1], flat_valid[top] % advantages.shape[1]
        penalised = pg_losses.clone()
        penalised[rows, cols] = pg_losses[rows, cols] + coef * abs_kl[rows, cols]
        pg_losses = penalised
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, {"actor/ppo_kl": float(masked_mean(abs_kl, response_mask).detach())}


def compute_policy_loss_reinforce(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    config: Optional[Any] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, Metrics]:
    """REINFORCE with optional importance weights: per-token loss ``-w * log_prob * A``
    (``w`` = ``rollout_is_weights``, or 1); ``actor/ppo_kl`` is the mean of
    ``rollout_log_prob - log_prob``. Used by ``bypass_mode`` (not registered by itself,
    as in verl)."""
    _check_same_shape(
        rollout_log_prob=rollout_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask
    )
    pg_losses = -advantages * log_prob if rollout_is_weights is None else -advantages * log_prob * rollout_is_weights
    pg_loss = _aggregate(pg_losses, response_mask, loss_agg_mode, config, None)
    return pg_loss, {"actor/ppo_kl": float(masked_mean(rollout_log_prob - log_prob, response_mask).detach())}


@register_policy_loss("bypass_mode")
def compute_policy_loss_bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[Any] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, Metrics]:
    """verl's bypass mode: the trainer skips the old-log-prob recompute and passes the
    rollout log-probs as ``old_log_prob``; settings come from
    ``config.policy_loss.rollout_correction``:

    - ``loss_type="ppo_clip"`` (default): ``vanilla`` with ratio ``pi / pi_rollout`` (the
      clip already bounds the importance ratio, so no extra weights);
    - ``loss_type="reinforce"``: ``-w * log_prob * A`` with ``w`` the truncated IS weights
      ``pi / pi_rollout`` (``rollout_is``: token/sequence, ``rollout_is_threshold``,
      ``rollout_is_batch_normalize``), or plain REINFORCE with ``rollout_is`` unset.

    The passed ``rollout_is_weights`` are ignored (computed here). Rejection sampling
    (``rollout_rs``) is not implemented in meshrl and raises ``NotImplementedError``.
    """
    _check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask)
    corr = _policy_loss_cfg(config, "rollout_correction", None)
    if corr is None:
        raise ValueError("bypass_mode needs config.policy_loss.rollout_correction")
    if cfg_get(corr, "rollout_rs", None) is not None:
        raise NotImplementedError("rollout_rs (rejection sampling) is not implemented in meshrl's bypass_mode")
    loss_type = cfg_get(corr, "loss_type", "ppo_clip")
    level = cfg_get(corr, "rollout_is", None)
    weights: Optional[torch.Tensor] = None
    metrics: Metrics = {}
    if level is not None:
        with torch.no_grad():
            weights, metrics = compute_rollout_correction_weights(
                log_prob.detach() - old_log_prob,
                response_mask,
                level,
                cfg_get(corr, "rollout_is_threshold", 2.0),
                bool(cfg_get(corr, "rollout_is_batch_normalize", False)),
            )
    if loss_type == "ppo_clip":
        pg_loss, pg_metrics = compute_policy_loss_vanilla(
            old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, None
        )
    elif loss_type == "reinforce":
        pg_loss, pg_metrics = compute_policy_loss_reinforce(
            old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, weights
        )
    else:
        raise ValueError(f"rollout_correction.loss_type must be 'ppo_clip' or 'reinforce', got {loss_type!r}")
    pg_metrics.update({f"rollout_corr/{k}": v for k, v in metrics.items()})
    return pg_loss, pg_metrics
