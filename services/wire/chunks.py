"""Cutting a frame into ``meshrl.v1.FrameChunk`` messages for gRPC streams, and joining
them back with strict sequence checks (gap, repeat, mixed frames, size mismatch -> WireError).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator
from typing import Any

from services.pb import frame_pb2
from services.wire.codec import DEFAULT_MAX_FRAME_BYTES
from services.wire.errors import WireError

DEFAULT_CHUNK_BYTES = 1 << 20  # 1 MiB: well under gRPC's default 4 MiB message limit


def iter_chunks(frame: Any, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[frame_pb2.FrameChunk]:
    """Yield the frame's bytes as ``FrameChunk`` messages of at most ``chunk_bytes`` each.

    ``frame``: a bytes-like frame (``encode``'s bytearray) or a list of bytes-like parts
    (``encode_parts``), which are cut without being joined first.
    """
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be a positive int, got {chunk_bytes!r}")
    parts = [memoryview(p).cast("B") for p in frame] if isinstance(frame, (list, tuple)) else [memoryview(frame).cast("B")]
    total = sum(p.nbytes for p in parts)
    if total == 0:
        raise ValueError("cannot chunk an empty frame")
    count = (total + chunk_bytes - 1) // chunk_bytes
    frame_id = secrets.randbits(64)
    seq, pending, filled = 0, bytearray(), 0
    for part in parts:
        pos = 0
        while pos < part.nbytes:
            take = min(chunk_bytes - filled, part.nbytes - pos)
            if not filled and take == chunk_bytes:  # a whole chunk inside one part: one copy
                yield frame_pb2.FrameChunk(frame_id=frame_id, seq=seq, total_chunks=count, total_bytes=total, data=bytes(part[pos : pos + take]))
                seq, pos = seq + 1, pos + take
                continue
            pending += part[pos : pos + take]
            pos += take
            filled += take
            if filled == chunk_bytes:
                yield frame_pb2.FrameChunk(frame_id=frame_id, seq=seq, total_chunks=count, total_bytes=total, data=bytes(pending))
                seq, pending, filled = seq + 1, bytearray(), 0
    if filled:
        yield frame_pb2.FrameChunk(frame_id=frame_id, seq=seq, total_chunks=count, total_bytes=total, data=bytes(pending))


class ChunkAssembler:
    """Reassemble one frame from its chunks, in order, into a preallocated bytearray.

    ``add(chunk)`` returns True when the frame is complete; ``frame()`` then returns the
    writable bytearray (decode it zero-copy). Any inconsistency raises WireError.
    """

    def __init__(self, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf: bytearray | None = None
        self._first: frame_pb2.FrameChunk | None = None
        self._next_seq = 0
        self._filled = 0

    @property
    def done(self) -> bool:
        """True once every chunk has arrived."""
        return self._first is not None and self._next_seq == self._first.total_chunks

    def add(self, chunk: frame_pb2.FrameChunk) -> bool:
        """Append the next chunk; True when the frame is complete."""
        if not isinstance(chunk, frame_pb2.FrameChunk):
            raise WireError(f"chunk: expected a FrameChunk, got {type(chunk).__qualname__}")
        if self._first is None:
            self._start(chunk)
        elif self.done:
            raise WireError(f"chunk seq {chunk.seq}: extra chunk after the frame was complete")
        first = self._first
        assert first is not None and self._buf is not None
        if (chunk.frame_id, chunk.total_chunks, chunk.total_bytes) != (first.frame_id, first.total_chunks, first.total_bytes):
            raise WireError(f"chunk seq {chunk.seq}: frame id/total_chunks/total_bytes differ from chunk 0 (mixed frames)")
        if chunk.seq != self._next_seq:
            kind = "repeated" if chunk.seq < self._next_seq else "missing"
            raise WireError(f"chunk seq {chunk.seq}: expected seq {self._next_seq} ({kind} chunk)")
        n = len(chunk.data)
        if n == 0:
            raise WireError(f"chunk seq {chunk.seq}: empty data")
        if self._filled + n > first.total_bytes:
            raise WireError(f"chunk seq {chunk.seq}: data runs past total_bytes={first.total_bytes}")
        self._buf[self._filled : self._filled + n] = chunk.data
        self._filled += n
        self._next_seq += 1
        if self.done and self._filled != first.total_bytes:
            raise WireError(f"chunks hold {self._filled} bytes, total_bytes says {first.total_bytes}")
        return self.done

    def _start(self, chunk: frame_pb2.FrameChunk) -> None:
        if chunk.seq != 0:
            raise WireError(f"chunk seq {chunk.seq}: the first chunk must have seq 0 (missing chunk)")
        if chunk.total_bytes == 0 or chunk.total_bytes > self.max_frame_bytes:
            raise WireError(f"chunk 0: total_bytes={chunk.total_bytes} is zero or over max_frame_bytes={self.max_frame_bytes}")
        if not 1 <= chunk.total_chunks <= chunk.total_bytes:
            raise WireError(f"chunk 0: total_chunks={chunk.total_chunks} impossible for {chunk.total_bytes} bytes")
        self._first = chunk
        self._buf = bytearray(chunk.total_bytes)

    def frame(self) -> bytearray:
        """The complete frame; WireError if chunks are still missing."""
        if not self.done or self._buf is None:
            got = self._next_seq
            want = self._first.total_chunks if self._first is not None else "?"
            raise WireError(f"incomplete frame: {got} of {want} chunks received")
        return self._buf


def join_chunks(chunks: Iterable[frame_pb2.FrameChunk], *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> bytearray:
    """Join the chunks of exactly one frame (validated; WireError on any problem)."""
    asm = ChunkAssembler(max_frame_bytes=max_frame_bytes)
    for chunk in chunks:
        asm.add(chunk)
    return asm.frame()
