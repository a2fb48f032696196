"""Frame codec over raw parts (no DataProto here): tensors, non-tensor columns, meta_info.

Layout (little-endian; see docs/wire.md and proto/frame.proto)::

    [0:4)   magic b"MRLW"      [4:6) u16 schema version   [6:8) u16 flags (0)
    [8:12)  u32 header length H [12:20) u64 frame length
    [20:20+H) FrameHeader (protobuf)   zero padding to a multiple of 64 = data start
    data section: tensors / columns / meta_info blob, each at a 64-aligned offset

Encoding copies each tensor once into a preallocated frame (``encode_frame``) or not at all
(``encode_frame_parts``, scatter-gather views). Decoding never copies a tensor: each is a
``torch.frombuffer`` view of the received buffer; raw numpy columns are ``np.frombuffer``
views. Every header field is validated against the buffer before it is used.
"""

from __future__ import annotations

import ctypes
import math
import struct
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from services.pb import frame_pb2
from services.wire import dtypes, plain
from services.wire.errors import WireError

MAGIC = b"MRLW"
SCHEMA_VERSION = 1
ALIGN = 64
PREFIX = struct.Struct("<4sHHIQ")
DEFAULT_MAX_FRAME_BYTES = 4 << 30  # 4 GiB
MAX_HEADER_BYTES = 16 << 20
MAX_ENTRIES = 1 << 16  # most tensors / columns one frame may describe
MAX_KEY_DEPTH = 32  # most parts in one tensor key path (nested TensorDict depth)
MAX_DIM = 1 << 48  # largest single dimension accepted (a zero-size tensor may be wide)
_MSGPACK = int(frame_pb2.COLUMN_ENCODING_MSGPACK)
_RAW = int(frame_pb2.COLUMN_ENCODING_RAW)
_UNINIT_MIN = 1 << 20  # frames this large skip the zero-fill (smaller: plain bytearray(n))
_ZEROS = memoryview(bytes(ALIGN))
_PIECE = 2 << 20  # large copies are cut into pieces of this size ...
_PARALLEL_MIN = 16 << 20  # ... and shared with helper threads when the frame holds this much

Key = tuple[str, ...]


@dataclass
class FrameParts:
    """The content of one frame.

    tensors: key path -> tensor (``("input_ids",)`` for a flat TensorDict key); every shape
        starts with ``batch_size``; any wire dtype; CPU after decoding.
    batch_size: the TensorDict batch size, or None when the DataProto has no tensor batch.
    non_tensors: column name -> numpy array (object dtype, or a plain fixed-size dtype).
    meta_info: plain-data dict.
    """

    tensors: dict[Key, torch.Tensor] = field(default_factory=dict)
    batch_size: tuple[int, ...] | None = None
    non_tensors: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _alloc_uninitialized(n: int) -> bytearray:
    """A bytearray of ``n`` bytes whose contents are NOT zeroed (CPython's documented
    ``PyByteArray_FromStringAndSize(NULL, n)``), sparing a memset pass over a large frame.
    The caller must write every byte. Falls back to ``bytearray(n)`` off CPython and for
    small frames, where the zero-fill costs less than the foreign call."""
    if n < _UNINIT_MIN:
        return bytearray(n)
    try:
        proto = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_ssize_t)
        fn = proto(("PyByteArray_FromStringAndSize", ctypes.pythonapi))
    except (AttributeError, OSError):  # not CPython
        return bytearray(n)
    out = fn(None, n)
    if not isinstance(out, bytearray) or len(out) != n:
        return bytearray(n)
    return out


def _key_name(key: Key) -> str:
    return ".".join(key)


def _prepare_tensor(key: Key, t: Any, batch_size: tuple[int, ...] | None) -> torch.Tensor:
    where = f"batch[{_key_name(key)!r}]"
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where}: expected a torch.Tensor, got {type(t).__qualname__}")
    if t.layout != torch.strided:
        raise TypeError(f"{where}: tensor layout {t.layout} cannot be sent (dense tensors only)")
    dtypes.wire_dtype(t.dtype, where)
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    if batch_size is not None and tuple(t.shape[: len(batch_size)]) != batch_size:
        raise ValueError(f"{where}: shape {tuple(t.shape)} does not start with batch size {batch_size}")
    return t


def _bytes_of_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat uint8 tensor (a view; ``t`` must be contiguous)."""
    return t.reshape(-1).view(torch.uint8)


class _Plan:
    """Where every blob goes: the header, and per-blob (offset, source) in the data section."""

    def __init__(self, parts: FrameParts) -> None:
        hdr = frame_pb2.FrameHeader()
        bs = parts.batch_size
        hdr.has_batch = bs is not None
        if bs is not None:
            bs = tuple(int(d) for d in bs)
            hdr.batch_size.extend(bs)
        elif parts.tensors:
            raise ValueError("tensors given without a batch size")
        self.tensors: list[tuple[int, torch.Tensor]] = []
        self.blobs: list[tuple[int, memoryview]] = []
        end = 0
        for key, value in parts.tensors.items():
            if not 0 < len(key) <= MAX_KEY_DEPTH or not all(isinstance(k, str) and k for k in key):
                raise TypeError(f"tensor key path {key!r}: 1 to {MAX_KEY_DEPTH} non-empty str parts required")
            t = _prepare_tensor(key, value, bs)
            n = t.numel() * t.element_size()
            off = _align(end)
            hdr.tensors.add(key=list(key), dtype=dtypes.TORCH_TO_WIRE[t.dtype], shape=list(t.shape), offset=off, nbytes=n)
            self.tensors.append((off, t))
            end = off + n
        for name, col in parts.non_tensors.items():
            where = f"non_tensor_batch[{name!r}]"
            if not isinstance(name, str) or not name:
                raise TypeError(f"{where}: column names must be non-empty str")
            if not isinstance(col, np.ndarray):
                raise TypeError(f"{where}: expected a numpy array, got {type(col).__qualname__}")
            if bs and (col.ndim == 0 or col.shape[0] != bs[0]):
                raise ValueError(f"{where}: shape {col.shape} does not match batch size {bs[0]}")
            if col.dtype == object:
                src = memoryview(plain.pack(col.reshape(-1).tolist(), where))
                enc, ds = _MSGPACK, ""
            else:
                ds = dtypes.numpy_dtype_str(col.dtype, where)
                src = memoryview(np.ascontiguousarray(col).reshape(-1).view(np.uint8))
                enc = _RAW
            off = _align(end)
            hdr.columns.add(name=name, encoding=enc, shape=list(col.shape), numpy_dtype=ds, offset=off, nbytes=src.nbytes)
            self.blobs.append((off, src))
            end = off + src.nbytes
        if not isinstance(parts.meta_info, dict):
            raise TypeError(f"meta_info: expected a dict, got {type(parts.meta_info).__qualname__}")
        meta = memoryview(plain.pack(parts.meta_info, "meta_info"))
        off = _align(end)
        hdr.meta_info.offset, hdr.meta_info.nbytes = off, meta.nbytes
        self.blobs.append((off, meta))
        hdr.data_bytes = off + meta.nbytes
        if len(hdr.tensors) > MAX_ENTRIES or len(hdr.columns) > MAX_ENTRIES:
            raise ValueError(f"a frame holds at most {MAX_ENTRIES} tensors and {MAX_ENTRIES} columns")
        header = hdr.SerializeToString()
        if len(header) > MAX_HEADER_BYTES:
            raise ValueError(f"frame header of {len(header)} bytes is over {MAX_HEADER_BYTES} (key names too long?)")
        self.data_start = _align(PREFIX.size + len(header))
        self.total = self.data_start + hdr.data_bytes
        self.head = bytearray(self.data_start)
        PREFIX.pack_into(self.head, 0, MAGIC, SCHEMA_VERSION, 0, len(header), self.total)
        self.head[PREFIX.size : PREFIX.size + len(header)] = header


def encode_frame(parts: FrameParts) -> bytearray:
    """One frame in one preallocated bytearray; each tensor's bytes are copied exactly once.

    The buffer is allocated without zero-fill; the header, every blob and every padding gap
    are written explicitly, so no byte of the frame is left uninitialized.
    """
    plan = _Plan(parts)
    out = _alloc_uninitialized(plan.total)
    out[: plan.data_start] = plan.head
    base = plan.data_start
    dst = np.frombuffer(out, dtype=np.uint8)
    items: list[tuple[int, np.ndarray]] = [(off, _bytes_of_tensor(t).numpy()) for off, t in plan.tensors]
    items += [(off, np.frombuffer(src, dtype=np.uint8)) for off, src in plan.blobs]
    items.sort(key=lambda item: item[0])
    copies: list[tuple[np.ndarray, np.ndarray]] = []
    pos = 0
    for off, src in items:
        dst[base + pos : base + off] = 0  # alignment padding
        n = src.nbytes
        for a in range(0, n, _PIECE):
            b = min(n, a + _PIECE)
            copies.append((dst[base + off + a : base + off + b], src[a:b]))
        pos = max(pos, off + n)
    _copy_all(copies, parallel=plan.total >= _PARALLEL_MIN)
    del dst, copies, items
    return out


def _copy_all(copies: list[tuple[np.ndarray, np.ndarray]], *, parallel: bool) -> None:
    """Run ``dst[...] = src`` for every pair. For large frames, helper threads (torch's
    intra-op thread count minus one, at most 3) take pieces from the same queue as the
    caller; numpy releases the GIL while copying, and a busy core simply takes fewer pieces.
    """
    helpers = max(0, min(torch.get_num_threads(), 4) - 1) if parallel and len(copies) > 1 else 0
    queue = iter(copies)  # next() on a list iterator is atomic under the GIL
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for d, s in queue:
                np.copyto(d, s)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller below
            errors.append(e)

    threads = [threading.Thread(target=work, name=f"wire-copy-{i}", daemon=True) for i in range(helpers)]
    for t in threads:
        t.start()
    work()
    for t in threads:
        t.join()  # bounded: each helper only finishes the piece it holds
    if errors:
        raise errors[0]


def encode_frame_parts(parts: FrameParts) -> list[memoryview]:
    """The same bytes as :func:`encode_frame`, as a list of views (scatter-gather).

    Contiguous CPU tensors are not copied at all: their parts view the tensors' memory, so
    the caller must not modify the tensors until the parts have been written out.
    """
    plan = _Plan(parts)
    items: list[tuple[int, memoryview]] = [(off, memoryview(_bytes_of_tensor(t).numpy())) for off, t in plan.tensors]
    items += plan.blobs
    items.sort(key=lambda item: item[0])
    out: list[memoryview] = [memoryview(plan.head)]
    pos = 0
    for off, src in items:
        if src.nbytes == 0:
            continue
        if off > pos:
            out.append(_ZEROS[: off - pos])
        out.append(src)
        pos = off + src.nbytes
    return out


# --------------------------------------------------------------------------- decoding


def decode_frame(buf: Any, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, zero_copy_readonly: bool = False) -> FrameParts:
    """Decode and validate one frame. Raises :class:`WireError` (only) on bad input.

    ``buf``: any bytes-like object. A writable buffer (bytearray, writable memoryview,
    numpy uint8 array) is viewed in place: the decoded tensors share its memory and keep it
    alive. A read-only buffer (``bytes``) is copied once into a bytearray first unless
    ``zero_copy_readonly=True`` — then the tensors view the immutable memory and the caller
    promises never to write to them (torch cannot mark tensors read-only).
    """
    try:
        return _decode(buf, max_frame_bytes, zero_copy_readonly)
    except WireError:
        raise
    except Exception as e:  # noqa: BLE001 - safety net: any other failure is still bad input
        raise WireError(f"malformed frame ({type(e).__name__}: {e})") from None


def _decode(buf: Any, max_frame_bytes: int, zero_copy_readonly: bool) -> FrameParts:
    try:
        mv = memoryview(buf)
    except TypeError:
        raise WireError(f"frame must be a bytes-like object, got {type(buf).__qualname__}") from None
    if mv.ndim != 1 or mv.itemsize != 1:
        if not mv.c_contiguous:
            raise WireError("frame buffer must be C-contiguous")
        mv = mv.cast("B")
    n = mv.nbytes
    if n > max_frame_bytes:
        raise WireError(f"frame is {n} bytes, over max_frame_bytes={max_frame_bytes}")
    if n < PREFIX.size:
        raise WireError(f"truncated frame: {n} bytes, shorter than the {PREFIX.size}-byte prefix")
    magic, version, flags, hlen, flen = PREFIX.unpack_from(mv, 0)
    if magic != MAGIC:
        raise WireError(f"bad magic {magic!r}: not a meshrl frame")
    if version != SCHEMA_VERSION:
        raise WireError(f"unsupported schema version {version} (this build reads {SCHEMA_VERSION})")
    if flags != 0:
        raise WireError(f"unknown flags {flags:#x}")
    if flen != n:
        what = "truncated frame" if flen > n else "trailing bytes after frame"
        raise WireError(f"{what}: prefix says {flen} bytes, buffer has {n}")
    if hlen > min(n - PREFIX.size, MAX_HEADER_BYTES):
        raise WireError(f"header length {hlen} exceeds the frame ({n} bytes)")
    hdr = frame_pb2.FrameHeader()
    try:
        hdr.ParseFromString(bytes(mv[PREFIX.size : PREFIX.size + hlen]))
    except Exception as e:  # noqa: BLE001 - protobuf raises DecodeError or RuntimeError
        raise WireError(f"header: not a valid FrameHeader ({e})") from None
    base = _align(PREFIX.size + hlen)
    if base + hdr.data_bytes != n:
        raise WireError(f"header: data section of {hdr.data_bytes} bytes at {base} does not end the {n}-byte frame")
    if len(hdr.tensors) > MAX_ENTRIES or len(hdr.columns) > MAX_ENTRIES:
        raise WireError(f"header: {len(hdr.tensors)} tensors / {len(hdr.columns)} columns, over the limit of {MAX_ENTRIES}")
    _check_regions(hdr)
    if mv.readonly and not zero_copy_readonly:
        mv = memoryview(bytearray(mv))

    bs: tuple[int, ...] | None = None
    if hdr.has_batch:
        bs = _shape(hdr.batch_size, "batch_size")
    elif len(hdr.batch_size) or len(hdr.tensors):
        raise WireError("header: batch_size/tensors present but has_batch is false")
    parts = FrameParts(batch_size=bs)
    inner: set[Key] = set()  # every proper prefix of a key seen so far (nested TensorDicts)
    for i, e in enumerate(hdr.tensors):
        key = _tensor_key(tuple(e.key), i, parts.tensors, inner)
        parts.tensors[key] = _tensor(mv, base, e, bs, mv.readonly)
    for e in hdr.columns:
        where = f"column {e.name!r}"
        if not e.name or e.name in parts.non_tensors:
            raise WireError(f"{where}: empty or duplicate column name")
        parts.non_tensors[e.name] = _column(mv, base, e, bs, where)
    meta = plain.unpack(mv[base + hdr.meta_info.offset : base + hdr.meta_info.offset + hdr.meta_info.nbytes], "meta_info")
    if not isinstance(meta, dict):
        raise WireError(f"meta_info: expected a map, got {type(meta).__qualname__}")
    parts.meta_info = meta
    return parts


def _check_regions(hdr: frame_pb2.FrameHeader) -> None:
    """Every blob lies inside the data section, 64-aligned, and no two overlap."""
    regions: list[tuple[int, int, Any]] = [(e.offset, e.nbytes, e) for e in hdr.tensors]
    regions += [(e.offset, e.nbytes, e) for e in hdr.columns]
    regions.append((hdr.meta_info.offset, hdr.meta_info.nbytes, None))
    limit = hdr.data_bytes
    for off, nbytes, entry in regions:
        if off % ALIGN:
            raise WireError(f"{_what(entry)}: offset {off} is not {ALIGN}-byte aligned")
        if off + nbytes > limit:
            raise WireError(f"{_what(entry)}: bytes [{off}, {off + nbytes}) run past the {limit}-byte data section")
    spans = sorted((off, off + nb, i) for i, (off, nb, _) in enumerate(regions) if nb)
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise WireError(f"{_what(regions[b][2])}: bytes overlap those of {_what(regions[a][2])}")


def _what(entry: Any) -> str:
    """Name a header entry in an error message."""
    if entry is None:
        return "meta_info"
    if isinstance(entry, frame_pb2.TensorEntry):
        return f"tensor {_key_name(tuple(entry.key))!r}"
    return f"column {entry.name!r}"


def _shape(dims: Any, where: str) -> tuple[int, ...]:
    if len(dims) > plain.MAX_NDIM:
        raise WireError(f"{where}: {len(dims)} dimensions, more than {plain.MAX_NDIM}")
    shape = tuple(int(d) for d in dims)
    if any(d > MAX_DIM for d in shape):
        raise WireError(f"{where}: dimension over {MAX_DIM} in {shape}")
    return shape


def _tensor_key(key: Key, i: int, seen: dict[Key, torch.Tensor], inner: set[Key]) -> Key:
    """Validate a key path: non-empty parts, not equal to, inside, or above another key."""
    if not 0 < len(key) <= MAX_KEY_DEPTH:
        raise WireError(f"tensor #{i}: key path has {len(key)} parts (1 to {MAX_KEY_DEPTH} allowed)")
    if not all(key):
        raise WireError(f"tensor #{i}: key path {key!r} has an empty part")
    prefixes = [key[:j] for j in range(1, len(key))]
    if key in seen or key in inner or any(p in seen for p in prefixes):
        raise WireError(f"tensor {_key_name(key)!r}: key collides with another tensor's key path")
    inner.update(prefixes)
    return key


def _tensor(mv: memoryview, base: int, e: frame_pb2.TensorEntry, bs: tuple[int, ...] | None, readonly: bool) -> torch.Tensor:
    where = f"tensor {_key_name(tuple(e.key))!r}"
    dt = dtypes.torch_dtype(e.dtype, where)
    shape = _shape(e.shape, where)
    if bs is not None and shape[: len(bs)] != bs:
        raise WireError(f"{where}: shape {shape} does not start with batch size {bs}")
    count = math.prod(shape)
    if count * dt.itemsize != e.nbytes:
        raise WireError(f"{where}: shape {shape} of {dt} needs {count * dt.itemsize} bytes, header says {e.nbytes}")
    if count == 0:
        return torch.empty(shape, dtype=dt)
    if readonly:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # zero_copy_readonly: documented caveat
            t = torch.frombuffer(mv, dtype=dt, count=count, offset=base + e.offset)
    else:
        t = torch.frombuffer(mv, dtype=dt, count=count, offset=base + e.offset)
    if t.data_ptr() % dt.itemsize:  # buffer itself misaligned in memory: copy this one
        t = t.clone()
    return t.view(shape)


def _column(mv: memoryview, base: int, e: frame_pb2.ColumnEntry, bs: tuple[int, ...] | None, where: str) -> np.ndarray:
    shape = _shape(e.shape, where)
    if bs and (not shape or shape[0] != bs[0]):
        raise WireError(f"{where}: shape {shape} does not match batch size {bs[0]}")
    count = math.prod(shape)
    start, stop = base + e.offset, base + e.offset + e.nbytes
    if e.encoding == _RAW:
        dt = dtypes.numpy_dtype(e.numpy_dtype, where)
        if count * dt.itemsize != e.nbytes:
            raise WireError(f"{where}: shape {shape} of {dt.str} needs {count * dt.itemsize} bytes, header says {e.nbytes}")
        if count == 0:
            return np.empty(shape, dtype=dt)
        return np.frombuffer(mv, dtype=dt, count=count, offset=start).reshape(shape)
    if e.encoding == _MSGPACK:
        if e.numpy_dtype:
            raise WireError(f"{where}: msgpack column must not name a numpy dtype")
        items = plain.unpack(mv[start:stop], where)
        if not isinstance(items, list) or len(items) != count:
            raise WireError(f"{where}: expected {count} elements for shape {shape}")
        return plain.object_array(items, shape)
    raise WireError(f"{where}: unknown column encoding {e.encoding}")
