"""Element-type tables: torch dtypes <-> ``meshrl.v1.DType``, and the numpy dtypes that may
travel raw (fixed-size plain data, never object)."""

from __future__ import annotations

import re

import numpy as np
import torch

from services.pb import frame_pb2
from services.wire.errors import WireError

_D = frame_pb2.DType

#: torch dtype -> wire enum value. Every dtype here round-trips bit-exactly.
TORCH_TO_WIRE: dict[torch.dtype, int] = {
    torch.float32: _D.DTYPE_FLOAT32,
    torch.float64: _D.DTYPE_FLOAT64,
    torch.float16: _D.DTYPE_FLOAT16,
    torch.bfloat16: _D.DTYPE_BFLOAT16,
    torch.int8: _D.DTYPE_INT8,
    torch.int16: _D.DTYPE_INT16,
    torch.int32: _D.DTYPE_INT32,
    torch.int64: _D.DTYPE_INT64,
    torch.uint8: _D.DTYPE_UINT8,
    torch.bool: _D.DTYPE_BOOL,
    torch.complex64: _D.DTYPE_COMPLEX64,
    torch.complex128: _D.DTYPE_COMPLEX128,
    torch.uint16: _D.DTYPE_UINT16,
    torch.uint32: _D.DTYPE_UINT32,
    torch.uint64: _D.DTYPE_UINT64,
    torch.float8_e4m3fn: _D.DTYPE_FLOAT8_E4M3FN,
    torch.float8_e5m2: _D.DTYPE_FLOAT8_E5M2,
    torch.float8_e4m3fnuz: _D.DTYPE_FLOAT8_E4M3FNUZ,
    torch.float8_e5m2fnuz: _D.DTYPE_FLOAT8_E5M2FNUZ,
    torch.float8_e8m0fnu: _D.DTYPE_FLOAT8_E8M0FNU,
    torch.float4_e2m1fn_x2: _D.DTYPE_FLOAT4_E2M1FN_X2,
}
#: wire enum value -> torch dtype.
WIRE_TO_TORCH: dict[int, torch.dtype] = {v: k for k, v in TORCH_TO_WIRE.items()}

#: torch dtype name (e.g. "bfloat16") <-> dtype, for tensors nested in plain data.
TORCH_BY_NAME: dict[str, torch.dtype] = {str(d).removeprefix("torch."): d for d in TORCH_TO_WIRE}

_NUMPY_DTYPE_RE = re.compile(r"^[<>|=]?([biufcUS])(\d{1,6})$")
_NUMERIC_SIZES = {"b": {1}, "i": {1, 2, 4, 8}, "u": {1, 2, 4, 8}, "f": {2, 4, 8}, "c": {8, 16}}
_MAX_CHARS = 1 << 20  # longest fixed-width numpy string accepted ("<U1048576")


def wire_dtype(dtype: torch.dtype, where: str) -> int:
    """The wire enum value of a torch dtype; TypeError naming ``where`` if unsupported."""
    try:
        return TORCH_TO_WIRE[dtype]
    except KeyError:
        raise TypeError(f"{where}: tensor dtype {dtype} cannot be sent over the wire") from None


def torch_dtype(value: int, where: str) -> torch.dtype:
    """The torch dtype of a wire enum value; WireError naming ``where`` if unknown."""
    try:
        return WIRE_TO_TORCH[value]
    except KeyError:
        raise WireError(f"{where}: unknown dtype code {value}") from None


def numpy_dtype_str(dtype: np.dtype, where: str, *, strings: bool = True) -> str:
    """The string naming a plain, fixed-size numpy dtype (e.g. "<i8"); TypeError otherwise.

    ``strings`` allows fixed-width unicode/bytes dtypes ("U"/"S") besides numbers.
    """
    s = dtype.str
    if dtype.fields is not None or dtype.subdtype is not None or not _is_plain(s, strings):
        raise TypeError(f"{where}: numpy dtype {dtype!r} cannot be sent over the wire")
    return s


def numpy_dtype(s: str, where: str, *, strings: bool = True) -> np.dtype:
    """Parse a dtype string received from the network, allowing only plain fixed-size dtypes
    (never object, structured or datetime). WireError naming ``where`` otherwise."""
    if not isinstance(s, str) or not _is_plain(s, strings):
        raise WireError(f"{where}: numpy dtype {s!r} is not an allowed plain dtype")
    return np.dtype(s)


def _is_plain(s: str, strings: bool) -> bool:
    m = _NUMPY_DTYPE_RE.match(s)
    if m is None:
        return False
    kind, size = m.group(1), int(m.group(2))
    if kind in _NUMERIC_SIZES:
        return size in _NUMERIC_SIZES[kind]
    if not strings:
        return False
    return 0 < size <= _MAX_CHARS  # "U" counts characters, "S" bytes
