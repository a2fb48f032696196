"""Batch intake on rank 0: lease experience groups, enforce staleness, ack after commit.

Two sources share one interface (``next_batch`` / ``commit`` / ``state``):

- :class:`QueueIntake` reads the ``experience`` stream (``services.queues``): each item is
  one scored group (all ``n`` samples of a ``uid``). A sample with
  ``current_version - policy_version > max_staleness`` is dropped and counted; so is a
  sample whose ``error`` column is non-empty. Items are acked only in ``commit`` -- after
  the training step that used them is committed -- with ledger stage ``trained``; dropped
  samples are recorded as ``dropped``. An item all of whose samples were dropped is acked
  at once (there is nothing to train). A crash before ``commit`` leaves the items leased,
  so the queue delivers them again: nothing is lost.
- :class:`SyntheticIntake` makes deterministic batches from the step number (smoke runs,
  benchmarks, resume tests): the data cursor is the step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from services.protocol import DataProto
from trainer_svc.batching import collate_groups

logger = logging.getLogger(__name__)


@dataclass
class PendingBatch:
    """A training batch plus what must happen to its sources once the step commits.

    ``data``: the collated batch (``B`` samples). ``items``: leased queue items to ack.
    ``dropped_ids``: sample ids dropped (stale or failed) from items being acked with it.
    ``staleness``: ``current_version - policy_version`` per trained sample.
    ``cursor``: source position after this batch (synthetic: the step number).
    """

    data: DataProto
    items: list[Any] = field(default_factory=list)
    dropped_ids: list[str] = field(default_factory=list)
    staleness: list[int] = field(default_factory=list)
    cursor: int = 0
    wait_seconds: float = 0.0


@dataclass
class IntakeCounters:
    """Running totals (also saved in checkpoints)."""

    groups: int = 0
    samples_trained: int = 0
    dropped_stale: int = 0
    dropped_error: int = 0
    samples_nonfinite: int = 0
    batches: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def _column(data: DataProto, key: str) -> np.ndarray | None:
    return data.non_tensor_batch.get(key) if data.non_tensor_batch is not None else None


#: Tensor columns every experience item must carry (see docs/contracts.md, "experience").
REQUIRED = ("input_ids", "attention_mask", "position_ids", "responses", "token_level_scores", "policy_version")


def validate_experience(data: DataProto) -> None:
    """Check an experience group has the columns and shapes training needs.

    ``input_ids``/``attention_mask``/``position_ids`` ``[n, L]``, ``responses`` and
    ``token_level_scores`` (and ``response_mask`` if present) ``[n, R]`` with ``R < L``,
    ``policy_version`` ``[n]``; raises ``ValueError`` naming the first bad column.
    """
    if data.batch is None or len(data) == 0:
        raise ValueError("experience item has no rows")
    keys = set(data.batch.keys())
    for key in REQUIRED:
        if key not in keys:
            raise ValueError(f"experience item lacks column {key!r}")
    n = len(data)
    seq = data.batch["input_ids"]
    if seq.dim() != 2:
        raise ValueError(f"input_ids must be [n, L], got {tuple(seq.shape)}")
    r = data.batch["responses"].shape[-1] if data.batch["responses"].dim() == 2 else -1
    if r < 1 or r >= seq.shape[1]:
        raise ValueError(f"responses must be [n, R] with 0 < R < L={seq.shape[1]}, got {tuple(data.batch['responses'].shape)}")
    for key in ("attention_mask", "position_ids"):
        if tuple(data.batch[key].shape) != tuple(seq.shape):
            raise ValueError(f"{key} must match input_ids {tuple(seq.shape)}, got {tuple(data.batch[key].shape)}")
    for key in ("token_level_scores", "response_mask", "rollout_log_probs"):
        if key in keys and tuple(data.batch[key].shape) != (n, r):
            raise ValueError(f"{key} must be [{n}, {r}], got {tuple(data.batch[key].shape)}")
    if data.batch["policy_version"].numel() != n:
        raise ValueError(f"policy_version must be [{n}], got {tuple(data.batch['policy_version'].shape)}")
    if not torch.equal(seq[:, -r:], data.batch["responses"]):
        raise ValueError("responses must equal the last R columns of input_ids")


def _count(c: IntakeCounters, pending: PendingBatch, applied: bool, groups: int) -> None:
    c.groups += groups
    if applied:
        c.samples_trained += len(pending.data)
    else:
        c.samples_nonfinite += len(pending.data)
    c.batches += 1


class QueueIntake:
    """Assemble ``train_batch_size`` groups per step from an async queue (rank 0 only).

    Args:
        queue: a ``services.queues`` queue on stream ``experience``.
        train_batch_size: groups (prompts) per training batch.
        max_staleness: versions a sample may lag the trainer.
        poll_s: longest single ``get`` wait (``should_stop`` and ``heartbeat`` run between polls).
    """

    def __init__(self, queue: Any, *, train_batch_size: int, max_staleness: int, poll_s: float = 1.0) -> None:
        self.queue = queue
        self.train_batch_size = train_batch_size
        self.max_staleness = max_staleness
        self.poll_s = poll_s
        self.counters = IntakeCounters()
        self._recovered = False
        self._backlog: list[Any] = []

    async def _recover(self) -> list[Any]:
        """Items leased to an earlier incarnation of this trainer and never acked (it died
        before committing them): take them over first, so nothing is lost on a restart.
        The trainer is the only consumer of its group, so every pending item is ours."""
        self._recovered = True
        out: list[Any] = []
        seen: set[str] = set()
        while True:
            fresh = 0
            for item in await self.queue.reclaim(min_idle=0, max_items=100):
                if item.id not in seen:  # a backend may hand the same entry out twice
                    seen.add(item.id)
                    out.append(item)
                    fresh += 1
            if not fresh:
                break
        if out:
            logger.info("intake: recovered %d experience items leased before a restart", len(out))
        return out

    def _screen(self, data: DataProto, current_version: int) -> tuple[torch.Tensor, list[int], int, int]:
        """Keep-mask over rows, staleness of kept rows, and how many rows were stale / errored.

        Raises ``ValueError`` naming the column when the item cannot be trained on."""
        validate_experience(data)
        n = len(data)
        versions = data.batch["policy_version"].long().reshape(n)
        lag = current_version - versions
        stale = lag > self.max_staleness
        errors = _column(data, "error")
        failed = torch.zeros(n, dtype=torch.bool)
        if errors is not None:
            failed = torch.tensor([bool(e) for e in errors], dtype=torch.bool)
        keep = ~stale & ~failed
        return keep, lag[keep].tolist(), int((stale & ~failed).sum()), int(failed.sum())

    async def next_batch(
        self,
        current_version: int,
        *,
        timeout: float,
        should_stop: Callable[[], bool] = lambda: False,
        heartbeat: Callable[[], None] = lambda: None,
    ) -> PendingBatch | None:
        """Lease until ``train_batch_size`` groups with fresh samples are in hand.

        Returns ``None`` when ``should_stop()`` turns true (leased items stay unacked and
        are delivered again later). Raises ``TimeoutError`` after ``timeout`` seconds
        without a full batch (the leased items likewise stay unacked).
        """
        t0 = time.monotonic()
        deadline = t0 + timeout
        groups: list[DataProto] = []
        items: list[Any] = []
        dropped_ids: list[str] = []
        staleness: list[int] = []
        while len(groups) < self.train_batch_size:
            if should_stop():
                return None
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"intake: only {len(groups)}/{self.train_batch_size} groups arrived within {timeout:.0f}s"
                )
            heartbeat()
            if not self._recovered:
                self._backlog = await self._recover()
            want = self.train_batch_size - len(groups)
            if self._backlog:
                got, self._backlog = self._backlog[:want], self._backlog[want:]
            else:
                got = await self.queue.get(max_items=want, timeout=self.poll_s)
            for item in got:
                data = item.data
                try:
                    keep, lag, n_stale, n_err = self._screen(data, current_version)
                except ValueError as exc:
                    logger.error("intake: dropping item %s: %s", item.id, exc)
                    self.counters.dropped_error += len(data)
                    await self.queue.ack(item, stage="dropped")
                    continue
                self.counters.dropped_stale += n_stale
                self.counters.dropped_error += n_err
                sids = _column(data, "sample_id")
                ids = [str(s) for s in sids] if sids is not None else []
                gone = [ids[i] for i in range(len(ids)) if not bool(keep[i])]
                if not bool(keep.any()):
                    await self.queue.ack(item, stage="dropped")
                    continue
                groups.append(data if bool(keep.all()) else data.select_idxs(keep))
                items.append(item)
                dropped_ids.extend(gone)
                staleness.extend(lag)
        batch = collate_groups(groups)
        return PendingBatch(
            data=batch,
            items=items,
            dropped_ids=dropped_ids,
            staleness=staleness,
            cursor=self.counters.batches + 1,
            wait_seconds=time.monotonic() - t0,
        )

    async def commit(self, pending: PendingBatch, applied: bool = True) -> None:
        """The step that used ``pending`` is committed: ack its items and record ledger
        stages -- ``trained``, or ``nonfinite`` when the step was skipped for a NaN/inf
        loss (the samples were consumed but did not change the weights)."""
        if pending.items:
            await self.queue.ack(pending.items, stage="trained" if applied else "nonfinite")
        if pending.dropped_ids:
            await self.queue.record_stage(pending.dropped_ids, "dropped")
        _count(self.counters, pending, applied, len(pending.items))

    def state(self) -> dict[str, Any]:
        return {"intake": self.counters.as_dict()}

    def restore(self, state: dict[str, Any]) -> None:
        self.counters = IntakeCounters(**state.get("intake", {}))


class SyntheticIntake:
    """Deterministic batches keyed by the step number (no queue)."""

    def __init__(
        self, *, train_batch_size: int, n: int, prompt_len: int, response_len: int, vocab_size: int, seed: int = 0
    ) -> None:
        self.kw = dict(n=n, prompt_len=prompt_len, response_len=response_len, vocab_size=vocab_size)
        self.train_batch_size = train_batch_size
        self.seed = seed
        self.counters = IntakeCounters()

    async def next_batch(self, current_version: int, **_: Any) -> PendingBatch:
        from trainer_svc.synthetic import make_batch

        step = self.counters.batches
        data = make_batch(self.train_batch_size, seed=self.seed * 1_000_003 + step, policy_version=current_version, **self.kw)
        return PendingBatch(data=data, staleness=[0] * len(data), cursor=step + 1)

    async def commit(self, pending: PendingBatch, applied: bool = True) -> None:
        _count(self.counters, pending, applied, self.train_batch_size)

    def state(self) -> dict[str, Any]:
        return {"intake": self.counters.as_dict()}

    def restore(self, state: dict[str, Any]) -> None:
        self.counters = IntakeCounters(**state.get("intake", {}))
