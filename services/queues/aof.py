"""Append-only file of the embedded broker: every state change, replayed at start.

Record layout: ``u32 body length | u32 crc32(body) | body``, body = a msgpack list
``[kind, ...fields]`` (plain data only: str, int, bytes, lists). Kinds:

* ``P`` put:       ``[P, stream, entry_id, producer, seq, sample_ids, frame(, deliveries, consumer)]``
* ``A`` ack:       ``[A, stream, [entry_id, ...]]``
* ``D`` delivered: ``[D, stream, group, consumer, [[entry_id, [sample_id, ...]], ...]]`` (lease + dedupe claims)
* ``L`` ledger:    ``[L, stage, [sample_id, ...]]``
* ``S`` seq:       ``[S, stream, producer, last_seq]`` (written by compaction)
* ``C`` claims:    ``[C, stream, group, [[sample_id, entry_id], ...]]`` (written by compaction)

A torn last record (the host died mid-write) fails its length/CRC check and is cut off:
it was never acknowledged to anyone. No pickle: msgpack with raw bytes only.

The file only grows between compactions; the broker rewrites it as a snapshot of its live
state (see :meth:`services.queues.broker.BrokerState.maybe_compact`), so its size follows
the unacked items, not the history.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack

log = logging.getLogger("meshrl.queues.aof")

_HEAD = struct.Struct("<II")
MAX_RECORD = 1 << 31


class AppendOnlyFile:
    """Appends records and flushes each before returning (``fsync`` optional)."""

    def __init__(self, path: str | Path, *, fsync: bool = False) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the broker
        self.size = self._f.seek(0, os.SEEK_END)

    def append(self, *records: list[Any]) -> None:
        """Write records (each a msgpack-able list) and flush them to the OS (and disk)."""
        parts: list[bytes] = []
        for rec in records:
            body = msgpack.packb(rec, use_bin_type=True)
            parts += [_HEAD.pack(len(body), zlib.crc32(body)), body]
        for part in parts:
            view = memoryview(part)
            self.size += len(view)
            while view:
                view = view[self._f.write(view):]
        if self.fsync:
            os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


def replay(path: str | Path) -> Iterator[list[Any]]:
    """Yield the records of ``path`` in order; cut off a torn or corrupt tail."""
    p = Path(path)
    if not p.exists():
        return
    good = 0
    with open(p, "rb") as f:
        while True:
            head = f.read(_HEAD.size)
            if not head:
                break
            if len(head) < _HEAD.size:
                break
            n, crc = _HEAD.unpack(head)
            body = f.read(n) if n < MAX_RECORD else b""
            if len(body) != n or zlib.crc32(body) != crc:
                break
            try:
                rec = msgpack.unpackb(body, raw=False, strict_map_key=True)
            except (ValueError, msgpack.ExtraData) as exc:  # pragma: no cover - crc passed
                log.error("aof %s: undecodable record at byte %d: %s", p, good, exc)
                break
            good = f.tell()
            yield rec
    size = p.stat().st_size
    if good < size:
        log.warning("aof %s: cutting off %d bytes of torn/corrupt tail at byte %d", p, size - good, good)
        with open(p, "r+b") as f:
            f.truncate(good)


def rewrite(path: str | Path, records: Iterator[list[Any]]) -> None:
    """Atomically replace ``path`` with ``records`` (compaction)."""
    p = Path(path)
    tmp = p.with_suffix(p.suffix + ".tmp")
    with open(tmp, "wb") as f:
        for rec in records:
            body = msgpack.packb(rec, use_bin_type=True)
            f.write(_HEAD.pack(len(body), zlib.crc32(body)))
            f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
