"""Advantages from discounted returns-to-go, one response at a time: GAE (baseline from a
critic), REINFORCE++ (returns whitened over the batch) and ReMax (baseline from a greedy
rollout of the same prompt).

Every estimator takes ``token_level_rewards`` ``[B, T]`` (float; outcome rewards sit on the
last valid token) and ``response_mask`` ``[B, T]`` (1 on generated tokens, 0 on padding and
tool observations) and returns ``(advantages, returns)``, both ``[B, T]``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import torch

from trainer_svc.algos.advantage_group import check_reward_shapes, group_key
from trainer_svc.algos.functional import masked_whiten
from trainer_svc.algos.registry import AdvantageEstimator, cfg_get, register_adv_est

__all__ = [
    "compute_gae_advantage_return",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "expand_remax_baselines",
]


@register_adv_est(AdvantageEstimator.GAE)
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float | torch.Tensor,
    lam: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation with a critic.

    ``delta_t = r_t + gamma * V_next - V_t``; ``A_t = delta_t + gamma * lam * A_next``,
    scanning right to left. Masked positions (e.g. tool-observation tokens inside a
    multi-turn response, or padding) are skipped: they carry the next value and advantage
    through unchanged. ``returns = A + values``; the advantages are then whitened over the
    valid tokens of the whole batch (unbiased variance).

    Args:
        values: ``[B, T]`` critic values at each response token.
        gamma: discount; lam: GAE lambda.
    """
    check_reward_shapes(token_level_rewards, response_mask)
    with torch.no_grad():
        mask = response_mask.to(values.dtype)
        next_values = torch.zeros_like(values[:, 0])
        last_gae = torch.zeros_like(values[:, 0])
        reversed_adv = []
        for t in reversed(range(token_level_rewards.shape[-1])):
            delta = token_level_rewards[:, t] + gamma * next_values - values[:, t]
            gae_t = delta + gamma * lam * last_gae
            next_values = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_values
            last_gae = gae_t * mask[:, t] + (1 - mask[:, t]) * last_gae
            reversed_adv.append(last_gae)
        advantages = torch.stack(reversed_adv[::-1], dim=1)
        returns = advantages + values
        advantages = masked_whiten(advantages, response_mask)
    return advantages, returns


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Optional[Any] = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted return-to-go ``G_t = r_t + gamma * G_{t+1}`` over the valid
    tokens, whitened over the batch's valid tokens. ``config.gamma`` is required.

    Masked positions get return 0 and are skipped by the recursion: a tool-observation span
    inside a response carries the running return through unchanged (its own rewards are
    dropped), and trailing padding contributes nothing.

    Returns ``(advantages, returns)``.
    """
    check_reward_shapes(token_level_rewards, response_mask)
    gamma = cfg_get(config, "gamma", None)
    if gamma is None:
        raise ValueError("reinforce_plus_plus needs config.gamma (the algorithm config)")
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        returns = torch.zeros_like(token_level_rewards)
        running = torch.zeros_like(token_level_rewards[:, 0])
        for t in reversed(range(token_level_rewards.shape[1])):
            candidate = token_level_rewards[:, t] + gamma * running
            returns[:, t] = candidate * mask[:, t]
            running = candidate * mask[:, t] + running * (1 - mask[:, t])
        advantages = masked_whiten(returns, response_mask) * response_mask
    return advantages, returns


@register_adv_est(AdvantageEstimator.REMAX)
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
    config: Optional[Any] = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: return-to-go minus the reward of a greedy rollout of the same prompt.

    Args:
        reward_baselines: ``[B]`` summed reward of the greedy response of each sample's
            prompt (see :func:`expand_remax_baselines`).

    Returns:
        ``advantages = returns - baseline * mask`` and ``returns`` (reverse cumulative sum
        of the masked rewards), both ``[B, T]``.
    """
    check_reward_shapes(token_level_rewards, response_mask)
    if reward_baselines.shape != token_level_rewards.shape[:1]:
        raise ValueError(
            f"reward_baselines must be [batch] = {tuple(token_level_rewards.shape[:1])}, "
            f"got {tuple(reward_baselines.shape)}"
        )
    with torch.no_grad():
        returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
        advantages = returns - reward_baselines.unsqueeze(-1) * response_mask
    return advantages, returns


def expand_remax_baselines(
    greedy_scores: torch.Tensor, greedy_index: Sequence[Any] | np.ndarray, index: Sequence[Any] | np.ndarray
) -> torch.Tensor:
    """Per-sample ReMax baselines from one greedy (``do_sample=False``) rollout per prompt.

    Args:
        greedy_scores: ``[P]`` summed reward of each prompt's greedy response.
        greedy_index: ``[P]`` the prompt ids (uids) of ``greedy_scores``.
        index: ``[B]`` the prompt id of each sampled response.

    Returns:
        ``[B]`` float tensor: the greedy score of each sample's prompt.

    Raises:
        ValueError: a sample's prompt has no greedy score, or a prompt has two.
    """
    table: dict[Any, int] = {}
    for position, uid in enumerate(greedy_index):
        if group_key(uid) in table:
            raise ValueError(f"prompt {uid!r} has more than one greedy baseline")
        table[group_key(uid)] = position
    missing = [uid for uid in index if group_key(uid) not in table]
    if missing:
        raise ValueError(f"no greedy baseline for prompt(s) {missing[:5]}")
    rows = torch.tensor([table[group_key(uid)] for uid in index], dtype=torch.long, device=greedy_scores.device)
    return greedy_scores[rows]
