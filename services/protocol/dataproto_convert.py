"""``DataProto`` conversions and descriptions.

To and from one ``TensorDict`` (``to_tensordict`` / ``from_tensordict``), the pickle state
(trusted in-process use only), a file holding one ``services.wire`` frame
(``save_to_disk`` / ``load_from_disk``), and the size / content description helpers
(``nbytes``, ``print_size``, ``get_data_info``). ``DataProto``
(:mod:`services.protocol.dataproto`) inherits :class:`ConversionMixin`.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from services.protocol.errors import require
from services.protocol.column_dicts import as_object_array
from services.wire.batches import decode_as, encode

NUMERIC_NON_TENSOR_DTYPES_KEY = "__meshrl_non_tensor_dtypes__"
"""Reserved key ``to_tensordict`` uses to remember dtypes of non-object non-tensor arrays."""


class ConversionMixin:
    """Methods of ``DataProto`` that convert, persist or describe it."""

    batch: TensorDict | None
    non_tensor_batch: dict
    meta_info: dict

    # ------------------------------------------------------------------ conversions
    def to_tensordict(self) -> TensorDict:
        """One TensorDict holding everything: tensors as they are, each non-tensor column as a
        ``NonTensorStack`` of its elements, each meta_info entry as ``NonTensorData``.

        ``from_tensordict`` inverts it exactly (numeric numpy non-tensor columns keep their
        dtype through a reserved entry).
        """
        n = len(self)
        out = TensorDict({}, batch_size=[n], device=self.batch.device if self.batch is not None else None)
        if self.batch is not None:
            out.update(self.batch)
        clash = set(out.keys()) & set(self.non_tensor_batch)
        require(not clash, f"tensor_batch and non_tensor_batch have common keys {clash}")
        dtypes: dict[str, str] = {}
        for key, val in self.non_tensor_batch.items():
            if val.dtype != object:
                dtypes[key] = val.dtype.str
            out.set(key, NonTensorStack(*[NonTensorData(x) for x in val], batch_size=[n]) if n else
                    NonTensorStack(batch_size=[0]))
        clash = set(out.keys()) & set(self.meta_info)
        require(not clash, f"meta_info keys {clash} clash with batch keys")
        for key, val in self.meta_info.items():
            out.set_non_tensor(key, val)
        if dtypes:
            out.set_non_tensor(NUMERIC_NON_TENSOR_DTYPES_KEY, dtypes)
        return out

    @classmethod
    def from_tensordict(cls, tensor_dict: TensorDict = None, meta_info: dict | None = None, num_batch_dims: int = 1):
        """Inverse of :meth:`to_tensordict`: tensors -> batch, ``NonTensorStack`` -> object
        columns, ``NonTensorData`` -> meta_info (merged into ``meta_info``)."""
        require(isinstance(tensor_dict, TensorDict), f"tensor_dict must be a TensorDict, got {type(tensor_dict)}")
        meta = dict(meta_info or {})
        tensors: dict[str, Any] = {}
        non_tensors: dict[str, np.ndarray] = {}
        dtypes: dict[str, str] = {}
        for key in list(tensor_dict.keys()):
            val = tensor_dict.get(key)
            if isinstance(val, NonTensorStack):
                non_tensors[key] = as_object_array(val.tolist())
            elif isinstance(val, NonTensorData):
                if key == NUMERIC_NON_TENSOR_DTYPES_KEY:
                    dtypes = dict(val.data)
                else:
                    meta[key] = val.data
            else:
                tensors[key] = val
        for key, dt in dtypes.items():
            if key in non_tensors:
                non_tensors[key] = non_tensors[key].astype(np.dtype(dt))
        size = tuple(tensor_dict.batch_size[:num_batch_dims])
        batch = TensorDict(tensors, batch_size=size, device=tensor_dict.device) if tensors else None
        return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)

    # ------------------------------------------------------------------ pickling / disk
    def __getstate__(self) -> dict:
        """Pickle state (trusted in-process use only, e.g. a Ray object store): plain dicts of
        tensors/arrays, never the TensorDict class internals."""
        batch = None
        if self.batch is not None:
            batch = {"tensors": self.batch.to_dict(), "batch_size": list(self.batch.batch_size),
                     "device": str(self.batch.device) if self.batch.device is not None else None}
        return {"batch": batch, "non_tensor_batch": self.non_tensor_batch, "meta_info": self.meta_info}

    def __setstate__(self, state: dict) -> None:
        batch = state.get("batch")
        if batch is not None:
            batch = TensorDict(batch["tensors"], batch_size=batch["batch_size"], device=batch["device"])
        self.batch = batch
        self.non_tensor_batch = state.get("non_tensor_batch") or {}
        self.meta_info = state.get("meta_info") or {}

    def save_to_disk(self, filepath: str | os.PathLike) -> None:
        """Write this DataProto as one ``services.wire`` frame (no pickle)."""
        frame = encode(self)
        with open(filepath, "wb") as f:
            f.write(frame)

    @classmethod
    def load_from_disk(cls, filepath: str | os.PathLike):
        """Read a file written by :meth:`save_to_disk` (validated by ``services.wire.decode``)."""
        size = os.path.getsize(filepath)
        buf = bytearray(size)
        with open(filepath, "rb") as f:
            got = f.readinto(buf)
        require(got == size, f"short read from {filepath}: {got} of {size} bytes")
        return decode_as(buf, cls, max_frame_bytes=max(size, 1))

    # ------------------------------------------------------------------ info
    def nbytes(self) -> tuple[int, int]:
        """``(tensor_bytes, numpy_bytes)``: bytes held by ``batch`` and by ``non_tensor_batch``
        arrays (object arrays count their pointer storage only, as ``ndarray.nbytes`` does)."""
        tensor_bytes = 0
        if self.batch is not None:
            for tensor in self.batch.values(include_nested=True, leaves_only=True):
                if isinstance(tensor, torch.Tensor):
                    tensor_bytes += tensor.element_size() * tensor.numel()
        return tensor_bytes, sum(int(a.nbytes) for a in self.non_tensor_batch.values())

    def print_size(self, prefix: str = "") -> str:
        """Print (and return) the tensordict and non_tensor_batch sizes in GB."""
        tensor_bytes, numpy_bytes = self.nbytes()
        message = (f"Size of tensordict: {tensor_bytes / 1024**3} GB, "
                   f"size of non_tensor_batch: {numpy_bytes / 1024**3} GB")
        if prefix:
            message = f"{prefix}, " + message
        print(message)
        return message

    def get_data_info(self) -> str:
        """Multi-line description: each tensor's shape/dtype/device, each column's shape/dtype,
        and the (nested) type of each meta_info value."""
        lines = ["batch"]
        if self.batch is not None:
            for key, tensor in self.batch.items():
                if isinstance(tensor, torch.Tensor):
                    lines.append(f"  {key}: {tuple(tensor.shape)} ({tensor.dtype}) {tensor.device}")
                else:
                    lines.append(f"  {key}: {type(tensor).__name__}")
        lines.append("non_tensor_batch")
        for key, arr in self.non_tensor_batch.items():
            lines.append(f"  {key}: ndarray{arr.shape} ({arr.dtype})")
        lines.append("meta_info")
        for key, val in self.meta_info.items():
            lines.append(f"  {key}: {_type_info(val)}")
        return "\n".join(lines)


def _type_info(value: Any) -> str:
    """Short nested type description, e.g. ``dict[str: list[int]]``."""
    if isinstance(value, list):
        kinds = sorted({_type_info(v) for v in value[:3]})
        return f"list[{'|'.join(kinds) if kinds else '...'}]"
    if isinstance(value, tuple):
        return f"tuple({', '.join(_type_info(v) for v in value)})"
    if isinstance(value, dict):
        if not value:
            return "dict"
        k, v = next(iter(value.items()))
        return f"dict[{_type_info(k)}: {_type_info(v)}]"
    if isinstance(value, np.ndarray):
        return f"ndarray{value.shape} ({value.dtype})"
    if isinstance(value, torch.Tensor):
        return f"Tensor{tuple(value.shape)} ({value.dtype})"
    return type(value).__name__
