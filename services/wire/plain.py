"""Plain-data codec for non-tensor columns and meta_info: msgpack with a few strict ext types.

Accepted values (recursively): ``None``, ``bool``, ``int`` (64-bit range), ``float``,
``str``, ``bytes``/``bytearray`` (decoded as ``bytes``), ``list``, ``tuple`` (kept a tuple),
``dict`` (keys: str, bytes, bool, None or int within +-(2**61 - 2) — hash-safe types; dict
subclasses are sent as ``dict``), numpy arrays
and scalars of plain fixed-size dtypes, numpy object arrays of plain data, and CPU-copyable
torch tensors of a wire dtype. Anything else raises :class:`TypeError` naming where it was
found. Decoding never runs code: the ext types below are the only ones recognised and each
is validated (dtype allowlist, shape product vs byte length).

msgpack ext codes (payload is itself msgpack):

====  ======================  ============================================
code  value                   payload
====  ======================  ============================================
1     numpy array (plain)     ``[dtype_str, shape, raw C-order bytes]``
2     numpy scalar (plain)    ``[dtype_str, raw bytes]``
3     numpy object array      ``[shape, flat list of elements (C order)]``
4     tuple                   ``[elements...]``
5     torch tensor            ``[dtype_name, shape, raw C-order bytes]``
====  ======================  ============================================
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np
import torch

from services.wire import dtypes
from services.wire.errors import WireError

EXT_NDARRAY, EXT_NPSCALAR, EXT_OBJARRAY, EXT_TUPLE, EXT_TENSOR = 1, 2, 3, 4, 5
MAX_NDIM = 64
_PACK_ERRORS = (TypeError, ValueError, OverflowError)


MAX_EXT_DEPTH = 16  # tuples / object arrays nested in each other, at most this deep
MAX_INT_KEY = (1 << 61) - 2  # larger ints share hashes (mod 2**61 - 1) with smaller ones


class _Packer:
    """One encode call: msgpack with the ext hook below, counting ext nesting depth (nested
    ext payloads are packed by recursive calls, so the depth bounds the C stack)."""

    def __init__(self) -> None:
        self.depth = 0

    def packb(self, obj: Any) -> bytes:
        return msgpack.packb(obj, default=self.default, strict_types=True, use_bin_type=True, datetime=False)

    def nested(self, code: int, obj: Any) -> msgpack.ExtType:
        if self.depth >= MAX_EXT_DEPTH:
            raise ValueError(f"tuples/object arrays nested more than {MAX_EXT_DEPTH} deep")
        self.depth += 1
        try:
            return msgpack.ExtType(code, self.packb(obj))
        finally:
            self.depth -= 1

    def default(self, obj: Any) -> Any:
        """msgpack hook for every value that is not an exact builtin type."""
        if isinstance(obj, tuple):
            return self.nested(EXT_TUPLE, list(obj))
        if isinstance(obj, np.ndarray):
            if obj.dtype == object:
                return self.nested(EXT_OBJARRAY, [list(obj.shape), obj.reshape(-1).tolist()])
            ds = dtypes.numpy_dtype_str(obj.dtype, "numpy array")
            raw = np.ascontiguousarray(obj).tobytes()
            return self.nested(EXT_NDARRAY, [ds, list(obj.shape), raw])
        if isinstance(obj, np.generic):
            ds = dtypes.numpy_dtype_str(obj.dtype, "numpy scalar")
            return self.nested(EXT_NPSCALAR, [ds, obj.tobytes()])
        if isinstance(obj, torch.Tensor):
            if obj.layout != torch.strided:
                raise TypeError(f"tensor layout {obj.layout} is not supported")
            dtypes.wire_dtype(obj.dtype, "tensor")
            t = obj.detach().cpu().resolve_conj().resolve_neg().contiguous()
            raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
            return self.nested(EXT_TENSOR, [str(t.dtype).removeprefix("torch."), list(t.shape), raw])
        if isinstance(obj, dict):
            return dict(obj)
        if isinstance(obj, list):
            return list(obj)
        if isinstance(obj, bytearray):
            return bytes(obj)
        raise TypeError(f"type {type(obj).__module__}.{type(obj).__qualname__} is not plain data")


def pack(obj: Any, where: str) -> bytes:
    """msgpack-encode plain data. TypeError naming ``where`` and the offending path/type."""
    _check_keys(obj, where, 0)
    try:
        return _Packer().packb(obj)
    except _PACK_ERRORS as e:
        path, problem = _locate(obj, where, 0)
        raise TypeError(f"{path}: {problem or e} (only plain data is sent; never pickle)") from e


_LEAF_TYPES = frozenset({str, int, float, bool, bytes, bytearray, type(None)})


def key_allowed(k: Any) -> bool:
    """True for a hash-safe dict key: str, bytes, bool, None or an int within +-MAX_INT_KEY
    (str/bytes hashes are randomized and small ints hash to themselves, so no crafted set of
    such keys can collide; floats, tuples and huge ints can, forcing quadratic dict builds)."""
    t = type(k)
    if t is str or t is bytes or t is bool or k is None:
        return True
    return t is int and -MAX_INT_KEY <= k <= MAX_INT_KEY


def _check_keys(obj: Any, path: str, depth: int) -> None:
    """Refuse dict keys the decoder would refuse (see :func:`key_allowed`), naming the path.
    Containers holding only scalars are skipped in C (``set(map(type, ...))``)."""
    t = type(obj)
    if t in _LEAF_TYPES or depth > 200:  # too deep: the packer itself refuses it
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not key_allowed(k):
                raise TypeError(
                    f"{path}: dict key {k!r} of type {type(k).__qualname__} is not allowed "
                    f"(keys must be str, bytes, bool, None or an int within +-(2**61 - 2))"
                )
            if type(v) not in _LEAF_TYPES:
                _check_keys(v, f"{path}[{k!r}]", depth + 1)
    elif isinstance(obj, (list, tuple)) or (isinstance(obj, np.ndarray) and obj.dtype == object):
        items = obj.reshape(-1).tolist() if isinstance(obj, np.ndarray) else obj
        if set(map(type, items)) <= _LEAF_TYPES:
            return
        for i, v in enumerate(items):
            if type(v) not in _LEAF_TYPES:
                _check_keys(v, f"{path}[{i}]", depth + 1)


def _locate(obj: Any, path: str, depth: int, ext_depth: int = 0) -> tuple[str, str | None]:
    """Find the first value under ``obj`` that cannot be packed: (path, problem)."""
    if depth > 200:
        return path, "nested too deeply (or contains itself)"
    if isinstance(obj, tuple) or (isinstance(obj, np.ndarray) and obj.dtype == object):
        ext_depth += 1
        if ext_depth > MAX_EXT_DEPTH:
            return path, f"tuples/object arrays nested more than {MAX_EXT_DEPTH} deep"
    t = type(obj)
    if obj is None or t in (bool, float, bytes, bytearray):
        return path, None
    if t is int:
        ok = -(1 << 63) <= obj < (1 << 64)
        return path, None if ok else f"int {obj} is out of the 64-bit range"
    if t is str:
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError as e:
            return path, f"str is not valid UTF-8 ({e.reason})"
        return path, None
    if isinstance(obj, (list, tuple)) or (isinstance(obj, np.ndarray) and obj.dtype == object):
        items = obj.reshape(-1).tolist() if isinstance(obj, np.ndarray) else obj
        for i, v in enumerate(items):
            p, prob = _locate(v, f"{path}[{i}]", depth + 1, ext_depth)
            if prob:
                return p, prob
        return path, None
    if isinstance(obj, dict):
        for k, v in obj.items():
            p, prob = _locate(k, f"{path} key {k!r}", depth + 1, ext_depth)
            if prob:
                return p, prob
            p, prob = _locate(v, f"{path}[{k!r}]", depth + 1, ext_depth)
            if prob:
                return p, prob
        return path, None
    try:
        _Packer().default(obj)
    except _PACK_ERRORS as e:
        return path, str(e)
    return path, None


def unpack(buf: Any, where: str) -> Any:
    """Decode msgpack produced by :func:`pack`. WireError naming ``where`` on any problem.

    Container/string lengths are bounded by the buffer size (msgpack's defaults for
    ``unpackb``), so a small buffer can never claim a huge allocation; ext payloads nest at
    most ``MAX_EXT_DEPTH`` deep (each level is a recursive unpack on the C stack).
    """
    return _Unpacker().unpack(buf, where)


class _Unpacker:
    """One decode call: validates every ext payload and counts ext nesting depth."""

    def __init__(self) -> None:
        self.depth = 0

    def unpack(self, buf: Any, where: str) -> Any:
        try:
            return msgpack.unpackb(
                buf, ext_hook=self.ext_hook, object_pairs_hook=_make_dict, strict_map_key=False, raw=False, use_list=True
            )
        except WireError as e:
            raise WireError(f"{where}: {e}") from None
        except Exception as e:  # noqa: BLE001 - any malformed input becomes the documented error
            raise WireError(f"{where}: malformed msgpack ({type(e).__name__}: {e})") from None

    def fields(self, data: bytes, n: int, what: str) -> list[Any]:
        value = self.unpack(data, what)
        if not isinstance(value, list) or len(value) != n:
            raise WireError(f"{what}: payload must be a {n}-element array")
        return value

    def ext_hook(self, code: int, data: bytes) -> Any:
        if self.depth >= MAX_EXT_DEPTH:
            raise WireError(f"ext values nested more than {MAX_EXT_DEPTH} deep")
        self.depth += 1
        try:
            return self._ext(code, data)
        finally:
            self.depth -= 1

    def _ext(self, code: int, data: bytes) -> Any:
        if code == EXT_TUPLE:
            value = self.unpack(data, "tuple")
            if not isinstance(value, list):
                raise WireError("tuple: payload is not an array")
            return tuple(value)
        if code == EXT_NDARRAY:
            ds, shape, raw = self.fields(data, 3, "numpy array")
            dt = dtypes.numpy_dtype(ds, "numpy array")
            shape = _shape(shape, "numpy array")
            count = math.prod(shape)
            _raw_view(raw, count, dt.itemsize, "numpy array")
            return np.frombuffer(raw, dtype=dt, count=count).reshape(shape).copy()
        if code == EXT_NPSCALAR:
            ds, raw = self.fields(data, 2, "numpy scalar")
            dt = dtypes.numpy_dtype(ds, "numpy scalar")
            _raw_view(raw, 1, dt.itemsize, "numpy scalar")
            return np.frombuffer(raw, dtype=dt, count=1)[0].copy()
        if code == EXT_OBJARRAY:
            shape, items = self.fields(data, 2, "numpy object array")
            shape = _shape(shape, "numpy object array")
            if not isinstance(items, list) or len(items) != math.prod(shape):
                raise WireError(f"numpy object array: element count does not match shape {shape}")
            return object_array(items, shape)
        if code == EXT_TENSOR:
            name, shape, raw = self.fields(data, 3, "tensor")
            dt = dtypes.TORCH_BY_NAME.get(name) if isinstance(name, str) else None
            if dt is None:
                raise WireError(f"tensor: unknown dtype {name!r}")
            shape = _shape(shape, "tensor")
            count = math.prod(shape)
            _raw_view(raw, count, dt.itemsize, "tensor")
            if count == 0:
                return torch.empty(shape, dtype=dt)
            return torch.frombuffer(bytearray(raw), dtype=dt, count=count).reshape(shape)
        raise WireError(f"unknown msgpack ext type {code}")


def _make_dict(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """Build a decoded map, allowing only hash-safe keys (:func:`key_allowed`)."""
    for k, _ in pairs:
        if not key_allowed(k):
            raise WireError(f"map key {k!r} of type {type(k).__name__} not allowed (str, bytes, int, bool or None)")
    return dict(pairs)


def _shape(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > MAX_NDIM:
        raise WireError(f"{what}: shape must be a list of at most {MAX_NDIM} ints")
    if not all(type(d) is int and 0 <= d <= 1 << 48 for d in value):
        raise WireError(f"{what}: shape {value!r} has a negative, huge or non-int dimension")
    return tuple(value)


def _raw_view(raw: Any, count: int, itemsize: int, what: str) -> None:
    if not isinstance(raw, bytes) or count * itemsize != len(raw):
        raise WireError(f"{what}: {count} elements of {itemsize} bytes do not match {len(raw) if isinstance(raw, bytes) else '?'} data bytes")


def object_array(items: list[Any], shape: tuple[int, ...]) -> np.ndarray:
    """A numpy object array of ``shape`` holding ``items`` (C order) as they are — a list
    element stays one element, never broadcast into a new dimension."""
    out = np.fromiter(items, dtype=object, count=len(items))
    return out.reshape(shape)
