"""Reusable bucket memory: the publisher's snapshot arena and rotating buffers.

Fresh allocations are expensive (every page faults on first touch), so the publisher packs
each version into buffers it keeps:

* ``SnapshotArena`` -- one CPU ``uint8`` buffer per bucket index, reused across versions.
  After a publish they hold the latest version, which ``stream()`` serves as a safetensors
  byte stream (late joiners, replicas that missed a transfer). ``begin_write()`` retires
  the served version before the next publish overwrites the buffers; a stream reading it
  then stops with ``SnapshotError`` (the replica retries and gets the newer version).
* ``RotatingBuffers`` -- two device buffers used alternately (bucket k packs while bucket
  k-1's broadcast is done and bucket k-1's slot is free again), for the data plane when
  the arena cannot be the broadcast source (NCCL on GPU, or snapshots turned off).

A bucket may also be *borrowed* (``publish(..., borrow=True)``): its buffer is the
caller's own tensor, kept by reference as part of the snapshot.

With the canary gate (``weights.rollout.mode: canary``) two versions are served at once:
the candidate (in the arena) and the promoted version, which ``pin()`` moves out of the
arena into a :class:`PinnedSnapshot` that no publish overwrites. The arena then packs into
the buffers of the previously pinned version, so the two buffer sets take turns (two model
copies of host memory, allocated once).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from services.weights.errors import SnapshotError
from services.weights.plan import Bucket
from services.weights.snapshot import build_header, write_snapshot


class RotatingBuffers:
    """``buffer(index, nbytes)`` returns slot ``index % slots``, grown when too small."""

    def __init__(self, device: torch.device, slots: int = 2):
        self.device = device
        self._slots: list[torch.Tensor | None] = [None] * slots

    def buffer(self, index: int, nbytes: int) -> torch.Tensor:
        i = index % len(self._slots)
        b = self._slots[i]
        if b is None or b.numel() < nbytes:
            b = self._slots[i] = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return b


class SnapshotArena:
    """The latest published version in reusable CPU buffers (see module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._buffers: dict[int, torch.Tensor] = {}
        self._buckets: list[Bucket] | None = None
        self._version = -1
        self._generation = 0
        self._used: set[int] = set()

    def buffer(self, index: int, nbytes: int) -> torch.Tensor:
        """CPU buffer of at least ``nbytes`` for bucket ``index`` (only between begin_write/commit)."""
        self._used.add(index)
        b = self._buffers.get(index)
        if b is None or b.numel() < nbytes:
            b = self._buffers[index] = torch.empty(nbytes, dtype=torch.uint8)
        return b

    def begin_write(self) -> None:
        """Retire the served version: its buffers are about to be overwritten."""
        with self._cond:
            self._generation += 1
            self._buckets, self._version = None, -1
            self._used = set()

    def commit(self, version: int, buckets: list[Bucket]) -> None:
        """``buckets`` (whose buffers are this arena's) are now the served snapshot."""
        with self._cond:
            self._buckets, self._version = buckets, version
            for i in [i for i in self._buffers if i not in self._used]:
                del self._buffers[i]  # not used by this version's plan: free it
            self._cond.notify_all()

    @property
    def version(self) -> int:
        """Version served now; -1 when none (never published, or a publish is overwriting it)."""
        return self._version

    def wait_for(self, version: int, timeout: float) -> bool:
        """Wait until the served version is at least ``version``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._version < version:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def stream(self, chunk_bytes: int, min_version: int = -1) -> Iterator[tuple[int, int, int, bytes]]:
        """Yield ``(version, total_bytes, offset, data)`` chunks of the snapshot's safetensors bytes.

        Raises ``SnapshotError`` at once when there is no snapshot >= ``min_version``, and
        mid-stream when a new publish retires it.
        """
        with self._cond:
            if self._buckets is None or self._version < min_version:
                raise SnapshotError(f"no snapshot >= v{min_version} (have v{self._version})")
            gen, version, buckets = self._generation, self._version, self._buckets

        def read(b: Bucket, off: int, end: int) -> bytes:
            with self._cond:  # the writer bumps the generation under this lock
                if self._generation != gen:
                    raise SnapshotError(f"snapshot v{version} was superseded while streaming; fetch again")
                return b.buffer[off:end].numpy().tobytes()  # type: ignore[union-attr]

        yield from stream_snapshot(version, buckets, chunk_bytes, read)

    def pin(self, recycle: "PinnedSnapshot | None" = None) -> "PinnedSnapshot":
        """Move the served version out of the arena (it stays served, by the returned
        snapshot); the arena packs the next version into ``recycle``'s buffers (a pinned
        version no longer needed), else into fresh ones."""
        with self._cond:
            if self._buckets is None:
                raise SnapshotError("no snapshot to pin")
            pinned = PinnedSnapshot(self._version, self._buckets, self._buffers)
            self._generation += 1
            self._buckets, self._version = None, -1
            self._buffers = recycle.buffers if recycle is not None else {}
            self._used = set()
            return pinned

    def save(self, path: Path) -> int:
        """Write the served snapshot to ``path`` (safetensors); return its version."""
        with self._cond:
            if self._buckets is None:
                raise SnapshotError("no snapshot to save")
            version, buckets = self._version, self._buckets
            write_snapshot(path, version, buckets)  # under the lock: no publish may overwrite it meanwhile
            return version


class PinnedSnapshot:
    """A committed version kept apart from the arena (see ``SnapshotArena.pin``): never
    overwritten, so streaming it needs no generation check."""

    def __init__(self, version: int, buckets: list[Bucket], buffers: dict[int, torch.Tensor]) -> None:
        self.version, self.buckets, self.buffers = version, buckets, buffers

    def stream(self, chunk_bytes: int, min_version: int = -1) -> Iterator[tuple[int, int, int, bytes]]:
        """Like ``SnapshotArena.stream``."""
        if self.version < min_version:
            raise SnapshotError(f"no snapshot >= v{min_version} (have v{self.version})")
        yield from stream_snapshot(self.version, self.buckets, chunk_bytes,
                                   lambda b, off, end: b.buffer[off:end].numpy().tobytes())  # type: ignore[union-attr]

    def save(self, path: Path) -> int:
        write_snapshot(path, self.version, self.buckets)
        return self.version


def stream_snapshot(version: int, buckets: list[Bucket], chunk_bytes: int,
                    read: Callable[[Bucket, int, int], bytes]) -> Iterator[tuple[int, int, int, bytes]]:
    """``(version, total_bytes, offset, data)`` chunks of the safetensors file of ``buckets``;
    ``read(bucket, start, end)`` returns those bytes of a bucket (it may raise
    ``SnapshotError`` when the version was superseded meanwhile)."""
    header = build_header(version, buckets)
    total = len(header) + sum(s.nbytes for b in buckets for s in b.specs)
    pos = 0
    for i in range(0, len(header), chunk_bytes):
        data = header[i : i + chunk_bytes]
        yield version, total, pos, data
        pos += len(data)
    for b in buckets:
        for s in b.specs:
            for off in range(s.offset, s.offset + s.nbytes, chunk_bytes):
                data = read(b, off, min(off + chunk_bytes, s.offset + s.nbytes))
                yield version, total, pos, data
                pos += len(data)
