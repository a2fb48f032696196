"""Importance-ratio surrogates (PPO and its descendants): the loss moves the policy through
``ratio = pi / pi_old``, bounded by a clip or a soft gate. ``vanilla`` (clip, asymmetric
clip, dual clip) and the deprecated 4-tuple ``compute_policy_loss``; ``gspo`` (one ratio
per sequence); ``geo_mean`` (GMPO: geometric mean of clipped token ratios); ``sapo``
(a sigmoid gate instead of the hard clip).

Signature and settings: :mod:`trainer_svc.algos.policy_loss_common`.
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch

from trainer_svc.algos.functional import agg_loss, masked_mean
from trainer_svc.algos.policy_loss_common import (
    aggregate,
    check_same_shape,
    clamped_log_ratio,
    clip_ranges,
    policy_loss,
    ratio_metrics,
)
from trainer_svc.algos.registry import cfg_get

__all__ = [
    "compute_policy_loss",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gspo",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
]


def _clipped_objective(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token dual-clip PPO loss ``[B, T]`` and (clipfrac, ppo_kl, clipfrac_lower).

    ``ratio = exp(clamp(log_prob - old_log_prob, -20, 20))``;
    ``l = max(-A * ratio, -A * clip(ratio, 1 - low, 1 + high))``; for ``A < 0`` the loss
    is further capped at ``-A * clip_ratio_c`` (dual clip). ``clipfrac`` counts tokens where
    the clipped term won; ``clipfrac_lower`` tokens where the dual clip bound won.
    """
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip lower bound) must be > 1.0, got {clip_ratio_c}")
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    losses_unclipped = -advantages * ratio
    losses_clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_losses = torch.maximum(losses_unclipped, losses_clipped)
    clipfrac = masked_mean(torch.gt(losses_clipped, losses_unclipped).float(), response_mask)
    losses_dual = -advantages * clip_ratio_c
    dual_losses = torch.min(losses_dual, clip_losses)
    clipfrac_lower = masked_mean((torch.gt(clip_losses, losses_dual) * (advantages < 0)).float(), response_mask)
    pg_losses = torch.where(advantages < 0, dual_losses, clip_losses)
    return pg_losses, clipfrac, ppo_kl, clipfrac_lower


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: Optional[float] = None,
    cliprange_low: Optional[float] = None,
    cliprange_high: Optional[float] = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Deprecated (as in verl): the clipped PPO loss with explicit clip arguments.

    Returns ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``, all 0-dim tensors. Use
    :func:`compute_policy_loss_vanilla` (via ``get_policy_loss_fn("vanilla")``) instead.
    """
    warnings.warn(
        "compute_policy_loss is deprecated; use compute_policy_loss_vanilla", DeprecationWarning, stacklevel=2
    )
    check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask)
    if cliprange is None and (cliprange_low is None or cliprange_high is None):
        raise ValueError("compute_policy_loss needs cliprange (or both cliprange_low and cliprange_high)")
    low = cliprange if cliprange_low is None else cliprange_low
    high = cliprange if cliprange_high is None else cliprange_high
    pg_losses, clipfrac, ppo_kl, clipfrac_lower = _clipped_objective(
        old_log_prob, log_prob, advantages, response_mask, float(low), float(high), float(clip_ratio_c)
    )
    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode)
    return pg_loss, clipfrac, ppo_kl, clipfrac_lower


@policy_loss("vanilla")
def compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                                rollout_is_weights):
    """PPO clipped surrogate with asymmetric clip ratios and dual clip (verl's "vanilla").

    ``old_log_prob`` is the anchor (proximal) policy: the recomputed log-probs for standard
    or decoupled PPO, or the rollout log-probs in bypass mode. ``rollout_is_weights``
    multiplies the per-token loss before aggregation.

    Returns:
        ``(pg_loss, {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"})``.
    """
    clip_low, clip_high, clip_c = clip_ranges(config)
    pg_losses, clipfrac, ppo_kl, clipfrac_lower = _clipped_objective(
        old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high, clip_c
    )
    pg_loss = aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    metrics = {
        "actor/pg_clipfrac": clipfrac.detach().item(),
        "actor/ppo_kl": ppo_kl.detach().item(),
        "actor/pg_clipfrac_lower": clipfrac_lower.detach().item(),
    }
    return pg_loss, metrics


@policy_loss("gspo", loss_agg_mode="seq-mean-token-mean")
def compute_policy_loss_gspo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                             rollout_is_weights):
    """GSPO: sequence-level ratio ``exp(mean_t(log_prob - old_log_prob))`` (stop-gradient),
    times ``pi / sg(pi)`` per token so gradients flow token-wise; clipped with the
    asymmetric ranges; aggregated with ``loss_agg_mode`` (its default,
    ``seq-mean-token-mean``, is the one the GSPO paper uses)."""
    clip_low, clip_high, _ = clip_ranges(config)
    negative_approx_kl = log_prob - old_log_prob
    seq_len = response_mask.sum(dim=-1).clamp(min=1)
    seq_log_ratio = (negative_approx_kl * response_mask).sum(dim=-1) / seq_len
    log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(log_ratio, max=10.0))
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    pg_losses = torch.maximum(losses1, losses2)
    pg_loss = aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    metrics = {
        "actor/pg_clipfrac": masked_mean(torch.gt(losses2, losses1).float(), response_mask).item(),
        "actor/ppo_kl": masked_mean(-negative_approx_kl, response_mask).detach().item(),
        "actor/pg_clipfrac_lower": 0.0,
    }
    return pg_loss, metrics


@policy_loss("geo_mean")
def compute_policy_loss_geo_mean(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                                 rollout_is_weights):
    """GMPO: per-sequence geometric mean of token ratios, each log-ratio clipped to
    ``[-low, high]`` in the direction of the advantage; loss ``-mean_i(A_i * ratio_i)``
    (``loss_agg_mode`` unused; sequence-level advantages assumed). Importance weights are
    reduced to one per sequence by their geometric mean."""
    low, high, _ = clip_ranges(config)
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
    return pg_loss, ratio_metrics(clipfrac, ppo_kl, clipfrac_lower)


@policy_loss("sapo", loss_agg_mode="seq-mean-token-mean")
def compute_policy_loss_sapo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                             rollout_is_weights):
    """SAPO: a smooth gate ``sigmoid(tau (r - 1)) * 4 / tau`` replaces the hard clip, with
    ``tau_pos`` for positive and ``tau_neg`` for non-positive advantages. As in verl the
    loss is always aggregated ``seq-mean-token-mean``."""
    tau_pos = torch.as_tensor(cfg_get(config, "tau_pos", 1.0), dtype=advantages.dtype, device=advantages.device)
    tau_neg = torch.as_tensor(cfg_get(config, "tau_neg", 1.05), dtype=advantages.dtype, device=advantages.device)
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    taus = torch.where(advantages > 0, tau_pos, tau_neg)
    gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)
    pg_loss = aggregate(-gates * advantages, response_mask, "seq-mean-token-mean", config, rollout_is_weights)
    return pg_loss, ratio_metrics(0.0, masked_mean(-log_ratio, response_mask), 0.0)
