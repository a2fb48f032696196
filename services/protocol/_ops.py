"""Row-expanding operations, iteration, conversion, persistence and info helpers of DataProto.

Kept apart from ``dataproto.py`` to keep modules small; ``DataProto`` inherits this mixin.
Every method here works on ``self.batch`` (TensorDict or None), ``self.non_tensor_batch``
(dict of numpy arrays) and ``self.meta_info`` (dict) only.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from services.protocol.errors import DataProtoError, require
from services.protocol.utils import as_object_array

if TYPE_CHECKING:  # pragma: no cover
    from services.protocol.dataproto import DataProto

NUMERIC_NON_TENSOR_DTYPES_KEY = "__meshrl_non_tensor_dtypes__"
"""Reserved key ``to_tensordict`` uses to remember dtypes of non-object non-tensor arrays."""


class _IndexCollate:
    """DataLoader ``collate_fn``: a list of row indices -> ``data.select_idxs(indices)``."""

    def __init__(self, data: "DataProto") -> None:
        self.data = data

    def __call__(self, indices: list[int]) -> "DataProto":
        return self.data.select_idxs(list(indices))


class DataProtoOpsMixin:
    """Methods of ``DataProto`` that create new rows, iterate, convert, persist or describe."""

    batch: TensorDict | None
    non_tensor_batch: dict
    meta_info: dict

    # ------------------------------------------------------------------ repeats
    def repeat(self, repeat_times: int = 2, interleave: bool = True):
        """Repeat every row ``repeat_times`` times.

        ``interleave=True``: ``[a, b] -> [a, a, b, b]`` (GRPO's n samples per prompt, kept
        adjacent).  ``interleave=False``: ``[a, b] -> [a, b, a, b]`` (the whole batch tiled).
        """
        require(isinstance(repeat_times, (int, np.integer)) and repeat_times >= 0,
                f"repeat_times must be a non-negative int, got {repeat_times!r}")
        n, r = len(self), int(repeat_times)
        if interleave:
            index = np.repeat(np.arange(n), r)
        else:
            index = np.tile(np.arange(n), r)
        return self._take_rows(index)

    def sample_level_repeat(self, repeat_times):
        """Repeat row ``i`` ``repeat_times[i]`` times, kept adjacent (list/tuple/ndarray/tensor)."""
        if isinstance(repeat_times, torch.Tensor):
            require(repeat_times.dim() == 1, "repeat_times tensor must be 1-d")
            counts = repeat_times.detach().cpu().numpy()
        elif isinstance(repeat_times, np.ndarray):
            require(repeat_times.ndim == 1, "repeat_times array must be 1-d")
            counts = repeat_times
        elif isinstance(repeat_times, (list, tuple)):
            counts = np.asarray(repeat_times)
        else:
            raise DataProtoError(
                f"repeat_times type must be in [list, torch.Tensor, np.ndarray, tuple], got {type(repeat_times)}"
            )
        counts = counts.astype(np.int64) if counts.size else np.zeros(0, dtype=np.int64)
        require(counts.shape == (len(self),), f"repeat_times has {counts.shape[0]} entries, DataProto has {len(self)} rows")
        require((counts >= 0).all(), "repeat_times must be non-negative")
        return self._take_rows(np.repeat(np.arange(len(self)), counts))

    def _take_rows(self, index: np.ndarray):
        """New DataProto made of rows ``index`` (int64 [M]) of ``self``; meta_info shared."""
        index_t = torch.from_numpy(np.ascontiguousarray(index, dtype=np.int64))
        batch = None
        if self.batch is not None:
            dev = self.batch.device
            batch = self.batch[index_t.to(dev) if dev is not None else index_t]
        non_tensor = {key: val[index] for key, val in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=self.meta_info)

    def unfold_column_chunks(self, n_split: int, split_keys: list[str] | None = None):
        """Split dim 1 of ``split_keys`` into ``n_split`` pieces and move them to the batch dim.

        A ``[B, n_split * k, ...]`` column becomes ``[B * n_split, k, ...]``; every other
        column is repeated ``n_split`` times (interleaved) to stay row-aligned.
        """
        require(n_split > 0, f"n_split must be positive, got {n_split}")
        keys = set(split_keys or [])
        n = len(self)

        def unfold(key: str, val):
            require(val.ndim >= 2 and val.shape[1] % n_split == 0,
                    f"{key}: dim 1 of shape {tuple(val.shape)} is not divisible by n_split={n_split}")
            return val.reshape(n * n_split, val.shape[1] // n_split, *val.shape[2:])

        batch = None
        if self.batch is not None:
            cols = {}
            for key, val in self.batch.items():
                cols[key] = unfold(key, val) if key in keys else torch.repeat_interleave(val, n_split, dim=0)
            batch = TensorDict(cols, batch_size=(n * n_split,), device=self.batch.device)
        non_tensor = {
            key: unfold(key, val) if key in keys else np.repeat(val, n_split, axis=0)
            for key, val in self.non_tensor_batch.items()
        }
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=self.meta_info)

    # ------------------------------------------------------------------ iteration
    def make_iterator(self, mini_batch_size: int, epochs: int, seed: int | None = None, dataloader_kwargs: dict | None = None) -> Iterator:
        """Yield DataProtos of ``mini_batch_size`` rows for ``epochs`` passes.

        Requires ``len(self) % mini_batch_size == 0``; ``dataloader_kwargs`` go to
        ``torch.utils.data.DataLoader`` (e.g. ``{"shuffle": True}``); ``seed`` seeds its
        generator, so equal seeds give equal orders.  Each mini-batch carries ``meta_info``.
        """
        from torch.utils.data import DataLoader

        require(mini_batch_size > 0, f"mini_batch_size must be positive, got {mini_batch_size}")
        require(len(self) % mini_batch_size == 0, f"{len(self)} % {mini_batch_size} != 0")
        kwargs = dict(dataloader_kwargs or {})
        require(isinstance(kwargs, dict), "dataloader_kwargs must be a dict")
        generator = None
        if seed is not None:
            generator = torch.Generator()
            generator.manual_seed(seed)
        if len(self) == 0:
            return iter(())
        loader = DataLoader(range(len(self)), batch_size=mini_batch_size, collate_fn=_IndexCollate(self),
                            generator=generator, **kwargs)

        def gen():
            for _ in range(epochs):
                for mini in loader:
                    mini.meta_info = self.meta_info
                    yield mini

        return gen()

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
        from services import wire

        frame = wire.encode(self)
        with open(filepath, "wb") as f:
            f.write(frame)

    @classmethod
    def load_from_disk(cls, filepath: str | os.PathLike):
        """Read a file written by :meth:`save_to_disk` (validated by ``services.wire.decode``)."""
        from services import wire

        size = os.path.getsize(filepath)
        buf = bytearray(size)
        with open(filepath, "rb") as f:
            got = f.readinto(buf)
        require(got == size, f"short read from {filepath}: {got} of {size} bytes")
        return wire.decode(buf, max_frame_bytes=max(size, 1), cls=cls)

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
