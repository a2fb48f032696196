"""Snapshots: a published version as one safetensors file, written and parsed here.

Writing: the publisher hands over the buckets of a version (CPU ``uint8`` buffers); the
file is ``u64 header length | JSON header | tensor bytes`` (the safetensors layout, readable
by ``safetensors.torch.load_file``), written to a temporary name and renamed, so readers
only ever see complete files. The version is stored in ``__metadata__["meshrl_version"]``.

Parsing: ``parse_safetensors(buf)`` validates a received byte buffer (header bounds, dtype,
shape vs. byte range, ranges in order without holes or overlap) and returns zero-copy
views (``torch.frombuffer``); any violation raises ``SnapshotError`` naming the problem.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from services.weights.errors import SnapshotError
from services.weights.plan import DTYPES, Bucket, iter_tensors

ST_DTYPES: dict[str, str] = {
    "float32": "F32",
    "float64": "F64",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}
"""Our dtype names -> safetensors dtype codes."""

ST_TO_NAME = {v: k for k, v in ST_DTYPES.items()}
MAX_HEADER_BYTES = 100 << 20
VERSION_KEY = "meshrl_version"


def build_header(version: int, buckets: Sequence[Bucket]) -> bytes:
    """The safetensors prefix (length + JSON, space-padded to 8 bytes) for ``buckets``."""
    header: dict[str, object] = {"__metadata__": {VERSION_KEY: str(version)}}
    pos = 0
    for b in buckets:
        for s in b.specs:
            if s.piece_offset == 0:  # a split tensor's pieces follow each other: one entry
                header[s.name] = {"dtype": ST_DTYPES[s.dtype], "shape": list(s.shape),
                                  "data_offsets": [pos, pos + s.whole_nbytes]}
            pos += s.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def write_snapshot(path: Path, version: int, buckets: Sequence[Bucket]) -> int:
    """Write ``buckets`` (CPU buffers) as a safetensors file at ``path`` atomically; return its size."""
    tmp = path.with_name(path.name + ".tmp")
    size = 0
    with open(tmp, "wb") as f:
        head = build_header(version, buckets)
        f.write(head)
        size += len(head)
        for b in buckets:
            if b.buffer is None:
                raise SnapshotError(f"bucket {b.index} has no buffer")
            for s in b.specs:
                if s.nbytes:
                    mv = memoryview(b.buffer[s.offset : s.offset + s.nbytes].numpy())
                    f.write(mv)
                    size += s.nbytes
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return size


def parse_safetensors(buf: bytearray | memoryview) -> tuple[int | None, list[tuple[str, torch.Tensor]]]:
    """Validate a safetensors byte buffer; return ``(meshrl version or None, [(name, tensor)])``.

    Tensors are views of ``buf`` in file order (pass a ``bytearray`` to get writable ones).
    """
    mv = memoryview(buf).cast("B")
    if len(mv) < 8:
        raise SnapshotError(f"snapshot too short: {len(mv)} bytes")
    (hlen,) = struct.unpack_from("<Q", mv, 0)
    if hlen > MAX_HEADER_BYTES or 8 + hlen > len(mv):
        raise SnapshotError(f"snapshot header length {hlen} does not fit the {len(mv)}-byte buffer")
    try:
        header = json.loads(bytes(mv[8 : 8 + hlen]).decode())
    except (UnicodeDecodeError, ValueError) as e:
        raise SnapshotError(f"snapshot header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise SnapshotError("snapshot header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    version = None
    if isinstance(meta, dict) and VERSION_KEY in meta:
        try:
            version = int(meta[VERSION_KEY])
        except (TypeError, ValueError):
            raise SnapshotError(f"snapshot metadata {VERSION_KEY}={meta[VERSION_KEY]!r} is not an int") from None
    data = mv[8 + hlen :]
    entries = []
    for name, e in header.items():
        if not isinstance(e, dict) or not {"dtype", "shape", "data_offsets"} <= e.keys():
            raise SnapshotError(f"snapshot entry {name!r} lacks dtype/shape/data_offsets")
        if e["dtype"] not in ST_TO_NAME:
            raise SnapshotError(f"snapshot entry {name!r}: unsupported dtype {e['dtype']!r}")
        shape, offs = e["shape"], e["data_offsets"]
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise SnapshotError(f"snapshot entry {name!r}: bad shape {shape!r}")
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)):
            raise SnapshotError(f"snapshot entry {name!r}: bad data_offsets {offs!r}")
        entries.append((offs[0], offs[1], name, ST_TO_NAME[e["dtype"]], tuple(shape)))
    entries.sort(key=lambda x: (x[0], x[1]))
    pos = 0
    out: list[tuple[str, torch.Tensor]] = []
    for start, end, name, dt, shape in entries:
        if start != pos or end < start:
            raise SnapshotError(f"snapshot entry {name!r}: byte range [{start}, {end}) leaves a hole or overlaps at {pos}")
        nbytes = math.prod(shape) * DTYPES[dt].itemsize
        if end - start != nbytes:
            raise SnapshotError(f"snapshot entry {name!r}: {end - start} bytes for shape {shape} of {dt} ({nbytes})")
        if end > len(data):
            raise SnapshotError(f"snapshot entry {name!r} ends at {end}, past the {len(data)}-byte data section")
        pos = end
        out.append((name, _view(data, start, end, dt, shape)))
    if pos != len(data):
        raise SnapshotError(f"snapshot data section has {len(data)} bytes, the header covers {pos}")
    return version, out


def _view(data: memoryview, start: int, end: int, dt: str, shape: tuple[int, ...]) -> torch.Tensor:
    dtype = DTYPES[dt]
    if end == start:
        return torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(data, dtype=torch.uint8, count=end - start, offset=start)
    if start % dtype.itemsize:  # unaligned in the file: copy into an aligned buffer
        raw = raw.clone()
    return raw.view(dtype).view(shape)


def iter_file_chunks(path: Path, chunk_bytes: int) -> Iterator[tuple[int, int, bytes]]:
    """Yield ``(total_bytes, offset, data)`` chunks of the file at ``path`` (opened once)."""
    with open(path, "rb") as f:
        total = os.fstat(f.fileno()).st_size
        offset = 0
        while offset < total:
            data = f.read(min(chunk_bytes, total - offset))
            if not data:
                raise SnapshotError(f"snapshot {path} shrank while being read")
            yield total, offset, data
            offset += len(data)


def bucket_tensors(buckets: Sequence[Bucket]) -> Iterator[tuple[str, torch.Tensor]]:
    """All ``(name, tensor)`` of ``buckets`` in order (split tensors reassembled)."""
    return iter_tensors(buckets)
