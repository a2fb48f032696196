"""``DataProto`` methods that make new rows or iterate over rows.

``repeat`` / ``sample_level_repeat`` (GRPO's n samples per prompt), ``unfold_column_chunks``
(dim 1 of some columns moved to the batch dim) and ``make_iterator`` (mini-batches for
several epochs). ``DataProto`` (:mod:`services.protocol.dataproto`) inherits
:class:`RowOpsMixin`; the methods touch only ``batch``, ``non_tensor_batch`` and ``meta_info``.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
from tensordict import TensorDict

from services.protocol.errors import DataProtoError, require


class _IndexCollate:
    """DataLoader ``collate_fn``: a list of row indices -> ``data.select_idxs(indices)``
    (``data`` is a DataProto, the class that mixes :class:`RowOpsMixin` in)."""

    def __init__(self, data: "RowOpsMixin") -> None:
        self.data = data

    def __call__(self, indices: list[int]) -> "RowOpsMixin":
        return self.data.select_idxs(list(indices))


class RowOpsMixin:
    """Methods of ``DataProto`` that create new rows or iterate over mini-batches."""

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
