"""Policy-gradient (REINFORCE-style) losses: the gradient flows through ``log_prob`` times
the advantage, and the ratio to the old policy enters only as a detached weight or mask.
``gpg`` (plain ``-log_prob * A``); ``cispo`` (clipped detached ratio as weight);
``dppo_tv`` / ``dppo_kl`` (truncated ratio, tokens outside a total-variation / binary-KL
trust region masked); ``dro`` (squared log-ratio regulariser); ``compute_policy_loss_reinforce``
and ``bypass_mode`` (learning straight from rollout log-probs, verl's bypass mode).

Signature and settings: :mod:`trainer_svc.algos.policy_loss_common`. Settings missing from
``config`` take verl's ``ActorConfig`` / ``PolicyLossConfig`` defaults (``clip_ratio_c``
3.0; ``dro_beta`` has no default).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from trainer_svc.algos.functional import masked_mean
from trainer_svc.algos.off_policy import compute_rollout_correction_weights
from trainer_svc.algos.policy_loss_common import (
    Metrics,
    aggregate,
    check_same_shape,
    clamped_log_ratio,
    clip_ranges,
    policy_loss,
    policy_loss_setting,
    ratio_metrics,
)
from trainer_svc.algos.policy_loss_ppo import compute_policy_loss_vanilla
from trainer_svc.algos.registry import cfg_get

__all__ = [
    "compute_policy_loss_bypass_mode",
    "compute_policy_loss_cispo",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dro",
    "compute_policy_loss_gpg",
    "compute_policy_loss_reinforce",
]


@policy_loss("gpg")
def compute_policy_loss_gpg(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                            rollout_is_weights):
    """GPG / plain policy gradient: per-token loss ``-log_prob * A`` (no ratio, no clip)."""
    pg_loss = aggregate(-log_prob * advantages, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, {}


@policy_loss("cispo")
def compute_policy_loss_cispo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                              rollout_is_weights):
    """CISPO: REINFORCE weighted by the clipped, stop-gradient ratio — every token keeps
    its gradient, only the importance weight is clipped."""
    low, high, _ = clip_ranges(config)
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - low, 1 + high)
    pg_losses = -clipped.detach() * advantages * log_prob
    pg_loss = aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    clipfrac = masked_mean((ratio != clipped).float(), response_mask)
    return pg_loss, ratio_metrics(clipfrac, masked_mean(-log_ratio, response_mask), 0.0)


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
    low, high, _ = clip_ranges(config)
    clip_c = float(cfg_get(config, "clip_ratio_c", 3.0))
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
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
    pg_loss = aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    clipfrac = masked_mean(1.0 - keep, response_mask)
    clipfrac_lower = masked_mean((ratio > clip_c).float() * keep, response_mask)
    return pg_loss, ratio_metrics(clipfrac, ppo_kl, clipfrac_lower)


@policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                                rollout_is_weights):
    """DPPO with a total-variation trust region (``clip_ratio_low/high`` bound ``p - p_old``)."""
    return _dppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, "tv")


@policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                                rollout_is_weights):
    """DPPO with a binary-KL trust region (``clip_ratio_low/high`` bound the divergence)."""
    return _dppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, "kl")


@policy_loss("dro")
def compute_policy_loss_dro(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                            rollout_is_weights):
    """DRO: ``-(log_prob * A - beta/2 * (log_prob - old)^2)`` with ``policy_loss.dro_beta``.

    Raises:
        ValueError: ``dro_beta`` missing or not positive.
    """
    beta = policy_loss_setting(config, "dro_beta", None)
    if beta is None or beta <= 0:
        raise ValueError("policy_loss.dro_beta must be a positive value when using DRO")
    log_ratio = log_prob - old_log_prob
    pg_losses = -(log_prob * advantages - 0.5 * beta * log_ratio.square())
    pg_loss = aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, {"actor/ppo_kl": float(masked_mean(-log_ratio, response_mask).detach())}


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
    check_same_shape(
        rollout_log_prob=rollout_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask
    )
    pg_losses = -advantages * log_prob if rollout_is_weights is None else -advantages * log_prob * rollout_is_weights
    pg_loss = aggregate(pg_losses, response_mask, loss_agg_mode, config, None)
    return pg_loss, {"actor/ppo_kl": float(masked_mean(rollout_log_prob - log_prob, response_mask).detach())}


@policy_loss("bypass_mode")
def compute_policy_loss_bypass_mode(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                                    rollout_is_weights):
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
    corr = policy_loss_setting(config, "rollout_correction", None)
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
