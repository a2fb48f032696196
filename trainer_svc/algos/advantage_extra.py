"""GDPO: group-normalised advantages per reward component (verl's ``gdpo`` estimator)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from trainer_svc.algos.advantage import compute_grpo_outcome_advantage
from trainer_svc.algos.functional import masked_whiten
from trainer_svc.algos.registry import AdvantageEstimator, cfg_get, register_adv_est

__all__ = ["compute_gdpo_outcome_advantage"]


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
