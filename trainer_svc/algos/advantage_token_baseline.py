"""Optimal Token Baseline estimators (verl's ``optimal_token_baseline`` and
``tir_optimal_token_baseline``).

Per prompt group, the baseline at step ``t`` is the return-to-go averaged over the
group's responses weighted by a cumulative path-variance proxy
``W_t = sum_{j<=t} (1 - 2 pi_j + sum_v pi_v^2)`` (optionally times the squared
importance weight): ``B_t = sum_i G_it W_it / (sum_i W_it + eps)``; the advantage is
``G_t - B_t``. The actor must provide ``sum_pi_squared`` ``[B, T]`` (the sum over the
vocabulary of squared token probabilities at each position) next to ``old_log_probs``.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from trainer_svc.algos.advantage_group import group_indices
from trainer_svc.algos.registry import AdvantageEstimator, register_adv_est

__all__ = ["compute_multi_turn_optimal_token_baseline_advantage", "compute_optimal_token_baseline_advantage"]


def _returns_and_weights(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return-to-go ``G`` and cumulative variance proxy ``W``, both ``[B, T]``."""
    shapes = {tuple(t.shape) for t in (token_level_rewards, response_mask, old_log_probs, sum_pi_squared)}
    if len(shapes) != 1:
        raise ValueError(f"OTB inputs must share one [batch, response_length] shape, got {sorted(shapes)}")
    returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    per_step = 1 - 2 * torch.exp(old_log_probs) + sum_pi_squared
    if rollout_is_weights is not None:
        per_step = per_step * rollout_is_weights**2
    return returns, (per_step * response_mask).cumsum(dim=-1)


def _zero_unshared_tail(baselines: torch.Tensor, members: list[int], lengths: torch.Tensor) -> None:
    """If one response is strictly the longest of its group, drop its baseline past the
    second-longest length (no other response covers those steps)."""
    group_lengths = lengths[torch.tensor(members)]
    ordered = torch.sort(group_lengths).values
    longest, second = int(ordered[-1].item()), int(ordered[-2].item())
    at_max = (group_lengths == longest).nonzero(as_tuple=True)[0]
    if at_max.numel() == 1 and longest > second:
        baselines[members[int(at_max[0])], second:] = 0.0


@register_adv_est(AdvantageEstimator.OPTIMAL_TOKEN_BASELINE)
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: Optional[torch.Tensor] = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB over absolute token positions (single-turn responses).

    Singleton groups get no baseline (advantage = return-to-go). Returns
    ``(advantages * mask, returns)``.
    """
    with torch.no_grad():
        returns, w = _returns_and_weights(token_level_rewards, response_mask, old_log_probs, sum_pi_squared,
                                          rollout_is_weights)
        baselines = torch.zeros_like(returns)
        lengths = response_mask.sum(dim=-1)
        for members in group_indices(index, returns.shape[0]):
            if len(members) == 1:
                continue
            idx = torch.tensor(members, device=returns.device)
            g, wg, mg = returns[idx], w[idx], response_mask[idx]
            per_step = (g * wg * mg).sum(dim=0) / ((wg * mg).sum(dim=0) + epsilon)
            baselines[idx] = per_step.unsqueeze(0).expand(len(members), -1)
            if handle_zero_tail:
                _zero_unshared_tail(baselines, members, lengths)
        advantages = (returns - baselines) * response_mask
    return advantages, returns


@register_adv_est(AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE)
def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: Optional[torch.Tensor] = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB for multi-turn (tool-interleaved) responses: each response's valid tokens are
    compacted first, so step ``t`` means the ``t``-th *generated* token, then the group
    baseline is taken per compacted step and scattered back. Rows without a valid token
    get 0. Returns ``(advantages * mask, returns)``.
    """
    with torch.no_grad():
        returns, w = _returns_and_weights(token_level_rewards, response_mask, old_log_probs, sum_pi_squared,
                                          rollout_is_weights)
        lengths = response_mask.sum(dim=-1).to(torch.long)
        width = int(lengths.max().item()) if lengths.numel() else 0
        packed_w = w.new_zeros((len(lengths), width))
        packed_g = torch.zeros_like(packed_w)
        valid = response_mask.bool()
        for i in range(len(lengths)):
            n = int(lengths[i].item())
            if n:
                packed_w[i, :n] = w[i, valid[i]]
                packed_g[i, :n] = returns[i, valid[i]]
        non_empty = [i for i in range(len(lengths)) if int(lengths[i].item()) > 0]
        sub_index = [index[i] for i in non_empty]
        baselines = torch.zeros_like(packed_g)
        for local in group_indices(sub_index, len(non_empty)) if non_empty else []:
            members = [non_empty[j] for j in local]
            if len(members) == 1:
                continue
            idx = torch.tensor(members, device=packed_g.device)
            b_star = (packed_g[idx] * packed_w[idx]).sum(dim=0) / (packed_w[idx].sum(dim=0) + epsilon)
            baselines[idx] = b_star.to(baselines.dtype)
            if handle_zero_tail:
                _zero_unshared_tail(baselines, members, lengths)
        packed_adv = packed_g - baselines
        advantages = torch.zeros_like(returns)
        for i in non_empty:
            advantages[i, valid[i]] = packed_adv[i, : int(lengths[i].item())]
        advantages = advantages * response_mask
    return advantages, returns
