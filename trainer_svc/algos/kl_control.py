"""KL-in-reward: the fixed and adaptive KL coefficient controllers, ``compute_rewards`` and
``apply_kl_penalty`` (verl's ``algorithm.use_kl_in_reward`` path); and PF-PPO's
score-based resampling (``compute_pf_ppo_reweight_data``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from trainer_svc.algos.functional import kl_penalty as _kl_penalty
from trainer_svc.algos.functional import masked_mean
from trainer_svc.algos.registry import cfg_get

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "apply_kl_penalty",
    "compute_pf_ppo_reweight_data",
    "compute_rewards",
    "get_kl_controller",
]


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019): after each step
    ``value *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon``.

    Attributes:
        value: the current coefficient (float).
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        if not horizon > 0:
            raise ValueError(f"horizon must be larger than 0, got {horizon}")
        if not target_kl > 0:
            raise ValueError(f"target_kl must be positive, got {target_kl}")
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move the coefficient towards keeping ``current_kl`` at the target.

        Args:
            current_kl: mean KL of the last batch; n_steps: samples in that batch.
        """
        proportional_error = np.clip(current_kl / self.target - 1, -0.2, 0.2)
        self.value *= 1 + proportional_error * n_steps / self.horizon


class FixedKLController:
    """A constant KL coefficient; ``update`` does nothing."""

    def __init__(self, kl_coef: float) -> None:
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (kept for the controller interface)."""


def get_kl_controller(kl_ctrl: Any) -> FixedKLController | AdaptiveKLController:
    """Build the controller described by ``kl_ctrl`` (``algorithm.kl_ctrl``: a dict or
    object with ``type`` in {"fixed", "adaptive"}, ``kl_coef``, and for adaptive
    ``target_kl`` and ``horizon``).

    Raises:
        NotImplementedError: unknown ``type`` (as verl); ValueError: bad adaptive settings.
    """
    kind = cfg_get(kl_ctrl, "type", "fixed")
    coef = cfg_get(kl_ctrl, "kl_coef", 0.001)
    if kind == "fixed":
        return FixedKLController(kl_coef=coef)
    if kind == "adaptive":
        return AdaptiveKLController(
            init_kl_coef=coef,
            target_kl=cfg_get(kl_ctrl, "target_kl", 0.1),
            horizon=cfg_get(kl_ctrl, "horizon", 10000),
        )
    raise NotImplementedError(f"unknown kl_ctrl.type {kind!r}; expected 'fixed' or 'adaptive'")


def compute_rewards(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    kl_ratio: float,
) -> torch.Tensor:
    """``token_level_scores - kl_ratio * (old_log_prob - ref_log_prob)``, all ``[B, T]``."""
    return token_level_scores - (old_log_prob - ref_log_prob) * kl_ratio


def apply_kl_penalty(
    data: Any, kl_ctrl: FixedKLController | AdaptiveKLController, kl_penalty: str = "kl"
) -> tuple[Any, dict[str, float]]:
    """Put a KL penalty into the rewards of a batch (verl's ``apply_kl_penalty``).

    Reads ``data.batch["token_level_scores"]``, ``["old_log_probs"]``, ``["ref_log_prob"]``
    and ``["response_mask"]`` (all ``[B, T]``), writes
    ``token_level_rewards = token_level_scores - beta * kld`` with
    ``kld = kl_penalty(old, ref, type) * response_mask`` and ``beta = kl_ctrl.value``, then
    updates the controller with the batch-mean of the per-sequence mean KL and ``n_steps=B``.

    Returns:
        ``(data, {"actor/reward_kl_penalty": kl, "actor/reward_kl_penalty_coeff": beta})``.
    """
    batch = data.batch
    mask = batch["response_mask"]
    kld = _kl_penalty(batch["old_log_probs"], batch["ref_log_prob"], kl_penalty) * mask
    beta = kl_ctrl.value
    batch["token_level_rewards"] = batch["token_level_scores"] - beta * kld
    current_kl = torch.mean(masked_mean(kld, mask, axis=-1)).item()
    kl_ctrl.update(current_kl=current_kl, n_steps=mask.shape[0])
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": float(beta)}


def compute_pf_ppo_reweight_data(data: Any, reweight_method: str = "pow", weight_pow: float = 2.0) -> Any:
    """PF-PPO: resample the batch (with replacement, same size) with probabilities from
    each response's summed ``token_level_scores``.

    ``reweight_method``: ``pow`` (``|score| ** weight_pow``), ``max_min`` (1 for the
    best and worst scores, else 0), ``max_random`` (0.4 for the best, else 0.1); weights
    get ``+1e-8`` so every row stays possible. Uses the global torch RNG. Meta-info lists
    with one entry per row are resampled too.

    Returns:
        a new DataProto of the same length.

    Raises:
        ValueError: unknown ``reweight_method``.
    """
    scores = data.batch["token_level_scores"].sum(dim=-1)
    with torch.no_grad():
        if reweight_method == "pow":
            weights = torch.pow(torch.abs(scores), weight_pow)
        elif reweight_method == "max_min":
            weights = torch.where((scores == scores.max()) | (scores == scores.min()), 1.0, 0.0)
        elif reweight_method == "max_random":
            weights = torch.where(scores == scores.max(), 0.4, 0.1)
        else:
            raise ValueError(f"unsupported reweight_method {reweight_method!r}; expected pow, max_min or max_random")
        weights = torch.clamp(weights + 1e-8, min=1e-8)
        size = scores.shape[0]
        rows = torch.multinomial(weights, size, replacement=True)
    resampled = data.select_idxs(rows)
    picks = rows.tolist()
    resampled.meta_info = {
        key: [value[i] for i in picks] if isinstance(value, list) and len(value) == size else value
        for key, value in data.meta_info.items()
    }
    return resampled
