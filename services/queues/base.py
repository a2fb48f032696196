"""The queue interface shared by every backend, and the DataProto layer on top of it.

Two layers:

* **frames** (``put_frames`` / ``get_frames`` / ``reclaim_frames``): opaque byte payloads,
  each tagged with the ``sample_id`` of every row it carries. Backends implement this.
* **DataProto** (``put`` / ``get`` / ``reclaim``): encodes with :mod:`services.wire` on put,
  decodes and validates on get (a frame that fails is logged, counted as malformed,
  acked away, and the consumer keeps going). The codec is two functions at the end of this
  module (``encode_item``, ``decode_entry``).

Delivery is at-least-once: an item stays in the stream until a consumer ``ack``s it (after
its downstream write), and an item leased longer than ``lease_idle_s`` goes to the next
consumer. Each consumer group remembers which item first took each ``sample_id`` (a
bounded window); another item carrying the same ``sample_id`` is dropped as a duplicate,
so consumers see every sample effectively once. Producers number their items; the backend
rejects a number it already has (an idempotent retry) and counts skipped numbers (gaps).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from services.queues.stats import QueueMetrics, StatsRecorder

if TYPE_CHECKING:
    from services.config.queues import QueueCommon
    from services.protocol import DataProto

log = logging.getLogger("meshrl.queues")

T = TypeVar("T")

STAGES = ("queued", "generating", "generated", "scored", "trained", "dropped")
"""The stages services report to the ledger (any short identifier is accepted)."""

_NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_STAGE_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
MAX_SAMPLE_ID_LEN = 256


class QueueError(RuntimeError):
    """Base class of queue errors."""


class QueueFullError(QueueError, TimeoutError):
    """put() waited its whole deadline while the stream stayed at ``max_depth``."""


class QueueUnavailableError(QueueError, TimeoutError):
    """The backend stayed unreachable until the call's deadline."""


class MalformedEntryError(QueueError, ValueError):
    """A stream entry or frame failed validation (raised internally; consumers never see it)."""


def check_name(kind: str, value: str) -> str:
    """Validate a stream / group / consumer name: 1-128 chars of ``[A-Za-z0-9_.:-]``."""
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise ValueError(f"{kind} name {value!r} must be 1-128 characters of [A-Za-z0-9_.:-]")
    return value


def check_stage(stage: str) -> str:
    """Validate a ledger stage: a lowercase identifier of at most 32 characters."""
    if not isinstance(stage, str) or not _STAGE_RE.match(stage):
        raise ValueError(f"ledger stage {stage!r} must be a lowercase identifier (<= 32 chars), e.g. {STAGES}")
    return stage


def check_sample_ids(sample_ids: Sequence[Any]) -> tuple[str, ...]:
    """Validate a frame's sample ids: non-empty, unique strings of 1-256 characters."""
    ids = tuple(sample_ids)
    if not ids:
        raise ValueError("an item must carry at least one sample_id")
    for s in ids:
        if not isinstance(s, str) or not 0 < len(s) <= MAX_SAMPLE_ID_LEN:
            raise ValueError(f"sample_id {s!r} must be a non-empty str of at most {MAX_SAMPLE_ID_LEN} chars")
    if len(set(ids)) != len(ids):
        raise ValueError("sample_ids within one item must be unique")
    return ids


@dataclass(frozen=True)
class RawItem:
    """One frame to put: ``payload`` (bytes-like, any size up to ``max_frame_bytes``) and the
    ``sample_id`` of every row it carries (``str`` each, unique)."""

    payload: bytes | bytearray | memoryview
    sample_ids: tuple[str, ...]


@dataclass
class RawLeased:
    """One leased frame as handed out by a backend.

    ``id``: backend entry id (str). ``payload``: the frame bytes. ``sample_ids``: all ids of
    the frame; ``fresh``: per sample, ``False`` when another item already took that
    sample_id (a duplicate the consumer must skip). ``delivery_count``: 1 on first delivery.
    ``producer``/``seq``: who put it and its sequence number. ``error``: set by the backend
    when the entry itself is malformed (the base layer drops it). ``token``: backend data
    needed to ack (e.g. the Redis key of a large frame).
    """

    id: str
    payload: bytes | bytearray | memoryview
    sample_ids: tuple[str, ...]
    fresh: tuple[bool, ...]
    delivery_count: int = 1
    producer: str = ""
    seq: int = 0
    error: str | None = None
    token: Any = None


@dataclass
class Leased:
    """A decoded item leased to this consumer; ``ack`` it after the downstream write.

    ``data``: the DataProto, already reduced to its fresh rows (duplicates removed).
    ``sample_ids``: the ``sample_id`` of each row of ``data``. ``delivery_count``: 1 on
    first delivery, more after a reclaim/restart.
    """

    id: str
    data: "DataProto"
    sample_ids: tuple[str, ...]
    delivery_count: int
    raw: RawLeased = field(repr=False)


@dataclass
class PutOutcome:
    """What one backend put attempt did: ``ids`` of the items accepted (a prefix of the
    batch, ``None`` for an idempotent duplicate), plus sequence ``gaps`` seen."""

    ids: list[str | None]
    gaps: int = 0


class Queue(ABC):
    """A named stream, read by one consumer group, written by any number of producers.

    ``stream``: which stream (``prompts``, ``rollouts``, ``experience``, ...). ``group``: the
    consuming stage. ``consumer``: this process's unique name within the group (also the
    prefix of its producer id). All methods are coroutines with deadlines.
    """

    transient_errors: tuple[type[BaseException], ...] = ()
    permanent_errors: tuple[type[BaseException], ...] = ()  # subclasses of the above never retried

    def __init__(
        self,
        cfg: "QueueCommon",
        *,
        stream: str,
        group: str,
        consumer: str,
        metrics: QueueMetrics | None = None,
    ) -> None:
        self.cfg = cfg
        self.stream = check_name("stream", stream)
        self.group = check_name("group", group)
        self.consumer = check_name("consumer", consumer)
        self.producer_id = f"{consumer[:96]}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        self._rec = StatsRecorder(stream, group, metrics)
        self._next_seq = 1
        self._put_lock = asyncio.Lock()
        self._last_reclaim = 0.0

    # ------------------------------------------------------------------ backend hooks
    @abstractmethod
    async def _put_once(self, items: Sequence[RawItem], seqs: Sequence[int], stage: str | None) -> PutOutcome:
        """Append a prefix of ``items`` (as many as fit under ``max_depth``); one attempt."""

    @abstractmethod
    async def _read(self, max_items: int, timeout_s: float) -> list[RawLeased]:
        """Lease up to ``max_items`` new items, waiting up to ``timeout_s`` for the first."""

    @abstractmethod
    async def _claim_idle(self, min_idle_s: float, max_items: int) -> list[RawLeased]:
        """Take over up to ``max_items`` items leased to anyone and idle >= ``min_idle_s``."""

    @abstractmethod
    async def _ack_once(self, items: Sequence[RawLeased], stage: str | None) -> int:
        """Acknowledge (and delete) ``items``; idempotent; returns how many were pending."""

    @abstractmethod
    async def _depth_once(self) -> int:
        """Unacknowledged items in the stream (queued + leased)."""

    @abstractmethod
    async def _record_once(self, sample_ids: Sequence[str], stage: str) -> None:
        """Ledger: set the stage of each sample id."""

    @abstractmethod
    async def _stages_once(self, sample_ids: Sequence[str]) -> list[str | None]:
        """Ledger: the stage of each sample id (``None`` if unknown / forgotten)."""

    async def close(self) -> None:
        """Release connections. The queue is unusable afterwards."""

    # ------------------------------------------------------------------ retry helper
    async def _retry(self, fn: Callable[[], Awaitable[T]], deadline: float, what: str) -> T:
        """Run ``fn`` until it succeeds, retrying transient connection errors with
        exponential backoff until ``deadline`` (monotonic seconds)."""
        delay = self.cfg.reconnect_backoff_initial_s
        while True:
            try:
                return await fn()
            except self.transient_errors as exc:
                if isinstance(exc, self.permanent_errors):
                    raise
                now = time.monotonic()
                if now + delay > deadline:
                    raise QueueUnavailableError(
                        f"queue {self.stream!r}: {what} failed, backend unreachable until the deadline: {exc!r}"
                    ) from exc
                self._rec.inc("reconnects")
                self._on_disconnect()
                log.warning("queue %s: %s failed (%r); retrying in %.2fs", self.stream, what, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.cfg.reconnect_backoff_max_s)

    def _put_started(self) -> None:
        """Hook: a put_frames call starts (its sequence numbers are fresh)."""

    def _on_disconnect(self) -> None:
        """Hook: a call failed with a transient error (backends may schedule recovery)."""

    # ------------------------------------------------------------------ frames API
    async def put_frames(
        self, items: Sequence[RawItem], *, timeout: float | None = None, stage: str | None = None
    ) -> list[str | None]:
        """Append frames in order; wait (up to ``timeout``, default ``put_timeout_s``) while
        the stream is full. Returns the entry id of each item (``None`` when the backend
        already had it from an earlier, retried put). Raises :class:`QueueFullError` or
        :class:`QueueUnavailableError` at the deadline; items before the failing one are in.
        ``stage``: if given, recorded in the ledger for every sample of the accepted items."""
        if stage is not None:
            check_stage(stage)
        items = list(items)
        for it in items:
            check_sample_ids(it.sample_ids)
            if len(it.payload) > self.cfg.max_frame_bytes:
                raise ValueError(f"frame of {len(it.payload)} bytes exceeds max_frame_bytes={self.cfg.max_frame_bytes}")
        deadline = time.monotonic() + (self.cfg.put_timeout_s if timeout is None else max(0.0, timeout))
        out: list[str | None] = []
        async with self._put_lock:  # sequence numbers must reach the backend in order
            seqs = list(range(self._next_seq, self._next_seq + len(items)))
            self._next_seq += len(items)
            self._put_started()
            delay = 0.005
            while items:
                res = await self._retry(lambda: self._put_once(items, seqs, stage), deadline, "put")
                n = len(res.ids)
                if res.gaps:
                    self._rec.inc("seq_gaps", res.gaps)
                    log.warning("queue %s: the backend had lost %d of producer %s's earlier items (sequence gap)",
                                self.stream, res.gaps, self.producer_id)
                self._rec.inc("put", sum(1 for i in res.ids if i is not None))
                self._rec.inc("seq_duplicates", sum(1 for i in res.ids if i is None))
                out.extend(res.ids)
                items, seqs = items[n:], seqs[n:]
                if not items:
                    break
                if n:
                    delay = 0.005
                    continue
                if time.monotonic() + delay > deadline:
                    self._next_seq = seqs[0]  # certain: none of these was accepted; reuse their numbers
                    raise QueueFullError(
                        f"queue {self.stream!r} stayed at max_depth={self.cfg.max_depth} until the put "
                        f"deadline; {len(out)} of {len(out) + len(items)} items were accepted"
                    )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.02)  # poll for room; short so a fast consumer never starves
        return out

    async def get_frames(self, max_items: int, timeout: float) -> list[RawLeased]:
        """Lease up to ``max_items`` frames; wait up to ``timeout`` s for at least one.

        Items idle longer than ``lease_idle_s`` in other consumers' hands are taken over
        first. Malformed entries and all-duplicate items are acked away and counted; the
        rest come back with ``fresh`` flags per sample. Returns ``[]`` on timeout."""
        if max_items < 1:
            raise ValueError("max_items must be >= 1")
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            got: list[RawLeased] = []
            idle = self.cfg.lease_idle_s
            now = time.monotonic()
            if idle > 0 and now - self._last_reclaim >= min(idle / 2, 5.0):
                self._last_reclaim = now
                got = await self._retry(lambda: self._claim_idle(idle, max_items), deadline + self.cfg.op_timeout_s, "reclaim")
            if len(got) < max_items:
                wait = 0.0 if got else max(0.0, deadline - time.monotonic())
                got += await self._retry(
                    lambda: self._read(max_items - len(got), wait), deadline + self.cfg.op_timeout_s, "get"
                )
            kept = await self._screen(got)
            if kept or time.monotonic() >= deadline:
                return kept

    async def reclaim_frames(self, min_idle: float, max_items: int = 100) -> list[RawLeased]:
        """Take over up to ``max_items`` items leased (to any consumer) and unacked for at
        least ``min_idle`` seconds, e.g. those of a consumer that died."""
        deadline = time.monotonic() + self.cfg.op_timeout_s
        got = await self._retry(lambda: self._claim_idle(min_idle, max_items), deadline, "reclaim")
        return await self._screen(got)

    async def _screen(self, got: list[RawLeased]) -> list[RawLeased]:
        """Drop malformed and all-duplicate entries (ack them, count them); keep the rest."""
        kept: list[RawLeased] = []
        drop: list[RawLeased] = []
        for r in got:
            if r.error is not None:
                log.error("queue %s: dropping malformed entry %s: %s", self.stream, r.id, r.error)
                self._rec.inc("malformed")
                drop.append(r)
                continue
            dups = sum(1 for f in r.fresh if not f)
            self._rec.inc("deduplicated", dups)
            if dups == len(r.fresh):
                drop.append(r)
                continue
            kept.append(r)
        if drop:
            self._rec.inc("dropped", len(drop))
            await self._retry(lambda: self._ack_once(drop, None), time.monotonic() + self.cfg.op_timeout_s, "ack")
        self._rec.inc("delivered", len(kept))
        self._rec.inc("redelivered", sum(1 for r in kept if r.delivery_count > 1))
        return kept

    async def ack(self, items: "Leased | RawLeased | Sequence[Leased | RawLeased]", *, stage: str | None = None) -> int:
        """Acknowledge items after their downstream write; they leave the stream for good.
        Idempotent. ``stage``: if given, recorded in the ledger for their samples.
        Returns how many were still pending."""
        if stage is not None:
            check_stage(stage)
        seq = [items] if isinstance(items, Leased | RawLeased) else list(items)
        raws = [i.raw if isinstance(i, Leased) else i for i in seq]
        if not raws:
            return 0
        n = await self._retry(lambda: self._ack_once(raws, stage), time.monotonic() + self.cfg.op_timeout_s, "ack")
        self._rec.inc("acked", n)
        return n

    async def depth(self) -> int:
        """Unacknowledged items in the stream: queued plus leased."""
        d = await self._retry(self._depth_once, time.monotonic() + self.cfg.op_timeout_s, "depth")
        self._rec.set_depth(d)
        return d

    # ------------------------------------------------------------------ ledger
    async def record_stage(self, sample_ids: Sequence[str], stage: str) -> None:
        """Ledger: record that each of ``sample_ids`` reached ``stage`` (last write wins)."""
        check_stage(stage)
        ids = check_sample_ids(sample_ids)
        await self._retry(lambda: self._record_once(ids, stage), time.monotonic() + self.cfg.op_timeout_s, "ledger")

    async def stages(self, sample_ids: Sequence[str]) -> dict[str, str | None]:
        """Ledger: the last stage recorded for each sample id (``None``: unknown/forgotten)."""
        ids = list(sample_ids)
        if not ids:
            return {}
        got = await self._retry(lambda: self._stages_once(ids), time.monotonic() + self.cfg.op_timeout_s, "ledger")
        return dict(zip(ids, got, strict=True))

    def stats(self) -> dict[str, int]:
        """This queue object's counters (see :mod:`services.queues.stats`)."""
        return self._rec.stats.as_dict()

    # ------------------------------------------------------------------ DataProto API
    async def put(
        self, items: "Sequence[DataProto]", *, timeout: float | None = None, stage: str | None = None
    ) -> list[str | None]:
        """Encode each DataProto with :mod:`services.wire` and append it (see ``put_frames``).
        Every item needs a ``sample_id`` non-tensor column (str per row, unique)."""
        raws = [encode_item(i, d) for i, d in enumerate(items)]
        return await self.put_frames(raws, timeout=timeout, stage=stage)

    async def get(self, max_items: int, timeout: float) -> list[Leased]:
        """Lease up to ``max_items`` DataProto items (duplicate rows removed); ``[]`` on timeout."""
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            out = await self._decode_all(await self.get_frames(max_items, max(0.0, deadline - time.monotonic())))
            if out or time.monotonic() >= deadline:
                return out

    async def reclaim(self, min_idle: float, max_items: int = 100) -> list[Leased]:
        """Take over idle items of other (dead) consumers, decoded (see ``reclaim_frames``)."""
        return await self._decode_all(await self.reclaim_frames(min_idle, max_items))

    async def _decode_all(self, raws: list[RawLeased]) -> list[Leased]:
        out, bad = [], []
        for r in raws:
            try:
                out.append(decode_entry(r, self.cfg.max_frame_bytes))
            except Exception as exc:  # noqa: BLE001 - any failure of a peer's frame must not stop us
                log.error("queue %s: dropping malformed frame in entry %s: %s", self.stream, r.id, exc)
                bad.append(r)
        if bad:
            self._rec.inc("malformed", len(bad))
            self._rec.inc("dropped", len(bad))
            await self._retry(lambda: self._ack_once(bad, None), time.monotonic() + self.cfg.op_timeout_s, "ack")
        return out


# ---------------------------------------------------------------------- the DataProto codec
def encode_item(index: int, d: "DataProto") -> RawItem:
    """One DataProto as a frame (:mod:`services.wire`), tagged with its ``sample_id`` column
    (str per row, unique); ``index``: its place in the put, for the error message."""
    from services import wire

    col = d.non_tensor_batch.get("sample_id") if d.non_tensor_batch is not None else None
    if col is None:
        raise ValueError(f"item {index} has no 'sample_id' non-tensor column")
    return RawItem(wire.encode(d), check_sample_ids(list(col)))


def decode_entry(r: RawLeased, max_frame_bytes: int) -> Leased:
    """A leased frame decoded and checked against its entry's sample ids, its duplicate rows
    (``fresh`` False) removed; ``MalformedEntryError`` or the codec's error when it is bad."""
    from services import wire

    data = wire.decode(r.payload, max_frame_bytes=max_frame_bytes)  # copies read-only bytes once
    col = data.non_tensor_batch.get("sample_id") if data.non_tensor_batch is not None else None
    if col is None or list(col) != list(r.sample_ids):
        raise MalformedEntryError("the frame's sample_id column does not match the entry's sample ids")
    if all(r.fresh):
        return Leased(r.id, data, r.sample_ids, r.delivery_count, r)
    keep = [i for i, f in enumerate(r.fresh) if f]
    return Leased(r.id, data.select_idxs(keep), tuple(r.sample_ids[i] for i in keep), r.delivery_count, r)
