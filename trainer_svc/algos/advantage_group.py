"""Group-relative outcome advantages: each response's summed reward compared with the
other responses to the same prompt (GRPO and its vectorized / pass@k forms, RLOO, OPO,
GPG, REINFORCE++ with a group baseline, GDPO per reward component).

Every estimator takes ``token_level_rewards`` ``[B, T]`` (float; outcome rewards sit on the
last valid token) and ``response_mask`` ``[B, T]`` (1 on generated tokens, 0 on padding)
and returns ``(advantages, returns)``, both ``[B, T]`` and zero on masked positions unless
stated. Group-based estimators take ``index`` ``[B]``: the prompt id (``uid``) of each
response, any hashable values (numpy object/str/int array or list); responses of one
prompt form a group. ``config`` is the algorithm config (dict or attribute object).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from trainer_svc.algos.functional import masked_whiten
from trainer_svc.algos.registry import AdvantageEstimator, cfg_get, register_adv_est

__all__ = [
    "check_reward_shapes",
    "compute_gdpo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "group_indices",
    "group_key",
    "group_mean_std",
    "outcome_per_group",
]


def group_key(value: Any) -> Any:
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
        groups.setdefault(group_key(value), []).append(position)
    return list(groups.values())


def check_reward_shapes(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> None:
    if token_level_rewards.dim() != 2 or token_level_rewards.shape != response_mask.shape:
        raise ValueError(
            f"token_level_rewards {tuple(token_level_rewards.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must both be [batch, response_length]"
        )


def group_mean_std(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased std of one group's scores; a singleton group gives (0, 1) as in verl."""
    if scores.numel() == 1:
        return torch.tensor(0.0), torch.tensor(1.0)
    return torch.mean(scores), torch.std(scores)


def outcome_per_group(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | np.ndarray | torch.Tensor,
    per_group: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Outcome advantages computed one prompt group at a time, ``[B, T]``.

    Each response's score is its summed reward; ``per_group(scores, rows)`` gets one group's
    scores ``[n]`` and their row numbers and returns the group's ``n`` advantages, which are
    then broadcast over each response's valid tokens (zero on masked positions).
    """
    check_reward_shapes(token_level_rewards, response_mask)
    scores = token_level_rewards.sum(dim=-1)
    with torch.no_grad():
        out = scores.clone()
        for group in group_indices(index, scores.shape[0]):
            rows = torch.tensor(group)
            out[rows] = per_group(scores[rows], rows)
        return out.unsqueeze(-1) * response_mask


def _factorize(index: Sequence[Any] | np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """Dense group ids ``[B]`` (int64, 0..G-1) for any hashable ``index``."""
    if isinstance(index, torch.Tensor):
        index = index.tolist()
    ids: dict[Any, int] = {}
    dense = [ids.setdefault(group_key(v), len(ids)) for v in index]
    return torch.tensor(dense, dtype=torch.long, device=device)


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

    def normalise(scores: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        mean, std = group_mean_std(scores)
        return (scores - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else scores - mean

    advantages = outcome_per_group(token_level_rewards, response_mask, index, normalise)
    return advantages, advantages


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
    check_reward_shapes(token_level_rewards, response_mask)
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

    if config is not None:
        norm_adv_by_std_in_grpo = bool(cfg_get(config, "norm_adv_by_std_in_grpo", True))

    def best_only(scores: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        if scores.numel() < 2:
            raise ValueError(f"Pass@k requires at least 2 samples per group; group at {rows.tolist()} has 1")
        top, top_idx = torch.topk(scores, 2)
        advantage = top[0] - top[1]
        if norm_adv_by_std_in_grpo:
            advantage = advantage / (torch.std(scores) + epsilon)
        out = torch.zeros_like(scores)
        out[top_idx[0]] = advantage
        return out

    advantages = outcome_per_group(token_level_rewards, response_mask, index, best_only)
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

    def leave_one_out(scores: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        n = scores.numel()
        if n == 1:
            return scores
        mean = torch.mean(scores)
        return scores * n / (n - 1) - mean * n / (n - 1)

    advantages = outcome_per_group(token_level_rewards, response_mask, index, leave_one_out)
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
    check_reward_shapes(token_level_rewards, response_mask)
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

    lengths = response_mask.sum(dim=-1)

    def minus_length_weighted_mean(scores: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        if scores.numel() == 1:
            return scores - torch.tensor(0.0)
        return scores - (lengths[rows] * scores).sum() / lengths[rows].sum()

    advantages = outcome_per_group(token_level_rewards, response_mask, index, minus_length_weighted_mean)
    return advantages, advantages


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

    scores = token_level_rewards.sum(dim=-1)
    alpha_t = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1)

    def scaled_centred(scores: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        mean, _ = group_mean_std(scores)
        return alpha_t * (scores - mean) / f_norm

    advantages = outcome_per_group(token_level_rewards, response_mask, index, scaled_centred)
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

    def centred(scores: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        mean, _ = group_mean_std(scores)
        return scores - mean

    tiled = outcome_per_group(token_level_rewards, response_mask, index, centred)
    with torch.no_grad():
        advantages = masked_whiten(tiled, response_mask) * response_mask
    return advantages, advantages


def _component_rewards(
    keys: list[str], non_tensor_batch: dict, batch: Any, response_mask: torch.Tensor
) -> list[torch.Tensor]:
    """One ``[B, T]`` reward matrix per component key, each score on the last valid
    response token (``attention_mask`` after the prompt, as verl locates it)."""
    prompt_length = batch["prompts"].size(1)
    last = batch["attention_mask"][:, prompt_length:].sum(dim=1) - 1
    rows = torch.arange(response_mask.shape[0], device=response_mask.device)
    out = []
    for key in keys:
        if key not in non_tensor_batch:
            raise ValueError(
                f"GDPO reward key {key!r} is not a non-tensor column; available: {sorted(non_tensor_batch)}"
            )
        score = torch.tensor(np.asarray(non_tensor_batch[key], dtype=np.float32), device=response_mask.device)
        matrix = torch.zeros_like(response_mask, dtype=torch.float32)
        matrix[rows, last] = score
        out.append(matrix)
    return out


@register_adv_est(AdvantageEstimator.GDPO)
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Optional[Any] = None,
    non_tensor_batch: Optional[dict] = None,
    batch: Optional[Any] = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO: GRPO-normalise each reward component within its group, sum them with
    ``config.gdpo_reward_weights`` (default 1 each), then whiten over the batch.

    The components are the non-tensor columns named by ``config.gdpo_reward_keys`` (one
    float per response, e.g. the dict a reward function returned); without a config and
    the batch columns, the single component is ``token_level_rewards``.

    Returns ``(advantages, advantages)``, ``[B, T]``.

    Raises:
        ValueError: ``gdpo_reward_keys`` missing/empty, or a key without a column.
    """
    components = [token_level_rewards]
    weights: Optional[list[float]] = None
    if config is not None and non_tensor_batch is not None and batch is not None:
        keys = cfg_get(config, "gdpo_reward_keys", None)
        if not keys:
            raise ValueError("GDPO needs algorithm.gdpo_reward_keys: the reward component columns to normalise")
        components = _component_rewards(list(keys), non_tensor_batch, batch, response_mask)
        raw_weights = cfg_get(config, "gdpo_reward_weights", None)
        weights = None if raw_weights is None else [float(w) for w in raw_weights]
    if weights is not None and len(weights) != len(components):
        raise ValueError(f"gdpo_reward_weights has {len(weights)} entries for {len(components)} reward keys")
    w = torch.tensor(weights or [1.0] * len(components), dtype=torch.float32, device=token_level_rewards.device)
    total: Optional[torch.Tensor] = None
    for i, rewards in enumerate(components):
        normalised, _ = compute_grpo_outcome_advantage(
            token_level_rewards=rewards,
            response_mask=response_mask,
            index=index,
            epsilon=epsilon,
            norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
            config=config,
        )
        total = w[i] * normalised if total is None else total + w[i] * normalised
    advantages = masked_whiten(total, response_mask) * response_mask
    return advantages, advantages
