"""State of the embedded broker: streams, leases, dedupe windows, the sample ledger.

Pure asyncio, no gRPC here (see :mod:`services.queues.broker_server`). With an
append-only file every accepted put, delivery (lease + dedupe claim), ack and ledger
write is on file before the caller hears about it, so a restart of the host loses
nothing acknowledged: unacked items come back queued, in order, with their delivery
counts, and the dedupe windows still hold the sample ids already taken.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.queues.aof import AppendOnlyFile, replay, rewrite

log = logging.getLogger("meshrl.queues.broker")

MAX_PRODUCERS = 100_000  # producer sequence numbers remembered per stream (oldest forgotten)
COMPACT_MIN_BYTES = 64 << 20  # never compact a file smaller than this (a rewrite walks the whole ledger)
COMPACT_GROWTH = 1.5  # compact when the file is this many times the size of the last snapshot


def frame_len(data: bytes | bytearray | memoryview | list) -> int:
    """Length of a frame held whole or as a list of chunks."""
    return sum(len(c) for c in data) if isinstance(data, list) else len(data)


def frame_bytes(data: bytes | bytearray | memoryview | list) -> bytes | bytearray | memoryview:
    """The frame as one contiguous buffer (joins chunks)."""
    return b"".join(data) if isinstance(data, list) else data


@dataclass
class Entry:
    """One item: ``data`` is the frame (bytes-like, or its chunks in order as received),
    ``sample_ids`` its rows' ids."""

    id: int
    producer: str
    seq: int
    sample_ids: tuple[str, ...]
    data: bytes | bytearray | memoryview | list
    deliveries: int = 0
    consumer: str = ""
    leased_at: float = 0.0


@dataclass
class Delivered:
    """An entry as handed to a consumer, with its per-row ``fresh`` flags."""

    entry: Entry
    fresh: tuple[bool, ...]


@dataclass
class StreamState:
    """One stream: unacked ``entries`` (id order), ``queued`` ids not delivered yet, ``leased``."""

    entries: dict[int, Entry] = field(default_factory=dict)
    queued: "OrderedDict[int, None]" = field(default_factory=OrderedDict)
    leased: dict[int, Entry] = field(default_factory=dict)
    next_id: int = 1
    seqs: "OrderedDict[str, int]" = field(default_factory=OrderedDict)
    claims: dict[str, "OrderedDict[str, int]"] = field(default_factory=dict)
    group: str = ""  # the one consumer group reading this stream (bound on first delivery)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)


class BrokerState:
    """All streams of one broker, plus the ledger; optionally backed by an append-only file."""

    def __init__(self, aof_path: str | Path | None = None, *, fsync: bool = False,
                 compact_min_bytes: int = COMPACT_MIN_BYTES) -> None:
        self.streams: dict[str, StreamState] = {}
        self.ledger: OrderedDict[str, str] = OrderedDict()
        self.stage_counts: dict[str, int] = {}  # samples per latest stage in ``ledger`` (kept as it changes)
        self._aof: AppendOnlyFile | None = None
        self._aof_path = Path(aof_path) if aof_path is not None else None
        self._fsync = fsync
        self.compact_min_bytes = compact_min_bytes
        self.compactions = 0
        self._snapshot_bytes = 0
        if self._aof_path is not None:
            self._load(self._aof_path)
            self._compact()

    def close(self) -> None:
        if self._aof is not None:
            self._aof.close()

    def stream(self, name: str) -> StreamState:
        s = self.streams.get(name)
        if s is None:
            s = self.streams[name] = StreamState()
        return s

    def _log(self, *records: list[Any]) -> None:
        if self._aof is not None:
            self._aof.append(*records)

    def maybe_compact(self) -> bool:
        """Rewrite the append-only file as a snapshot of the live state once it has grown to
        ``COMPACT_GROWTH`` times the last snapshot (and at least ``compact_min_bytes``).
        Called after every state change, when the state and the file agree. The file thus
        stays within a constant factor of the live state (unacked items, dedupe windows,
        ledger), whatever the history; the amortised cost is a constant per byte appended."""
        if self._aof is None:
            return False
        if self._aof.size < max(self.compact_min_bytes, COMPACT_GROWTH * self._snapshot_bytes):
            return False
        self._compact()
        return True

    def _compact(self) -> None:
        assert self._aof_path is not None
        if self._aof is not None:
            self._aof.close()
        before = self._aof.size if self._aof is not None else None
        rewrite(self._aof_path, self._snapshot())
        self._aof = AppendOnlyFile(self._aof_path, fsync=self._fsync)
        self._snapshot_bytes = self._aof.size
        if before is not None:
            self.compactions += 1
            log.debug("aof %s compacted: %d -> %d bytes", self._aof_path, before, self._snapshot_bytes)

    # ------------------------------------------------------------------ put
    async def wait_room(self, name: str, max_depth: int, timeout_s: float) -> bool:
        """Wait until ``name`` holds fewer than ``max_depth`` unacked items; False on timeout."""
        s = self.stream(name)
        async with s.changed:
            try:
                await asyncio.wait_for(s.changed.wait_for(lambda: len(s.entries) < max_depth), timeout_s)
            except TimeoutError:
                return False
        return True

    async def put(self, name: str, producer: str, seq: int, sample_ids: tuple[str, ...],
                  data: bytes | bytearray | list, stage: str, ledger_max: int) -> tuple[str, int]:
        """Append one item; returns (entry id or "" for a duplicate seq, gaps seen)."""
        s = self.stream(name)
        last = s.seqs.get(producer, 0)
        if seq <= last:
            return "", 0
        gaps = seq - last - 1
        e = Entry(s.next_id, producer, seq, sample_ids, data)
        if self._aof is not None:
            self._log(["P", name, e.id, producer, seq, list(sample_ids), frame_bytes(data)])
        if stage:
            self._log(["L", stage, list(sample_ids)])
        self._add(s, e)
        if stage:
            self._set_stages(sample_ids, stage, ledger_max)
        self.maybe_compact()
        async with s.changed:
            s.changed.notify_all()
        return str(e.id), gaps

    def _add(self, s: StreamState, e: Entry) -> None:
        s.entries[e.id] = e
        s.queued[e.id] = None
        s.next_id = max(s.next_id, e.id + 1)
        s.seqs[e.producer] = max(e.seq, s.seqs.get(e.producer, 0))
        s.seqs.move_to_end(e.producer)
        while len(s.seqs) > MAX_PRODUCERS:
            s.seqs.popitem(last=False)

    # ------------------------------------------------------------------ get / reclaim
    def check_group(self, name: str, group: str) -> None:
        """Each stream has exactly one consumer group; raise ValueError for another."""
        bound = self.stream(name).group
        if bound and bound != group:
            raise ValueError(f"stream {name!r} is already consumed by group {bound!r}; each stream has "
                             f"exactly one consumer group (got {group!r})")

    async def get(self, name: str, group: str, consumer: str, max_items: int, wait_s: float,
                  window: int) -> list[Delivered]:
        """Lease up to ``max_items`` queued items (waiting up to ``wait_s`` for one)."""
        self.check_group(name, group)
        s = self.stream(name)
        if not s.queued and wait_s > 0:
            async with s.changed:
                try:
                    await asyncio.wait_for(s.changed.wait_for(lambda: bool(s.queued)), wait_s)
                except TimeoutError:
                    return []
        picked = []
        while s.queued and len(picked) < max_items:
            eid, _ = s.queued.popitem(last=False)
            picked.append(s.entries[eid])
        return self._deliver(name, s, group, consumer, picked, window)

    def reclaim(self, name: str, group: str, consumer: str, min_idle_s: float, max_items: int,
                window: int, *, own_only: bool = False, exclude: frozenset[int] = frozenset()) -> list[Delivered]:
        """Move leases idle for ``min_idle_s`` or more to ``consumer`` and deliver them again.
        ``own_only``: only ``consumer``'s own leases not in ``exclude`` (recovery of replies
        lost in a disconnect)."""
        self.check_group(name, group)
        s = self.stream(name)
        cutoff = time.monotonic() - min_idle_s
        picked = [e for e in s.leased.values() if e.leased_at <= cutoff and e.id not in exclude
                  and (not own_only or e.consumer == consumer)][:max_items]
        return self._deliver(name, s, group, consumer, picked, window)

    def _deliver(self, name: str, s: StreamState, group: str, consumer: str, picked: list[Entry],
                 window: int) -> list[Delivered]:
        if not picked:
            return []
        s.group = group
        self._log(["D", name, group, consumer, [[e.id, list(e.sample_ids)] for e in picked]])
        now = time.monotonic()
        out = []
        for e in picked:
            fresh = self._claim(s, group, e.id, e.sample_ids, window)
            e.deliveries += 1
            e.consumer, e.leased_at = consumer, now
            s.queued.pop(e.id, None)
            s.leased.pop(e.id, None)
            s.leased[e.id] = e  # insertion order = lease order
            out.append(Delivered(e, fresh))
        self.maybe_compact()
        return out

    def _claim(self, s: StreamState, group: str, eid: int, sample_ids: tuple[str, ...],
               window: int) -> tuple[bool, ...]:
        claims = s.claims.setdefault(group, OrderedDict())
        fresh = []
        for sid in sample_ids:
            cur = claims.get(sid)
            if cur is None:
                claims[sid] = eid
                fresh.append(True)
            else:
                fresh.append(cur == eid)
        while len(claims) > window:
            claims.popitem(last=False)
        return tuple(fresh)

    # ------------------------------------------------------------------ ack / depth / ledger
    async def ack(self, name: str, ids: list[int], stage: str, sample_ids: list[str], ledger_max: int) -> int:
        """Remove acked entries; returns how many were still unacked."""
        s = self.stream(name)
        live = [i for i in ids if i in s.entries]
        if live or stage:
            self._log(["A", name, live], *([["L", stage, sample_ids]] if stage else []))
        for i in live:
            self._remove(s, i)
        if stage:
            self._set_stages(sample_ids, stage, ledger_max)
        self.maybe_compact()
        if live:
            async with s.changed:
                s.changed.notify_all()
        return len(live)

    def _remove(self, s: StreamState, eid: int) -> None:
        s.entries.pop(eid, None)
        s.queued.pop(eid, None)
        s.leased.pop(eid, None)

    def depth(self, name: str) -> tuple[int, int, int]:
        """(unacked, queued, leased) item counts."""
        s = self.stream(name)
        return len(s.entries), len(s.queued), len(s.leased)

    def record(self, sample_ids: list[str], stage: str, ledger_max: int) -> int:
        self._log(["L", stage, sample_ids])
        self._set_stages(sample_ids, stage, ledger_max)
        self.maybe_compact()
        return len(sample_ids)

    def _set_stages(self, sample_ids: Any, stage: str, ledger_max: int) -> None:
        ledger, counts = self.ledger, self.stage_counts
        for sid in sample_ids:
            old = ledger.get(sid)
            if old is not None:
                counts[old] -= 1
                ledger.move_to_end(sid)
            ledger[sid] = stage
            counts[stage] = counts.get(stage, 0) + 1
        while len(ledger) > max(1, ledger_max):
            counts[ledger.popitem(last=False)[1]] -= 1

    def stages(self, sample_ids: list[str]) -> list[str]:
        return [self.ledger.get(sid, "") for sid in sample_ids]

    # ------------------------------------------------------------------ persistence
    def _load(self, path: Path) -> None:
        n = 0
        for rec in replay(path):
            n += 1
            kind = rec[0]
            if kind == "P":
                name, eid, producer, seq, sids, data = rec[1:7]
                s = self.stream(name)
                self._add(s, Entry(eid, producer, seq, tuple(sids), data))
                if len(rec) > 8 and rec[7]:
                    self._lease_loaded(s, eid, rec[7], rec[8])
            elif kind == "A":
                s = self.stream(rec[1])
                for eid in rec[2]:
                    self._remove(s, eid)
            elif kind == "D":
                _, name, group, consumer, items = rec
                s = self.stream(name)
                s.group = group
                for eid, sids in items:
                    self._claim(s, group, eid, tuple(sids), 1 << 62)
                    if eid in s.entries:
                        self._lease_loaded(s, eid, s.entries[eid].deliveries + 1, consumer)
            elif kind == "L":
                self._set_stages(rec[2], rec[1], 1 << 62)
            elif kind == "S":
                _, name, producer, last = rec
                s = self.stream(name)
                s.seqs[producer] = max(last, s.seqs.get(producer, 0))
            elif kind == "C":
                _, name, group, pairs = rec
                self.stream(name).group = group
                claims = self.stream(name).claims.setdefault(group, OrderedDict())
                for sid, eid in pairs:
                    claims[sid] = eid
            else:
                log.error("aof %s: unknown record kind %r skipped", path, kind)
        if n:
            live = sum(len(s.entries) for s in self.streams.values())
            log.info("aof %s: replayed %d records, %d unacked items restored", path, n, live)

    def _lease_loaded(self, s: StreamState, eid: int, deliveries: int, consumer: str) -> None:
        """Restore a lease from the file: it stays with its consumer (who may still be alive
        and ack it) until it idles ``lease_idle_s`` from now and is reclaimed."""
        e = s.entries[eid]
        e.deliveries, e.consumer, e.leased_at = deliveries, consumer, time.monotonic()
        s.queued.pop(eid, None)
        s.leased.pop(eid, None)
        s.leased[eid] = e

    def _snapshot(self) -> Iterator[list[Any]]:
        """The current state as a minimal record sequence (for compaction)."""
        for name, s in self.streams.items():
            for producer, last in s.seqs.items():
                yield ["S", name, producer, last]
            for group, claims in s.claims.items():
                pairs = list(claims.items())
                for i in range(0, len(pairs), 10_000):
                    yield ["C", name, group, [list(p) for p in pairs[i : i + 10_000]]]
            for e in s.entries.values():
                yield ["P", name, e.id, e.producer, e.seq, list(e.sample_ids), frame_bytes(e.data), e.deliveries,
                       e.consumer]
        by_stage: dict[str, list[str]] = {}
        for sid, stage in self.ledger.items():
            by_stage.setdefault(stage, []).append(sid)
        # ledger order across stages is approximate after compaction (per-stage order kept)
        for stage, sids in by_stage.items():
            yield ["L", stage, sids]
