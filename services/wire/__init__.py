"""meshrl's wire format: one DataProto <-> one frame of bytes, safely and without copies.

Public API (see docs/contracts.md and docs/wire.md)::

    encode(data) -> bytearray                     # header + 64-aligned raw tensor bytes
    encode_parts(data) -> list[memoryview]        # the same bytes, scatter-gather, no join copy
    decode(buf, *, max_frame_bytes=DEFAULT_MAX_FRAME_BYTES, cls=None, zero_copy_readonly=False)
    WireError                                     # the one exception decode raises on bad input
    iter_chunks(frame, chunk_bytes) / join_chunks(chunks, max_frame_bytes=...) / ChunkAssembler

Tensors travel raw; non-tensor columns and meta_info travel as plain data (msgpack with
strict ext types) — never pickle. ``decode`` returns tensors that view ``buf``.
"""

from __future__ import annotations

from typing import Any

from services.wire.batches import decode_as, encode, encode_parts, to_parts
from services.wire.chunks import DEFAULT_CHUNK_BYTES, ChunkAssembler, iter_chunks, join_chunks
from services.wire.codec import DEFAULT_MAX_FRAME_BYTES, SCHEMA_VERSION, FrameParts
from services.wire.errors import WireError

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_MAX_FRAME_BYTES",
    "SCHEMA_VERSION",
    "ChunkAssembler",
    "FrameParts",
    "WireError",
    "decode",
    "encode",
    "encode_parts",
    "iter_chunks",
    "join_chunks",
    "to_parts",
]


def decode(buf: Any, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, cls: type | None = None, zero_copy_readonly: bool = False) -> Any:
    """Decode one frame into ``cls`` (default :class:`services.protocol.DataProto`).

    Zero-copy: tensors (and raw numpy columns) view ``buf`` when it is writable
    (bytearray, writable memoryview). A read-only ``bytes`` buffer is copied once first,
    unless ``zero_copy_readonly=True`` (then the caller must never write to the tensors).
    Raises :class:`WireError` — and nothing else — for any malformed, truncated, oversized
    or inconsistent frame, with a message naming the field.

    The default class is imported on first use, not with this package: ``services.protocol``
    stores and gathers its batches through this package's codec (:mod:`.batches`), so the
    package must be importable before ``DataProto`` exists.
    """
    if cls is None:
        from services.protocol.dataproto import DataProto as cls  # noqa: N813 - the default, see above
    return decode_as(buf, cls, max_frame_bytes=max_frame_bytes, zero_copy_readonly=zero_copy_readonly)
