"""The critic's clipped value loss (``compute_value_loss``) and the policy's entropy
(``compute_entropy_loss``), with verl's signatures."""

from __future__ import annotations

from typing import Optional

import torch

from trainer_svc.algos.functional import agg_loss, clip_by_value, entropy_from_logits, masked_mean
from trainer_svc.algos.policy_loss_common import check_same_shape

__all__ = [
    "compute_entropy_loss",
    "compute_value_loss",
]


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
    check_same_shape(vpreds=vpreds, returns=returns, values=values, response_mask=response_mask)
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
