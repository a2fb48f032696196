"""``DataProto``: the batch every meshrl service exchanges, with verl's public API.

A ``DataProto`` holds one batch of ``B`` samples in three parts:

``batch`` : ``tensordict.TensorDict`` with ``batch_size=[B]`` (or ``None`` when there are no
    tensors).  Conventional keys (all row-aligned on dim 0):

    * ``prompts`` int64 ``[B, P]`` — left-padded prompt token ids.
    * ``responses`` int64 ``[B, R]`` — right-padded generated token ids.
    * ``input_ids`` int64 ``[B, P+R]`` — ``cat(prompts, responses)``.
    * ``attention_mask`` int64/bool ``[B, P+R]`` — 1 on real tokens, 0 on padding.
    * ``position_ids`` int64 ``[B, P+R]`` (or ``[B, 3, P+R]`` for mrope).
    * ``response_mask`` int64/bool ``[B, R]`` — 1 on tokens that get a loss (generated tokens;
      0 on padding and tool observations).
    * ``rollout_log_probs`` float32 ``[B, R]`` — log-probs reported by the rollout engine.
    * ``old_log_probs`` float32 ``[B, R]`` — log-probs recomputed by the actor before update.
    * ``ref_log_prob`` float32 ``[B, R]`` — reference-policy log-probs (KL term).
    * ``values`` float32 ``[B, R]`` — critic values (PPO).
    * ``token_level_scores`` float32 ``[B, R]`` — reward placed on tokens (usually the last).
    * ``token_level_rewards`` float32 ``[B, R]`` — scores minus the KL penalty, if any.
    * ``advantages`` / ``returns`` float32 ``[B, R]``.
    * ``policy_version`` int64 ``[B]`` — meshrl: version of the weights that generated the row.

``non_tensor_batch`` : ``dict[str, np.ndarray]``, each array of length ``B`` on dim 0, usually
    ``dtype=object``.  Conventional keys: ``uid`` (str, one per prompt group — GRPO groups
    by it), ``data_source`` (str), ``reward_model`` (dict, e.g. ``{"ground_truth": ...}``),
    ``raw_prompt_ids`` (list[int]), and meshrl's ``sample_id`` (str, unique per sample;
    queue consumers dedupe on it).

``meta_info`` : ``dict`` of batch-wide values (``eos_token_id``, ``temperature``,
    ``micro_batch_size``, ``global_steps``, ``metrics`` ...).

Operations follow verl's ``verl.protocol.DataProto`` (same names, keyword names and
results); misuse raises :class:`services.protocol.DataProtoError`, an ``AssertionError``
subclass as verl's assertions are.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch
from tensordict import TensorDict

from services.protocol.config import DataProtoConfig
from services.protocol.dataproto_convert import ConversionMixin
from services.protocol.dataproto_rows import RowOpsMixin
from services.protocol.errors import DataProtoError, require
from services.protocol.column_dicts import (
    as_object_array,
    values_equal,
    union_numpy_dict,
    union_tensor_dict,
    union_two_dict,
)

IndexLike = int | np.integer | slice | list | np.ndarray | torch.Tensor


@dataclass
class DataProtoItem:
    """One row of a DataProto (what ``data[i]`` returns for an integer ``i``).

    ``batch`` is a TensorDict with ``batch_size=[]`` (or None); ``non_tensor_batch`` maps
    each key to that row's element; ``meta_info`` is the parent's dict (shared).
    """

    batch: TensorDict | None = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)


@dataclass
class DataProto(RowOpsMixin, ConversionMixin):
    """A batch of samples: tensors (``batch``), per-sample objects, and batch-wide meta info.

    See the module docstring for the field conventions.  Construction validates that every
    column has the same length on dim 0.
    """

    batch: TensorDict | None = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.non_tensor_batch is None:
            self.non_tensor_batch = {}
        if self.meta_info is None:
            self.meta_info = {}
        self.check_consistency()

    # ------------------------------------------------------------------ construction
    def check_consistency(self) -> None:
        """Validate the three parts; raise :class:`DataProtoError` naming the bad column.

        ``batch`` must be a TensorDict with exactly one batch dim, every non-tensor value a
        numpy array whose dim 0 equals the batch size, ``meta_info`` a dict.
        """
        if self.batch is not None:
            require(isinstance(self.batch, TensorDict), f"batch must be a TensorDict or None, got {type(self.batch)}")
            require(len(self.batch.batch_size) == 1, f"only support num_batch_dims=1, got batch_size {self.batch.batch_size}")
        require(isinstance(self.non_tensor_batch, dict), f"non_tensor_batch must be a dict, got {type(self.non_tensor_batch)}")
        require(isinstance(self.meta_info, dict), f"meta_info must be a dict, got {type(self.meta_info)}")
        expected = self.batch.batch_size[0] if self.batch is not None else None
        for key, val in self.non_tensor_batch.items():
            require(
                isinstance(val, np.ndarray),
                f"data in the non_tensor_batch must be a numpy.array with dtype=object, but for {key=}, got {type(val)=}",
            )
            require(val.ndim >= 1, f"non_tensor_batch[{key!r}] must have a batch dim, got a 0-d array")
            if expected is None:
                expected = val.shape[0]
            require(val.shape[0] == expected, f"key {key} length {len(val)} is not equal to batch size {expected}")

    @classmethod
    def from_single_dict(cls, data: dict[str, torch.Tensor | np.ndarray], meta_info: dict | None = None, auto_padding: bool = False):
        """Build from one dict: tensors go to ``batch``, numpy arrays to ``non_tensor_batch``."""
        tensors, non_tensors = {}, {}
        for key, val in data.items():
            if isinstance(val, torch.Tensor):
                tensors[key] = val
            elif isinstance(val, np.ndarray):
                non_tensors[key] = val
            else:
                raise DataProtoError(f"Unsupported type in data {type(val)} for key {key!r}")
        return cls.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta_info, auto_padding=auto_padding)

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict | None = None,
        num_batch_dims: int = 1,
        auto_padding: bool = False,
    ):
        """Build from ``tensors`` (all sharing the first ``num_batch_dims`` dims) and ``non_tensors``.

        Non-tensor values that are not numpy arrays (e.g. lists) become ``dtype=object``
        arrays.  ``auto_padding=True`` records ``meta_info[DataProtoConfig.auto_padding_key]``
        so this batch may be chunked unevenly.  ``num_batch_dims > 1`` is accepted only
        without non-tensors; since a DataProto holds exactly one batch dim, construction then
        fails the consistency check (as in verl).
        """
        require(num_batch_dims > 0, "num_batch_dims must be greater than zero")
        tensors = dict(tensors or {})
        non_tensors = dict(non_tensors or {})
        meta_info = dict(meta_info or {})
        if non_tensors:
            require(num_batch_dims == 1, "only support num_batch_dims=1 when non_tensors is not None.")
        batch_size, pivot = None, None
        for key, tensor in tensors.items():
            require(isinstance(tensor, torch.Tensor), f"tensors[{key!r}] must be a torch.Tensor, got {type(tensor)}")
            require(tensor.dim() >= num_batch_dims, f"tensors[{key!r}] has {tensor.dim()} dims < num_batch_dims={num_batch_dims}")
            current = tuple(tensor.shape[:num_batch_dims])
            if batch_size is None:
                batch_size, pivot = current, key
            require(
                current == batch_size,
                f"Not all the tensor in tensors have the same batch size with batch_dims={num_batch_dims}. "
                f"Got {pivot} has {batch_size}, {key} has {current}",
            )
        non_tensors = {key: as_object_array(val) for key, val in non_tensors.items()}
        batch = TensorDict(source=tensors, batch_size=batch_size) if tensors else None
        if auto_padding:
            meta_info[DataProtoConfig.auto_padding_key] = True
        return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=meta_info)

    # ------------------------------------------------------------------ size, indexing
    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        if self.non_tensor_batch:
            return int(next(iter(self.non_tensor_batch.values())).shape[0])
        return 0

    def __getitem__(self, item: IndexLike):
        """``int`` -> :class:`DataProtoItem`; slice, index list/array/tensor or bool mask -> DataProto."""
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        if isinstance(item, (list, tuple, np.ndarray, torch.Tensor)):
            if isinstance(item, (np.ndarray, torch.Tensor)) and item.ndim == 0:
                item = int(item)
            else:
                return self.select_idxs(list(item) if isinstance(item, tuple) else item)
        if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            n = len(self)
            if not -n <= int(item) < n:
                raise IndexError(f"index {item} is out of range for DataProto of length {n}")
            row = self.batch[int(item)] if self.batch is not None else None
            non_tensor = {key: val[int(item)] for key, val in self.non_tensor_batch.items()}
            return DataProtoItem(batch=row, non_tensor_batch=non_tensor, meta_info=self.meta_info)
        raise TypeError(f"Indexing with {type(item)} is not supported")

    def select_idxs(self, idxs: list | np.ndarray | torch.Tensor):
        """Rows at integer positions ``idxs`` (any order, repeats allowed) or where bool mask ``idxs`` is True."""
        if isinstance(idxs, list):
            if idxs and all(isinstance(i, (bool, np.bool_)) for i in idxs):
                idx_np = np.asarray(idxs, dtype=bool)
            else:
                idx_np = np.asarray(idxs, dtype=np.int64).reshape(-1)
        elif isinstance(idxs, torch.Tensor):
            idx_np = idxs.detach().cpu().numpy()
        elif isinstance(idxs, np.ndarray):
            idx_np = idxs
        else:
            raise TypeError(f"idxs must be a list, numpy array or torch tensor, got {type(idxs)}")
        n = len(self)
        if idx_np.dtype == bool:
            require(idx_np.shape == (n,), f"boolean mask has shape {idx_np.shape}, DataProto has length {n}")
            idx_np = np.flatnonzero(idx_np)
        else:
            require(idx_np.dtype.kind in "iu", f"indices must be integers or booleans, got dtype {idx_np.dtype}")
            idx_np = idx_np.astype(np.int64, copy=False).reshape(-1)
            if idx_np.size and (idx_np.max() >= n or idx_np.min() < -n):
                raise IndexError(f"indices out of range for DataProto of length {n}")
        idx_t = torch.from_numpy(np.ascontiguousarray(idx_np))
        batch = None
        if self.batch is not None:
            batch = self.batch[idx_t.to(self.batch.device) if self.batch.device is not None else idx_t]
        non_tensor = {key: val[idx_np] for key, val in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=self.meta_info)

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None):
        """Rows ``start:end:step`` as a DataProto (tensors are views, not copies)."""
        sl = slice(start, end, step)
        batch = self.batch[sl] if self.batch is not None else None
        non_tensor = {key: val[sl] for key, val in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=self.meta_info)

    # ------------------------------------------------------------------ keys
    def select(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None, deepcopy: bool = False):
        """A DataProto with only the given keys (``None`` keeps all of that part).

        Without ``deepcopy`` the result shares tensors, arrays and meta values with ``self``;
        with ``deepcopy=True`` all three parts are copied.
        """
        if batch_keys is not None:
            batch_keys = [batch_keys] if isinstance(batch_keys, str) else list(batch_keys)
            if self.batch is None:
                require(not batch_keys, f"cannot select batch keys {batch_keys}: this DataProto has no batch")
                batch = None
            else:
                missing = [k for k in batch_keys if k not in self.batch.keys()]
                require(not missing, f"batch keys {missing} not found; available: {sorted(self.batch.keys())}")
                batch = self.batch.select(*batch_keys)
        else:
            batch = self.batch
        if non_tensor_batch_keys is not None:
            keys = [non_tensor_batch_keys] if isinstance(non_tensor_batch_keys, str) else list(non_tensor_batch_keys)
            non_tensor = {k: v for k, v in self.non_tensor_batch.items() if k in keys}
        else:
            non_tensor = dict(self.non_tensor_batch)
        if meta_info_keys is not None:
            keys = [meta_info_keys] if isinstance(meta_info_keys, str) else list(meta_info_keys)
            meta = {k: v for k, v in self.meta_info.items() if k in keys}
        else:
            meta = self.meta_info
        if deepcopy:
            batch = batch.clone() if batch is not None else None
            non_tensor = copy.deepcopy(non_tensor)
            meta = copy.deepcopy(meta)
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def pop(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None):
        """Remove the given keys from ``self`` and return them as a new DataProto."""
        tensors, non_tensors, meta = {}, {}, {}
        for key in batch_keys or []:
            require(self.batch is not None and key in self.batch.keys(), f"batch key {key!r} not found")
        for key in non_tensor_batch_keys or []:
            require(key in self.non_tensor_batch, f"non_tensor_batch key {key!r} not found")
        for key in meta_info_keys or []:
            require(key in self.meta_info, f"meta_info key {key!r} not found")
        for key in batch_keys or []:
            tensors[key] = self.batch.pop(key)
        for key in non_tensor_batch_keys or []:
            non_tensors[key] = self.non_tensor_batch.pop(key)
        for key in meta_info_keys or []:
            meta[key] = self.meta_info.pop(key)
        if tensors:
            popped = TensorDict(tensors, batch_size=self.batch.batch_size, device=self.batch.device)
            return type(self)(batch=popped, non_tensor_batch=non_tensors, meta_info=meta)
        return type(self).from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)

    def rename(self, old_keys=None, new_keys=None):
        """Rename batch (tensor) keys in place; returns ``self``."""

        def as_list(keys):
            if isinstance(keys, str):
                return [keys]
            if isinstance(keys, (list, tuple)):
                return list(keys)
            raise TypeError(f"keys must be a list or a string, but got {type(keys)}")

        old, new = as_list(old_keys), as_list(new_keys)
        if len(old) != len(new):
            raise ValueError(f"new_keys and old_keys must have the same length, but got {len(new)} and {len(old)}")
        require(self.batch is not None, "cannot rename keys: this DataProto has no batch")
        missing = [k for k in old if k not in self.batch.keys()]
        require(not missing, f"batch keys {missing} not found")
        require(len(set(new)) == len(new), f"new_keys contain duplicates: {new}")
        remaining = set(self.batch.keys()) - set(old)
        clash = [k for k in new if k in remaining]
        require(not clash, f"new keys {clash} already exist in batch")
        values = [self.batch.pop(k) for k in old]
        for key, val in zip(new, values):
            self.batch.set(key, val)
        return self

    def union(self, other: "DataProto"):
        """Merge ``other`` into ``self`` (in place) and return ``self``.

        Raises :class:`DataProtoError` if the lengths differ, or a key present in both (in
        batch, non_tensor_batch or meta_info) holds different values.
        """
        require(isinstance(other, DataProto), f"can only union with a DataProto, got {type(other)}")
        has_rows = lambda d: d.batch is not None or bool(d.non_tensor_batch)  # noqa: E731
        if has_rows(self) and has_rows(other):
            require(len(self) == len(other), f"cannot union DataProtos of lengths {len(self)} and {len(other)}")
        # merge into shallow copies first, so a conflict leaves ``self`` untouched
        if self.batch is None:
            batch = other.batch
        elif other.batch is not None:
            batch = union_tensor_dict(self.batch.copy(), other.batch)
        else:
            batch = self.batch
        non_tensor = union_numpy_dict(dict(self.non_tensor_batch), other.non_tensor_batch)
        meta = union_two_dict(dict(self.meta_info), other.meta_info)
        type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info={})  # validates the merged rows
        if batch is not None and self.batch is not None and batch is not self.batch:
            for key in other.batch.keys():
                if key not in self.batch.keys():
                    self.batch.set(key, other.batch.get(key))
        else:
            self.batch = batch
        self.non_tensor_batch.update(non_tensor)
        self.meta_info.update(meta)
        self.check_consistency()
        return self

    def reorder(self, indices: torch.Tensor | np.ndarray | list) -> None:
        """Permute rows in place: row ``i`` becomes old row ``indices[i]``."""
        reordered = self.select_idxs(indices)
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch

    # ------------------------------------------------------------------ split / join
    def chunk(self, chunks: int) -> list["DataProto"]:
        """Split into ``chunks`` consecutive parts; each keeps ``meta_info``.

        Without padding enabled (see :meth:`is_padding_enabled`) the length must divide
        evenly.  With padding enabled, parts take ``ceil(len/chunks)`` rows each (torch.chunk
        sizes, the last shorter) — or balanced sizes when that would yield fewer parts.
        """
        require(isinstance(chunks, (int, np.integer)) and chunks > 0, f"chunks must be a positive int, got {chunks!r}")
        chunks = int(chunks)
        n = len(self)
        if not self.is_padding_enabled():
            require(n % chunks == 0, f"only support equal chunk. Got size of DataProto {n} and chunk {chunks}.")
        per = -(-n // chunks) if n else 0
        if per and -(-n // per) == chunks:
            sizes = [min(per, n - i * per) for i in range(chunks)]
        else:
            sizes = [len(part) for part in np.array_split(np.arange(n), chunks)]
        bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        return [self.slice(int(bounds[i]), int(bounds[i + 1])) for i in range(chunks)]

    def split(self, split_size: int) -> list["DataProto"]:
        """Consecutive parts of ``split_size`` rows (the last may be shorter)."""
        require(isinstance(split_size, (int, np.integer)) and split_size > 0, f"split_size must be a positive int, got {split_size!r}")
        split_size = int(split_size)
        return [self.slice(i, i + split_size) for i in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence["DataProto"]) -> "DataProto":
        """Concatenate along the batch dim; returns an instance of ``type(data[0])``.

        ``meta_info`` entries must agree across inputs (else :class:`DataProtoError`), except
        ``"metrics"``: each input's metrics dict (or list of dicts) is gathered and merged into
        one dict of lists, ``{"loss": [v_from_0, v_from_1, ...]}``.
        """
        data = list(data)
        if not data:
            return DataProto()
        has_batch = [d.batch is not None for d in data]
        require(all(has_batch) or not any(has_batch), "cannot concat DataProtos with and without a tensor batch")
        if has_batch[0]:
            first = set(data[0].batch.keys(include_nested=True, leaves_only=True))
            for d in data[1:]:
                other = set(d.batch.keys(include_nested=True, leaves_only=True))
                require(other == first, f"batch keys differ: {sorted(map(str, first))} vs {sorted(map(str, other))}")
        batch = torch.cat([d.batch for d in data], dim=0) if has_batch[0] else None
        keys = list(data[0].non_tensor_batch)
        for d in data[1:]:
            require(set(d.non_tensor_batch) == set(keys),
                    f"non_tensor_batch keys differ: {sorted(keys)} vs {sorted(d.non_tensor_batch)}")
        non_tensor = {k: np.concatenate([d.non_tensor_batch[k] for d in data], axis=0) for k in keys}
        meta: dict = {}
        metrics: list[dict] = []
        for d in data:
            for key, val in d.meta_info.items():
                if key == "metrics":
                    if isinstance(val, list):
                        metrics.extend(val)
                    elif val is not None:
                        metrics.append(val)
                elif key in meta:
                    require(values_equal(meta[key], val),
                            f"Conflicting values for meta_info key '{key}': {meta[key]!r} vs {val!r}")
                else:
                    meta[key] = val
        if metrics:
            merged: dict[str, list] = {}
            for m in metrics:
                require(isinstance(m, dict), f"meta_info['metrics'] must be a dict or list of dicts, got {type(m)}")
                for key, val in m.items():
                    merged.setdefault(key, []).append(val)
            meta["metrics"] = merged
        return type(data[0])(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    # ------------------------------------------------------------------ device, padding
    def to(self, device: torch.device | str):
        """Move ``batch`` to ``device`` (in place); returns ``self``."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def is_padding_enabled(self) -> bool:
        """True if this batch's meta_info or :class:`DataProtoConfig` enables auto-padding."""
        return bool(self.meta_info.get(DataProtoConfig.auto_padding_key, False)) or DataProtoConfig.auto_padding

    def padding(self, padding_size: int, padding_candidate: str = "") -> None:
        """Append ``padding_size`` copies of the first (``"first"``) or last row, in place."""
        if padding_size == 0:
            return
        require(padding_size > 0, f"padding_size must be >= 0, got {padding_size}")
        require(len(self) > 0, "cannot pad an empty DataProto")
        row = self.select_idxs([0 if padding_candidate == "first" else len(self) - 1])
        padded = type(self).concat([self, row.repeat(repeat_times=padding_size)])
        self.batch, self.non_tensor_batch = padded.batch, padded.non_tensor_batch


def collate_fn(x: list[DataProtoItem]) -> DataProto:
    """Stack :class:`DataProtoItem` rows (e.g. from a DataLoader over a DataProto) into a DataProto."""
    require(len(x) > 0, "collate_fn needs at least one item")
    batches = [item.batch for item in x]
    has_batch = [b is not None for b in batches]
    require(all(has_batch) or not any(has_batch), "cannot collate items with and without a tensor batch")
    batch = torch.stack(batches).contiguous() if has_batch[0] else None
    keys = list(x[0].non_tensor_batch)
    non_tensor = {}
    for key in keys:
        col = np.empty(len(x), dtype=object)
        for i, item in enumerate(x):
            require(key in item.non_tensor_batch, f"item {i} lacks non-tensor key {key!r}")
            col[i] = item.non_tensor_batch[key]
        non_tensor[key] = col
    return DataProto(batch=batch, non_tensor_batch=non_tensor)
