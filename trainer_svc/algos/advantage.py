"""Advantage estimators, registered by name, with verl's signatures and numbers.

Every estimator takes ``token_level_rewards`` ``[B, T]`` (float; outcome rewards sit on the
last valid token) and ``response_mask`` ``[B, T]`` (1 on generated tokens, 0 on padding)
and returns ``(advantages, returns)``, both ``[B, T]`` and zero on masked positions unless
stated. Group-based estimators take ``index`` ``[B]``: the prompt id (``uid``) of each
response, any hashable values (numpy object/str/int array or list); responses of one
prompt form a group. ``config`` is the algorithm config (dict or attribute object).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import torch

from trainer_svc.algos.functional import masked_whiten
from trainer_svc.algos.registry import AdvantageEstimator, cfg_get, register_adv_est

__all__ = [
    "compute_gae_advantage_return",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "expand_remax_baselines",
    "group_indices",
]


def _key(value: Any) -> Any:
    """A hashable group key for one ``index`` entry (numpy scalars become Python scalars)."""
    return value.item() if isinstance(value, np.generic) else value


def group_indices(index: Sequence[Any] | np.ndarray | torch.Tensor, batch_size: int) -> list[list[int]]:
    """Positions of each group, groups in order of first appearance.

    Args:
        index: ``[B]`` group ids.
        batch_size: ``B``; a length mismatch raises ``ValueError``.
    """
    if isinstance(index, torch.Tensor):
        index = index.tolist()
    if len(index) != batch_size:
        raise ValueError(f"index has {len(index)} entries but the batch has {batch_size} responses")
    groups: dict[Any, list[int]] = {}
    for position, value in enumerate(index):
        groups.setdefault(_key(value), []).append(position)
    return list(groups.values())


def _check_shapes(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> None:
    if token_level_rewards.dim() != 2 or token_level_rewards.shape != response_mask.shape:
        raise ValueError(
            f"token_level_rewards {tuple(token_level_rewards.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must both be [batch, response_length]"
        )


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
    _check_shapes(token_level_rewards, response_mask)
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


def _group_mean_std(scores: torch.Tensor, group: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased std of one group; a singleton group gives (0, 1) as in verl."""
    if len(group) == 1:
        return torch.tensor(0.0), torch.tensor(1.0)
    members = scores[torch.tensor(group)]
    return torch.mean(members), torch.std(members)


@register_adv_est(AdvantageEstimator.GRPO)
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Optional[Any] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage: ``(s_i - mean_g) / (std_g + epsilon)`` per group, broadcast
    over the response tokens.

    ``s_i`` is the response's summed reward; ``std_g`` is the unbiased (n-1) standard
    deviation. A group with a single response uses mean 0 and std 1, so its advantage is
    its own score. With ``norm_adv_by_std_in_grpo=False`` (Dr.GRPO) the advantage is
    ``s_i - mean_g``. Returns ``(advantages, advantages)``.
    """
    _check_shapes(token_level_rewards, response_mask)
    scores = token_level_rewards.sum(dim=-1)
    with torch.no_grad():
        out = scores.clone()
        for group in group_indices(index, scores.shape[0]):
            mean, std = _group_mean_std(scores, group)
            idx = torch.tensor(group)
            if norm_adv_by_std_in_grpo:
                out[idx] = (scores[idx] - mean) / (std + epsilon)
            else:
                out[idx] = scores[idx] - mean
        advantages = out.unsqueeze(-1) * response_mask
    return advantages, advantages


def _factorize(index: Sequence[Any] | np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """Dense group ids ``[B]`` (int64, 0..G-1) for any hashable ``index``."""
    if isinstance(index, torch.Tensor):
        index = index.tolist()
    ids: dict[Any, int] = {}
    dense = [ids.setdefault(_key(v), len(ids)) for v in index]
    return torch.tensor(dense, dtype=torch.long, device=device)


@register_adv_est(AdvantageEstimator.GRPO_VECTORIZED)
def compute_grpo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Optional[Any] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO with scatter reductions instead of a Python loop over groups.

    Group statistics are computed in float32 (as verl's ``group_mean_std``): ``mean`` and
    the unbiased ``std``; singletons use (0, 1). Advantage ``(s - mean) / (std + epsilon)``,
    or ``s - mean`` for Dr.GRPO — the same numbers as :func:`compute_grpo_outcome_advantage`
    up to float32 rounding of the group statistics.
    """
    _check_shapes(token_level_rewards, response_mask)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        g = _factorize(index, scores.device)
        stats = scores.to(torch.float32)
        num_groups = int(g.max().item()) + 1 if g.numel() else 0
        count = torch.zeros(num_groups, dtype=torch.float32, device=scores.device).index_add_(
            0, g, torch.ones_like(stats)
        )
        mean = torch.zeros_like(count).index_add_(0, g, stats) / count.clamp_min(1.0)
        sq_dev = torch.zeros_like(count).index_add_(0, g, (stats - mean[g]) ** 2)
        std = torch.sqrt(sq_dev / (count - 1.0).clamp_min(1.0))
        single = count <= 1.0
        mean = torch.where(single, torch.zeros_like(mean), mean)
        std = torch.where(single, torch.ones_like(std), std)
        if norm_adv_by_std_in_grpo:
            scalars = (scores - mean[g]) / (std[g] + epsilon)
        else:
            scalars = scores - mean[g]
        advantages = scalars.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.GRPO_PASSK)
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Optional[Any] = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k advantage: only the best response of each group gets a non-zero advantage,
    ``r_max - r_second`` (divided by ``std_g + epsilon`` when normalising).

    As in verl, ``config["norm_adv_by_std_in_grpo"]`` (default True) decides the
    normalisation when a config is given; without one the keyword is used.

    Raises:
        ValueError: a group has fewer than two responses.
    """
    _check_shapes(token_level_rewards, response_mask)
    if config is not None:
        norm_adv_by_std_in_grpo = bool(cfg_get(config, "norm_adv_by_std_in_grpo", True))
    scores = token_level_rewards.sum(dim=-1)
    advantages = torch.zeros_like(scores)
    with torch.no_grad():
        for group in group_indices(index, scores.shape[0]):
            rewards = scores[torch.tensor(group)]
            if rewards.numel() < 2:
                raise ValueError(f"Pass@k requires at least 2 samples per group; group at {group} has 1")
            top, top_idx = torch.topk(rewards, 2)
            advantage = top[0] - top[1]
            if norm_adv_by_std_in_grpo:
                advantage = advantage / (torch.std(rewards) + epsilon)
            advantages[group[int(top_idx[0].item())]] = advantage
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Optional[Any] = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group baseline: ``s_i - mean_g`` (singleton: baseline 0),
    broadcast over tokens, then whitened over all valid tokens of the batch."""
    _check_shapes(token_level_rewards, response_mask)
    length = token_level_rewards.shape[-1]
    scores = token_level_rewards.sum(dim=-1)
    with torch.no_grad():
        centred = scores.clone()
        for group in group_indices(index, scores.shape[0]):
            mean, _ = _group_mean_std(scores, group)
            idx = torch.tensor(group)
            centred[idx] = scores[idx] - mean
        tiled = centred.unsqueeze(-1).tile([1, length]) * response_mask
        advantages = masked_whiten(tiled, response_mask) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.RLOO)
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Optional[Any] = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: leave-one-out baseline, ``s_i - mean_{j != i} s_j = (s_i - mean_g) * n/(n-1)``.

    A singleton group keeps its raw score as advantage (verl's loop form); the vectorized
    variant gives 0 there instead.
    """
    _check_shapes(token_level_rewards, response_mask)
    scores = token_level_rewards.sum(dim=-1)
    with torch.no_grad():
        out = scores.clone()
        for group in group_indices(index, scores.shape[0]):
            n = len(group)
            if n == 1:
                continue
            mean, _ = _group_mean_std(scores, group)
            idx = torch.tensor(group)
            out[idx] = scores[idx] * n / (n - 1) - mean * n / (n - 1)
        advantages = out.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.RLOO_VECTORIZED)
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Optional[Any] = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO with scatter sums: ``(n * s_i - sum_g) / (n - 1)``; singleton groups give 0."""
    _check_shapes(token_level_rewards, response_mask)
    scores = token_level_rewards.sum(dim=-1)
    with torch.no_grad():
        g = _factorize(index, scores.device)
        count = torch.bincount(g)[g].to(scores.dtype)
        total = torch.bincount(g, weights=scores)[g].to(scores.dtype)
        adv = ((count * scores - total) / (count - 1).clamp_min(1)) * (count > 1)
        advantages = adv.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.OPO)
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Optional[Any] = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO: baseline is the length-weighted group mean ``sum(len_j s_j) / sum(len_j)``
    (singleton: 0)."""
    _check_shapes(token_level_rewards, response_mask)
    lengths = response_mask.sum(dim=-1)
    scores = token_level_rewards.sum(dim=-1)
    with torch.no_grad():
        out = scores.clone()
        for group in group_indices(index, scores.shape[0]):
            idx = torch.tensor(group)
            if len(group) == 1:
                baseline = torch.tensor(0.0)
            else:
                baseline = (lengths[idx] * scores[idx]).sum() / lengths[idx].sum()
            out[idx] = scores[idx] - baseline
        advantages = out.unsqueeze(-1) * response_mask
    return advantages, advantages


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
    _check_shapes(token_level_rewards, response_mask)
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
    _check_shapes(token_level_rewards, response_mask)
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
        if _key(uid) in table:
            raise ValueError(f"prompt {uid!r} has more than one greedy baseline")
        table[_key(uid)] = position
    missing = [uid for uid in index if _key(uid) not in table]
    if missing:
        raise ValueError(f"no greedy baseline for prompt(s) {missing[:5]}")
    rows = torch.tensor([table[_key(uid)] for uid in index], dtype=torch.long, device=greedy_scores.device)
    return greedy_scores[rows]


@register_adv_est(AdvantageEstimator.GPG)
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    alpha: float = 1.0,
    config: Optional[Any] = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG: ``alpha * (s_i - mean_g) / f_norm`` with ``alpha = B / max(#non-zero scores, 1)``
    (the ``alpha`` argument is overridden by that ratio, as in verl)."""
    _check_shapes(token_level_rewards, response_mask)
    scores = token_level_rewards.sum(dim=-1)
    with torch.no_grad():
        bsz = scores.shape[0]
        alpha_t = bsz / torch.count_nonzero(scores).clamp(min=1)
        out = scores.clone()
        for group in group_indices(index, bsz):
            mean, _ = _group_mean_std(scores, group)
            idx = torch.tensor(group)
            out[idx] = alpha_t * (scores[idx] - mean) / f_norm
        advantages = out.unsqueeze(-1) * response_mask
    return advantages, advantages
