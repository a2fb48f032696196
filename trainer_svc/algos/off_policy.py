"""Off-policy correction weights from ``rollout_log_probs`` (the log-probs vLLM reported
for the sampled tokens, under the policy version that generated them).

Three policies may be involved for a sample: the *behaviour* policy that generated it
(``rollout_log_probs``), the *proximal* policy (``old_log_probs``, recomputed by the
trainer before the update) and the policy being trained (``log_prob``). The PPO ratio is
taken against the proximal policy; the weights computed here correct for the gap between
behaviour and proximal policies and are handed to any registered policy loss as
``rollout_is_weights`` (they multiply the per-token loss):

``none``
    no correction (weights ``None``): on-policy or "ignore staleness".
``tis``
    truncated importance sampling, verl's ``rollout_is`` with ``rollout_is_threshold``:
    ``w = min(pi_old / pi_rollout, cap)`` per token (or per sequence with
    ``level="sequence"``, using the product of the token ratios).
``decoupled``
    decoupled PPO (AReaL): ``w = pi_old / pi_rollout`` uncapped, except that tokens whose
    weight exceeds ``cap`` (when given) are dropped (weight 0) rather than truncated.

All weights are detached, zero on masked positions, ``[B, T]``.
"""

from __future__ import annotations

from typing import Literal, Optional

import torch

from trainer_svc.algos.functional import masked_mean, masked_sum

__all__ = [
    "OFF_POLICY_MODES",
    "compute_off_policy_weights",
    "compute_rollout_correction_weights",
    "parse_rollout_is_threshold",
]

#: Valid values of :func:`compute_off_policy_weights`'s ``mode``.
OFF_POLICY_MODES = ("none", "tis", "decoupled")

#: log-ratios are clamped to +-SAFETY_BOUND before exponentiating (as verl does).
SAFETY_BOUND = 20.0


def _raw_weights(log_ratio: torch.Tensor, response_mask: torch.Tensor, level: str) -> torch.Tensor:
    if level == "token":
        return torch.exp(torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND))
    if level == "sequence":
        seq = masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)
        return torch.exp(torch.clamp(seq, min=-SAFETY_BOUND, max=SAFETY_BOUND)).expand_as(log_ratio)
    raise ValueError(f"importance-sampling level must be 'token' or 'sequence', got {level!r}")


def _weight_metrics(
    weights: torch.Tensor, raw: torch.Tensor, mask: torch.Tensor, cap: Optional[float]
) -> dict[str, float]:
    valid = mask.bool()
    if not valid.any():
        return {}
    w = weights[valid]
    metrics = {
        "rollout_is_mean": w.mean().item(),
        "rollout_is_max": w.max().item(),
        "rollout_is_min": w.min().item(),
    }
    if cap is not None:
        metrics["rollout_is_ratio_fraction_high"] = (raw[valid] > cap).float().mean().item()
    return metrics


def parse_rollout_is_threshold(spec: float | str) -> tuple[float, Optional[float]]:
    """``(upper, lower)`` from verl's ``rollout_is_threshold``: a number (truncation cap,
    ``lower`` None) or a ``"lower_upper"`` string (IcePop band).

    Raises:
        ValueError / TypeError: malformed, non-positive, or ``lower > upper``.
    """
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise TypeError(f"rollout_is_threshold must be a number or a 'lower_upper' string, got {spec!r}")
    lower: Optional[float] = None
    try:
        if isinstance(spec, str) and "_" in spec:
            lower_text, upper_text = spec.strip().split("_", 1)
            lower, upper = float(lower_text), float(upper_text)
        else:
            upper = float(spec)
    except ValueError as exc:
        raise ValueError(f"invalid rollout_is_threshold {spec!r}") from exc
    if not upper > 0:
        raise ValueError(f"rollout_is_threshold must be positive, got {spec!r}")
    if lower is not None and not 0 < lower <= upper:
        raise ValueError(f"rollout_is_threshold lower bound must be in (0, upper], got {spec!r}")
    return upper, lower


def compute_rollout_correction_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str = "token",
    rollout_is_threshold: float | str = 2.0,
    rollout_is_batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance-sampling weights, as verl's rollout-correction helper.

    Args:
        log_ratio: ``[B, T]`` ``log pi_train - log pi_rollout`` (``old_log_probs -
            rollout_log_probs``).
        response_mask: ``[B, T]`` 0/1.
        rollout_is: ``"token"`` (per-token ratio) or ``"sequence"`` (product over the
            response, broadcast to its tokens).
        rollout_is_threshold: truncation cap (> 0), or a ``"lower_upper"`` string for
            IcePop: weights outside ``[lower, upper]`` become 0 instead of being truncated.
        rollout_is_batch_normalize: rescale so the mean weight over valid tokens
            (token level) or over valid sequences (sequence level) is 1.

    Returns:
        ``(weights [B, T] detached, metrics)``.
    """
    if log_ratio.shape != response_mask.shape:
        raise ValueError(f"log_ratio {tuple(log_ratio.shape)} and response_mask {tuple(response_mask.shape)} differ")
    upper, lower = parse_rollout_is_threshold(rollout_is_threshold)
    mask = response_mask.to(log_ratio.dtype)
    raw = _raw_weights(log_ratio, mask, rollout_is) * mask
    if lower is None:
        weights = raw.clamp(max=upper).detach()
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw)).detach()
    metrics = _weight_metrics(weights, raw, mask, upper)
    if rollout_is_batch_normalize:
        if rollout_is == "token":
            mean = masked_mean(weights, mask)
        else:
            seq_weights = masked_mean(weights, mask, axis=-1)
            seq_mask = (mask.sum(dim=-1) > 0).to(weights.dtype)
            mean = (seq_weights * seq_mask).sum() / seq_mask.sum().clamp_min(1e-8)
        factor = mean.item() if mean > 1e-8 else 1.0
        weights = weights / factor
        metrics["rollout_is_batch_norm_factor"] = factor
    return weights, metrics


def compute_off_policy_weights(
    old_log_prob: torch.Tensor,
    rollout_log_probs: Optional[torch.Tensor],
    response_mask: torch.Tensor,
    mode: Literal["none", "tis", "decoupled"] = "none",
    cap: Optional[float] = 2.0,
    level: Literal["token", "sequence"] = "token",
) -> tuple[Optional[torch.Tensor], dict[str, float]]:
    """The ``rollout_is_weights`` for one of meshrl's off-policy correction modes.

    Args:
        old_log_prob: ``[B, T]`` proximal-policy log-probs (recomputed by the trainer).
        rollout_log_probs: ``[B, T]`` behaviour-policy log-probs from the rollout replica;
            required unless ``mode == "none"``.
        response_mask: ``[B, T]`` 0/1.
        mode: ``"none"``, ``"tis"`` or ``"decoupled"`` (see the module docstring).
        cap: truncation cap for ``tis`` (required, > 0); drop threshold for ``decoupled``
            (``None`` keeps every token).
        level: ``"token"`` or ``"sequence"`` importance ratios.

    Returns:
        ``(weights or None, metrics)``; pass ``weights`` as ``rollout_is_weights`` to the
        policy loss.

    Raises:
        ValueError: unknown mode, missing ``rollout_log_probs``, bad cap or shapes.
    """
    if mode not in OFF_POLICY_MODES:
        raise ValueError(f"off-policy mode must be one of {OFF_POLICY_MODES}, got {mode!r}")
    if mode == "none":
        return None, {}
    if rollout_log_probs is None:
        raise ValueError(f"off-policy mode {mode!r} needs rollout_log_probs from the rollout replicas")
    if old_log_prob.shape != rollout_log_probs.shape:
        raise ValueError(
            f"old_log_prob {tuple(old_log_prob.shape)} and rollout_log_probs {tuple(rollout_log_probs.shape)} differ"
        )
    log_ratio = (old_log_prob - rollout_log_probs).detach()
    if mode == "tis":
        if cap is None:
            raise ValueError("off-policy mode 'tis' needs a cap (> 0)")
        return compute_rollout_correction_weights(log_ratio, response_mask, level, cap)
    if cap is not None and not cap > 0:
        raise ValueError(f"decoupled PPO's cap must be positive or None, got {cap}")
    mask = response_mask.to(old_log_prob.dtype)
    raw = _raw_weights(log_ratio, mask, level) * mask
    weights = raw if cap is None else torch.where(raw > cap, torch.zeros_like(raw), raw)
    weights = weights.detach()
    metrics = _weight_metrics(weights, raw, mask, cap)
    if cap is not None and mask.sum() > 0:
        metrics["rollout_is_dropped_fraction"] = masked_mean((raw > cap).to(raw.dtype), mask).item()
    return weights, metrics
