"""Padding and batch-dim folding helpers (verl's module-level functions)."""

from __future__ import annotations

import logging

import numpy as np

from services.protocol.dataproto import DataProto
from services.protocol.errors import require

logger = logging.getLogger(__name__)


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Return ``(padded, pad_size)`` with ``len(padded) % size_divisor == 0``.

    Padding rows are copies of the first rows (wrapping around if ``pad_size > len(data)``);
    ``data`` itself is unchanged.  An empty DataProto is returned as is (pad_size 0).
    """
    require(isinstance(data, DataProto), "data must be a DataProto")
    require(isinstance(size_divisor, int) and size_divisor > 0, f"size_divisor must be a positive int, got {size_divisor!r}")
    n = len(data)
    if n == 0:
        logger.warning("padding a DataProto with no item, no changed made")
        return data, 0
    if n % size_divisor == 0:
        return data, 0
    pad_size = size_divisor - n % size_divisor
    parts = [data]
    remaining = pad_size
    while remaining > 0:
        take = min(remaining, n)
        parts.append(data[:take])
        remaining -= take
    return type(data).concat(parts), pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last ``pad_size`` rows (inverse of :func:`pad_dataproto_to_divisor`)."""
    require(pad_size >= 0, f"pad_size must be >= 0, got {pad_size}")
    if pad_size != 0:
        data = data[:-pad_size]
    return data


def fold_batch_dim(data: DataProto, new_batch_size: int) -> DataProto:
    """Fold ``[B, ...]`` into ``[new_batch_size, B // new_batch_size, ...]``.

    The result keeps two-level tensors in ``batch`` (batch_size ``[new_batch_size]``) and
    reshapes non-tensor columns alike; :func:`unfold_batch_dim` inverts it.
    """
    require(data.batch is not None, "fold_batch_dim needs a tensor batch")
    batch_size = data.batch.batch_size[0]
    require(new_batch_size > 0 and batch_size % new_batch_size == 0,
            f"batch size {batch_size} is not divisible by new_batch_size {new_batch_size}")
    tensor = data.batch.view(new_batch_size, -1)
    tensor.auto_batch_size_(batch_dims=1)
    non_tensor = {key: np.reshape(val, (new_batch_size, -1, *val.shape[1:])) for key, val in data.non_tensor_batch.items()}
    return type(data)(batch=tensor, non_tensor_batch=non_tensor, meta_info=data.meta_info)


def unfold_batch_dim(data: DataProto, batch_dims: int = 2) -> DataProto:
    """Merge the first ``batch_dims`` dims back into one batch dim."""
    require(data.batch is not None, "unfold_batch_dim needs a tensor batch")
    tensor = data.batch
    tensor.auto_batch_size_(batch_dims=batch_dims)
    tensor = tensor.view(-1)
    batch_size = tensor.batch_size[0]
    non_tensor = {key: np.reshape(val, (batch_size, *val.shape[batch_dims:])) for key, val in data.non_tensor_batch.items()}
    return type(data)(batch=tensor, non_tensor_batch=non_tensor, meta_info=data.meta_info)
