"""Judging a candidate version from its samples, inside the training step (every rank).

A promotion policy's intake may mark a batch as one that judges a candidate: its
``meta_info[JUDGE_KEY]`` then holds what the verdict needs (the candidate's version, the
bound, the baselines). The step (:meth:`TrainerWorker.step`, through the policy's ``judge``
hook) recomputes the candidate's log-probs and calls :func:`judge`. The verdict comes from
the broadcast batch alone, so every rank reaches the same one whatever policy object it
holds; a batch nobody marked is not judged.
"""

from __future__ import annotations

from typing import Any

import torch

from services.protocol import DataProto
from trainer_svc.staleness import Staleness

JUDGE_KEY = "canary"
"""``meta_info`` key of a batch that carries a candidate's samples to judge (named for the
policy that marks batches so)."""

GAP_METRIC = "training/rollout_logprob_gap_mean"
"""The step metric (``trainer_svc.worker.rollout_mismatch_metrics``) the judging baseline reads."""


def judge(batch: DataProto, spec: dict[str, Any], current_version: int, max_staleness: int | Staleness,
          judged: tuple[torch.Tensor, int] | None = None) -> tuple[dict[str, Any], torch.Tensor]:
    """The verdict on the candidate whose rows ``batch`` carries (``spec``:
    ``meta_info[JUDGE_KEY]``), from the trainer's log-probs of its sampled tokens against the
    replicas' ``rollout_log_probs``; and the bool mask of the rows to remove before the
    update: every candidate row when it is rejected, else those too stale to train
    (``max_staleness``, a :class:`Staleness` or its bound; the intake kept them for
    judging). Pure: every rank reaches the same verdict.

    ``judged``: ``(log_probs, lag)``, the log-probs to judge the candidate's rows with and
    how many versions past the candidate the weights that made them were
    (``TrainerWorker._candidate_log_probs``); None: the batch's ``old_log_probs``, made
    ``current_version - version`` versions past it.

    The candidate's mean gap ``|log p_trainer - log p_rollout|`` is compared with a
    baseline: judged at lag 0, with the gap the promoted version had when it was judged at
    lag 0 (``spec["reference_gap"]``: like with like, both how a replica served the weights
    it was given); otherwise with the promoted rows' gap in this batch (the same weights
    judge both, so the policy's own change cancels out as far as it can), or without such
    rows the last step's (``spec["promoted_logprob_gap"]``)."""
    staleness = Staleness.of(max_staleness)
    b = batch.batch
    version = int(spec["version"])
    log_probs, lag = (b["old_log_probs"], current_version - version) if judged is None else judged
    rows = b["policy_version"].long().reshape(-1) == version
    mask = b["response_mask"].bool()
    cand_tokens, promoted_tokens = mask & rows[:, None], mask & ~rows[:, None]
    cand_gap = (log_probs.float() - b["rollout_log_probs"].float()).abs()
    cand = float(cand_gap[cand_tokens].mean()) if bool(cand_tokens.any()) else 0.0
    if bool(promoted_tokens.any()):
        gap = (b["old_log_probs"].float() - b["rollout_log_probs"].float()).abs()
        promoted = float(gap[promoted_tokens].mean())
    else:  # no promoted rows in this batch: the last step's gap, else none (0)
        promoted = float(spec.get("promoted_logprob_gap") or 0.0)
    reference = spec.get("reference_gap") if lag == 0 else None
    baseline = promoted if reference is None else float(reference)
    bound = float(spec["max_logprob_gap_increase"])
    m = {**spec.get("measurements", {}), "logprob_gap": cand, "promoted_logprob_gap": promoted,
         "judged_lag": float(lag), "judged_samples": float(rows.sum())}
    if reference is not None:
        m["reference_logprob_gap"] = float(reference)
    reason = ""
    if not bool(cand_tokens.any()):  # nothing of the candidate to judge: never promote it unseen
        reason = "no sampled token of the candidate reached the judging batch"
    elif cand - baseline > bound:
        against = "promoted" if reference is None else "the promoted version's own (lag 0)"
        reason = f"logprob_gap {cand:.4f} vs {against} {baseline:.4f} (+{cand - baseline:.4f} > {bound})"
    remove = rows if reason else rows & (not staleness.trainable(version, current_version))
    return {"version": version, "promoted": not reason, "reason": reason, "measurements": m}, remove


def judge_marked(batch: DataProto, worker: Any, staleness: Staleness) -> tuple[dict[str, Any], torch.Tensor] | None:
    """The step's judging: the verdict on the candidate ``batch`` is marked with (None when
    it is not marked), its rows recomputed with the candidate's own weights where ``worker``
    (a :class:`~trainer_svc.worker.TrainerWorker`) kept them. Collective: every rank holds
    the same batch, so all take the same path."""
    spec = batch.meta_info.get(JUDGE_KEY)
    if not spec:
        return None
    judged = worker._candidate_log_probs(batch, int(spec["version"]))
    return judge(batch, spec, worker.version, staleness, judged)
