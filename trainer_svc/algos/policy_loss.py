"""Policy, value and entropy losses with verl's signatures.

Registered policy losses share one signature (verl's ``PolicyLossFn``)::

    fn(old_log_prob, log_prob, advantages, response_mask,
       loss_agg_mode="token-mean", config=None, rollout_is_weights=None)
       -> (pg_loss, metrics)

All tensors are ``[B, T]`` float (``response_mask`` 0/1). ``pg_loss`` is a 0-dim tensor
with gradient through ``log_prob``; ``metrics`` maps names such as ``"actor/pg_clipfrac"``
to Python floats. ``config`` is the actor config: a dict or any object with the attributes
``clip_ratio``, ``clip_ratio_low``, ``clip_ratio_high``, ``clip_ratio_c`` and optionally
``global_batch_info`` (a dict of :func:`agg_loss` keyword arguments: ``dp_size``,
``batch_num_tokens``, ``global_batch_size``, ``loss_scale_factor``). ``rollout_is_weights``
(``[B, T]``, detached) multiplies the per-token loss — this is how off-policy corrections
(truncated importance sampling, decoupled PPO; see ``algos.off_policy``) enter the loss.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import torch

from trainer_svc.algos.functional import agg_loss, clip_by_value, entropy_from_logits, masked_mean
from trainer_svc.algos.registry import cfg_get, register_policy_loss

__all__ = [
    "compute_entropy_loss",
    "compute_policy_loss",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_vanilla",
    "compute_value_loss",
    "global_batch_kwargs",
]

_GLOBAL_BATCH_KEYS = frozenset({"dp_size", "batch_num_tokens", "global_batch_size", "loss_scale_factor"})


def global_batch_kwargs(config: Optional[Any]) -> dict[str, Any]:
    """The ``agg_loss`` keyword arguments in ``config.global_batch_info`` (empty if unset).

    Raises:
        ValueError: an unknown key (a typo would otherwise silently change the loss scale).
    """
    info = cfg_get(config, "global_batch_info", None) or {}
    unknown = set(info) - _GLOBAL_BATCH_KEYS
    if unknown:
        raise ValueError(f"global_batch_info has unknown keys {sorted(unknown)}; allowed: {sorted(_GLOBAL_BATCH_KEYS)}")
    return dict(info)


def _check_same_shape(**tensors: Optional[torch.Tensor]) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items() if t is not None}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"policy loss inputs must share one [batch, response_length] shape, got {shapes}")


def _clip_ranges(config: Optional[Any]) -> tuple[float, float, float]:
    """(clip_ratio_low, clip_ratio_high, clip_ratio_c) from an actor config; low/high fall
    back to ``clip_ratio`` (default 0.2), ``clip_ratio_c`` to 3.0."""
    if config is None:
        raise ValueError("the policy loss needs the actor config (clip_ratio, clip_ratio_low/high, clip_ratio_c)")
    clip_ratio = cfg_get(config, "clip_ratio", 0.2)
    low = cfg_get(config, "clip_ratio_low", clip_ratio)
    high = cfg_get(config, "clip_ratio_high", clip_ratio)
    clip_c = cfg_get(config, "clip_ratio_c", 3.0)
    return float(low), float(high), float(clip_c)


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
    _check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask)
    if cliprange is None and (cliprange_low is None or cliprange_high is None):
        raise ValueError("compute_policy_loss needs cliprange (or both cliprange_low and cliprange_high)")
    low = cliprange if cliprange_low is None else cliprange_low
    high = cliprange if cliprange_high is None else cliprange_high
    pg_losses, clipfrac, ppo_kl, clipfrac_lower = _clipped_objective(
        old_log_prob, log_prob, advantages, response_mask, float(low), float(high), float(clip_ratio_c)
    )
    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode)
    return pg_loss, clipfrac, ppo_kl, clipfrac_lower


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[Any] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """PPO clipped surrogate with asymmetric clip ratios and dual clip (verl's "vanilla").

    ``old_log_prob`` is the anchor (proximal) policy: the recomputed log-probs for standard
    or decoupled PPO, or the rollout log-probs in bypass mode. ``rollout_is_weights``
    multiplies the per-token loss before aggregation.

    Returns:
        ``(pg_loss, {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"})``.
    """
    _check_same_shape(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        rollout_is_weights=rollout_is_weights,
    )
    clip_low, clip_high, clip_c = _clip_ranges(config)
    pg_losses, clipfrac, ppo_kl, clipfrac_lower = _clipped_objective(
        old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high, clip_c
    )
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(
        loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **global_batch_kwargs(config)
    )
    metrics = {
        "actor/pg_clipfrac": clipfrac.detach().item(),
        "actor/ppo_kl": ppo_kl.detach().item(),
        "actor/pg_clipfrac_lower": clipfrac_lower.detach().item(),
    }
    return pg_loss, metrics


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Optional[Any] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """GSPO: sequence-level ratio ``exp(mean_t(log_prob - old_log_prob))`` (stop-gradient),
    times ``pi / sg(pi)`` per token so gradients flow token-wise; clipped with the
    asymmetric ranges; aggregated with ``loss_agg_mode`` (its default,
    ``seq-mean-token-mean``, is the one the GSPO paper uses)."""
    _check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask)
    clip_low, clip_high, _ = _clip_ranges(config)
    negative_approx_kl = log_prob - old_log_prob
    seq_len = response_mask.sum(dim=-1).clamp(min=1)
    seq_log_ratio = (negative_approx_kl * response_mask).sum(dim=-1) / seq_len
    log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(log_ratio, max=10.0))
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    pg_losses = torch.maximum(losses1, losses2)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(
        loss_mat=pg_losses,
        loss_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        **global_batch_kwargs(config),
    )
    metrics = {
        "actor/pg_clipfrac": masked_mean(torch.gt(losses2, losses1).float(), response_mask).item(),
        "actor/ppo_kl": masked_mean(-negative_approx_kl, response_mask).detach().item(),
        "actor/pg_clipfrac_lower": 0.0,
    }
    return pg_loss, metrics


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[Any] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """GPG / plain policy gradient: per-token loss ``-log_prob * A`` (no ratio, no clip)."""
    _check_same_shape(log_prob=log_prob, advantages=advantages, response_mask=response_mask)
    pg_losses = -log_prob * advantages
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(
        loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **global_batch_kwargs(config)
    )
    return pg_loss, {}


def compute_entropy_loss(
    logits: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"
) -> torch.Tensor:
    """Mean categorical entropy of the policy over response tokens.

    Args:
        logits: ``[B, T, V]``; response_mask: ``[B, T]``.

    Returns:
        0-dim tensor: ``agg_loss(entropy_from_logits(logits), response_mask, mode)``.
    """
    if logits.dim() != 3 or logits.shape[:2] != response_mask.shape:
        raise ValueError(
            f"logits must be [batch, response_length, vocab] matching response_mask {tuple(response_mask.shape)}, "
            f"got {tuple(logits.shape)}"
        )
    return agg_loss(loss_mat=entropy_from_logits(logits), loss_mask=response_mask, loss_agg_mode=loss_agg_mode)


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: Optional[int] = None,
    global_batch_size: Optional[int] = None,
    loss_scale_factor: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss: ``0.5 * agg(max((v - R)^2, (clip(v, V_old +- c) - R)^2))``.

    Args:
        vpreds: ``[B, T]`` current critic predictions; returns: ``[B, T]`` targets;
        values: ``[B, T]`` critic values at rollout time; cliprange_value: ``c``.
        The remaining arguments are forwarded to :func:`agg_loss`.

    Returns:
        ``(vf_loss, vf_clipfrac)``: 0-dim tensors; ``vf_clipfrac`` is the fraction of valid
        tokens where the clipped error was the larger one.
    """
    _check_same_shape(vpreds=vpreds, returns=returns, values=values, response_mask=response_mask)
    vpred_clipped = clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
    losses1 = (vpreds - returns) ** 2
    losses2 = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(
        loss_mat=torch.max(losses1, losses2),
        loss_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        dp_size=dp_size,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=global_batch_size,
        loss_scale_factor=loss_scale_factor,
    )
    vf_clipfrac = masked_mean(torch.gt(losses2, losses1).float(), response_mask)
    return vf_loss, vf_clipfrac
