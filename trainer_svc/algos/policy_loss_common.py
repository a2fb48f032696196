"""What every policy loss shares: the signature, the argument checks, the clip ranges, the
``policy_loss.*`` settings and the aggregation with verl's global-batch arguments.

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

from typing import Any, Callable, Optional

import torch

from trainer_svc.algos.functional import agg_loss
from trainer_svc.algos.registry import cfg_get, register_policy_loss

__all__ = [
    "Metrics",
    "aggregate",
    "check_same_shape",
    "clamped_log_ratio",
    "clip_ranges",
    "global_batch_kwargs",
    "policy_loss",
    "policy_loss_setting",
    "ratio_metrics",
]


Metrics = dict[str, Any]


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


def check_same_shape(**tensors: Optional[torch.Tensor]) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items() if t is not None}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"policy loss inputs must share one [batch, response_length] shape, got {shapes}")


def clip_ranges(config: Optional[Any]) -> tuple[float, float, float]:
    """(clip_ratio_low, clip_ratio_high, clip_ratio_c) from an actor config; low/high fall
    back to ``clip_ratio`` (default 0.2), ``clip_ratio_c`` to 3.0."""
    if config is None:
        raise ValueError("the policy loss needs the actor config (clip_ratio, clip_ratio_low/high, clip_ratio_c)")
    clip_ratio = cfg_get(config, "clip_ratio", 0.2)
    low = cfg_get(config, "clip_ratio_low", clip_ratio)
    high = cfg_get(config, "clip_ratio_high", clip_ratio)
    clip_c = cfg_get(config, "clip_ratio_c", 3.0)
    return float(low), float(high), float(clip_c)


def policy_loss_setting(config: Optional[Any], key: str, default: Any) -> Any:
    """``config.policy_loss.<key>`` (dict or object), or ``default``."""
    return cfg_get(cfg_get(config, "policy_loss", None), key, default)


def clamped_log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    return torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)


def aggregate(pg_losses: torch.Tensor, mask: torch.Tensor, mode: str, config: Any, weights: Optional[torch.Tensor]):
    if weights is not None:
        pg_losses = pg_losses * weights
    return agg_loss(loss_mat=pg_losses, loss_mask=mask, loss_agg_mode=mode, **global_batch_kwargs(config))


def ratio_metrics(clipfrac: torch.Tensor | float, ppo_kl: torch.Tensor, clipfrac_lower: torch.Tensor | float) -> Metrics:
    return {
        "actor/pg_clipfrac": float(clipfrac),
        "actor/ppo_kl": float(ppo_kl.detach()),
        "actor/pg_clipfrac_lower": float(clipfrac_lower),
    }


def policy_loss(name: str, *, loss_agg_mode: str = "token-mean") -> Callable[[Callable], Callable]:
    """Decorator for meshrl's built-in policy losses: write the loss body once, with the seven
    arguments positional and plain; get a function with verl's ``PolicyLossFn`` signature
    (keywords, types and defaults; ``loss_agg_mode`` defaults to the given mode), registered
    as ``name``, that first checks the tensors share one ``[B, T]`` shape.

    The returned function keeps the body's name and docstring, and ``inspect.signature``
    shows the standard signature (what verl code calls it with).
    """

    def decorate(body: Callable[..., tuple[torch.Tensor, Metrics]]) -> Callable[..., tuple[torch.Tensor, Metrics]]:
        def loss(
            old_log_prob: torch.Tensor,
            log_prob: torch.Tensor,
            advantages: torch.Tensor,
            response_mask: torch.Tensor,
            loss_agg_mode: str = loss_agg_mode,
            config: Optional[Any] = None,
            rollout_is_weights: Optional[torch.Tensor] = None,
        ) -> tuple[torch.Tensor, Metrics]:
            check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                             response_mask=response_mask, rollout_is_weights=rollout_is_weights)
            return body(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)

        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(loss, attr, getattr(body, attr))
        return register_policy_loss(name)(loss)

    return decorate
