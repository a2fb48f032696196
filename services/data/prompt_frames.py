"""A prompt item's wire frame without torch: the feeder's puts, byte for byte.

A ``prompts`` stream item (:func:`services.data.prompt_items.prompt_item`) is a DataProto
with no tensors: seven one-row object columns and ``meta_info``. Building it and encoding
it with :mod:`services.wire` imports torch (``services.protocol`` and the wire codec do,
at import) -- 3.5 s on a quiet machine, more while a job's trainer and reward worker
import theirs: the feeder's first put used to wait that long. :func:`prompt_frame` writes
the same frame from plain Python (the frame header is protobuf, the columns and
``meta_info`` msgpack, as :mod:`services.wire.codec` and :mod:`services.wire.plain` write
them); tests/unit/test_prompt_frames.py checks the bytes are identical to
``wire.encode(prompt_item(...))``. A row holding anything but plain Python data (a numpy
value, say) gets None: the caller encodes that one the usual way.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

#: The frame layout of services/wire/codec.py (its tests check these are the codec's own).
MAGIC = b"MRLW"
SCHEMA_VERSION = 1
ALIGN = 64
PREFIX = struct.Struct("<4sHHIQ")
EXT_TUPLE = 4  # services.wire.plain's ext code for a tuple
MAX_EXT_DEPTH = 16
MAX_INT_KEY = (1 << 61) - 2
_LEAVES = (str, int, float, bool, bytes, type(None))


class _NotPlain(Exception):
    """A value only the full codec encodes (or refuses): the caller falls back to it."""


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _check(obj: Any, depth: int = 0) -> None:
    """Plain builtin containers and leaves only, with keys the decoder takes."""
    t = type(obj)
    if t in _LEAVES:
        if t is int and not -(1 << 63) <= obj < (1 << 64):
            raise _NotPlain
        return
    if depth > 200:
        raise _NotPlain
    if t is dict:
        for k, v in obj.items():
            kt = type(k)
            if not (kt is str or kt is bytes or kt is bool or k is None
                    or (kt is int and -MAX_INT_KEY <= k <= MAX_INT_KEY)):
                raise _NotPlain
            _check(v, depth + 1)
    elif t is list or t is tuple:
        for v in obj:
            _check(v, depth + 1)
    else:
        raise _NotPlain  # numpy values, tensors, bytearray, subclasses: the full codec's business


class _Packer:
    """services.wire.plain's packer for plain builtin data (tuples are its ext type 4)."""

    def __init__(self) -> None:
        self.depth = 0

    def packb(self, obj: Any) -> bytes:
        return msgpack.packb(obj, default=self.default, strict_types=True, use_bin_type=True, datetime=False)

    def default(self, obj: Any) -> Any:
        if type(obj) is tuple:
            if self.depth >= MAX_EXT_DEPTH:
                raise _NotPlain
            self.depth += 1
            try:
                return msgpack.ExtType(EXT_TUPLE, self.packb(list(obj)))
            finally:
                self.depth -= 1
        raise _NotPlain


def _pack(obj: Any) -> bytes:
    _check(obj)
    try:
        return _Packer().packb(obj)
    except (TypeError, ValueError, OverflowError):
        raise _NotPlain from None


def frame(columns: dict[str, Any], meta_info: dict[str, Any]) -> bytes | None:
    """The frame of a one-row DataProto without tensors whose column ``name`` holds the one
    value ``columns[name]`` (an object column); None when something is not plain data."""
    from services.pb import frame_pb2

    try:
        blobs = [_pack([value]) for value in columns.values()] + [_pack(meta_info)]
    except _NotPlain:
        return None
    hdr = frame_pb2.FrameHeader()
    hdr.has_batch = False
    end = 0
    offsets = []
    for name, blob in zip(columns, blobs):
        off = _align(end)
        hdr.columns.add(name=name, encoding=frame_pb2.COLUMN_ENCODING_MSGPACK, shape=[1], numpy_dtype="",
                        offset=off, nbytes=len(blob))
        offsets.append(off)
        end = off + len(blob)
    off = _align(end)
    hdr.meta_info.offset, hdr.meta_info.nbytes = off, len(blobs[-1])
    offsets.append(off)
    hdr.data_bytes = off + len(blobs[-1])
    header = hdr.SerializeToString()
    start = _align(PREFIX.size + len(header))
    out = bytearray(start + hdr.data_bytes)
    PREFIX.pack_into(out, 0, MAGIC, SCHEMA_VERSION, 0, len(header), len(out))
    out[PREFIX.size : PREFIX.size + len(header)] = header
    for off, blob in zip(offsets, blobs):
        out[start + off : start + off + len(blob)] = blob
    return bytes(out)


def prompt_frame(row: dict[str, Any], *, uid: str, n: int, epoch: int, validate: bool = False) -> bytes | None:
    """The frame of ``prompt_item(row, uid=uid, n=n, epoch=epoch, validate=validate)``
    (services/data/prompt_items.py), or None (see module doc)."""
    columns = {
        "raw_prompt_ids": list(row["raw_prompt_ids"]),
        "uid": uid,
        "sample_id": uid,
        "data_source": row["data_source"],
        "reward_model": dict(row["reward_model"]),
        "extra_info": dict(row.get("extra_info") or {}),
        "index": int(row["index"]),
    }
    return frame(columns, {"n": n, "validate": validate, "epoch": epoch})
