"""From scored experience to advantages (the reward -> advantage part of verl's ``fit()``).

Reads ``token_level_scores`` (float32 ``[B, R]``), turns them into ``token_level_rewards``
(minus a KL-in-reward penalty when ``algorithm.use_kl_in_reward``; that needs
``old_log_probs`` and ``ref_log_prob``), then calls ``core_algos.compute_advantage``
which writes ``advantages`` and ``returns`` (``[B, R]``). Deterministic, so every DP rank
runs it on the full batch and gets identical results.
"""

from __future__ import annotations

from typing import Any

from services.config.trainer import AlgorithmConfig
from services.protocol import DataProto
from trainer_svc import core_algos


def compute_advantage(
    data: DataProto, algo: AlgorithmConfig, kl_ctrl: Any | None = None
) -> tuple[DataProto, dict[str, float]]:
    """Fill ``token_level_rewards``, ``advantages`` and ``returns`` (in place); returns
    ``(data, metrics)``."""
    batch = data.batch
    metrics: dict[str, float] = {}
    if "token_level_scores" not in batch.keys():
        raise KeyError("experience batch lacks token_level_scores (was it scored by a reward worker?)")
    if "response_mask" not in batch.keys():
        batch["response_mask"] = core_algos.compute_response_mask(data)
    if algo.use_kl_in_reward:
        if kl_ctrl is None:
            raise ValueError("use_kl_in_reward needs a KL controller")
        data, kl_metrics = core_algos.apply_kl_penalty(data, kl_ctrl, kl_penalty=algo.kl_penalty)
        metrics.update(kl_metrics)
    else:
        batch["token_level_rewards"] = batch["token_level_scores"].float()
    core_algos.compute_advantage(
        data,
        adv_estimator=algo.adv_estimator,
        gamma=algo.gamma,
        lam=algo.lam,
        norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
        config=algo,
    )
    mask = batch["response_mask"]
    scores = (batch["token_level_scores"] * mask).sum(-1)
    if len(scores):
        metrics["critic/score/mean"] = float(scores.float().mean())
        metrics["critic/advantages/mean"] = float(core_algos.masked_mean(batch["advantages"], mask))
    return data, metrics
