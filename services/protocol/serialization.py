"""Tensor <-> raw-bytes helpers with verl's names (used for in-process/IPC hand-offs).

``serialize_single_tensor(t) -> (dtype_name, shape, data)`` where ``data`` is a flat
``numpy.uint8`` array viewing ``t``'s bytes (contiguous CPU copy when needed);
``deserialize_single_tensor((dtype_name, shape, data))`` rebuilds the tensor over ``data``'s
buffer (no copy).  ``serialize_tensordict(td) -> (batch_size, device, items)`` applies it to
every entry; nested (ragged) tensors become ``(layout_name, [per-row triples])``.

No pickle is involved, but the result is Python objects, not a wire frame: use
``services.wire`` for bytes that cross the network.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from services.protocol.errors import DataProtoError, require

SerializedTensor = tuple[str, tuple[int, ...], np.ndarray]
"""``(dtype name without "torch.", shape, flat uint8 bytes)``."""


def _dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise DataProtoError(f"unknown torch dtype {name!r}")
    return dtype


def serialize_single_tensor(obj: torch.Tensor) -> SerializedTensor:
    """Describe a dense tensor as ``(dtype_name, shape, uint8 bytes)``; the bytes view a
    contiguous CPU version of ``obj`` (a copy only if ``obj`` was not already one)."""
    require(isinstance(obj, torch.Tensor) and not obj.is_nested, f"expected a dense tensor, got {type(obj)}")
    flat = obj.detach().cpu().contiguous().reshape(-1)
    data = flat.view(torch.uint8).numpy() if flat.numel() else np.zeros(0, dtype=np.uint8)
    return str(obj.dtype).removeprefix("torch."), tuple(obj.shape), data


def deserialize_single_tensor(arg: tuple[str, tuple[int, ...], Any]) -> torch.Tensor:
    """Inverse of :func:`serialize_single_tensor`; ``data`` may be any bytes-like object.

    Raises :class:`DataProtoError` if the byte count does not match dtype and shape.
    """
    dtype_name, shape, data = arg
    dtype = _dtype_from_name(dtype_name)
    shape = tuple(int(s) for s in shape)
    buf = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
    require(buf.size == numel * itemsize,
            f"tensor of dtype {dtype_name} and shape {shape} needs {numel * itemsize} bytes, got {buf.size}")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    raw = torch.from_numpy(buf) if buf.flags.writeable else torch.frombuffer(bytearray(buf), dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


def serialize_tensordict(batch: TensorDict) -> tuple[tuple[int, ...], str | None, dict[str, Any]]:
    """``(batch_size, device or None, {key: serialized})`` for every leaf of ``batch``.

    Dense entries are :data:`SerializedTensor`; nested tensors are
    ``(layout_name, [SerializedTensor per component])``.  Entries of sub-TensorDicts are
    keyed by their key tuple, e.g. ``("obs", "pixels")``.
    """
    require(isinstance(batch, TensorDict), f"expected a TensorDict, got {type(batch)}")
    items: dict[str, Any] = {}
    for key, val in batch.items(include_nested=True, leaves_only=True):
        name = key if not isinstance(key, tuple) or len(key) > 1 else key[0]
        require(isinstance(val, torch.Tensor), f"entry {name!r} is not a tensor ({type(val)})")
        if val.is_nested:
            items[name] = (str(val.layout).removeprefix("torch."), [serialize_single_tensor(t) for t in val.unbind()])
        else:
            items[name] = serialize_single_tensor(val)
    device = str(batch.device) if batch.device is not None else None
    return tuple(batch.batch_size), device, items


def deserialize_tensordict(arg: tuple[tuple[int, ...], str | None, dict[str, Any]]) -> TensorDict:
    """Inverse of :func:`serialize_tensordict`."""
    batch_size, device, items = arg
    out = TensorDict({}, batch_size=tuple(batch_size), device=device)
    for name, enc in items.items():
        if len(enc) == 2:
            layout_name, parts = enc
            layout = getattr(torch, layout_name, None)
            require(isinstance(layout, torch.layout), f"unknown tensor layout {layout_name!r}")
            tensor = torch.nested.as_nested_tensor([deserialize_single_tensor(p) for p in parts], layout=layout)
        else:
            tensor = deserialize_single_tensor(enc)
        out.set(name, tensor.to(device) if device is not None else tensor)
    return out
