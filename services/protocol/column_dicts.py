"""Dictionaries of columns behind ``DataProto.union``/``concat`` (verl-compatible names):
unions of tensor / numpy / plain dicts, the value comparison they use, list-of-dicts to
dict-of-lists, numpy dict to TensorDict, and building object arrays.

All functions that merge mutate and return their first argument, as verl's do.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from services.protocol.errors import DataProtoError, require


def union_tensor_dict(tensor_dict1: TensorDict, tensor_dict2: TensorDict) -> TensorDict:
    """Add ``tensor_dict2``'s keys to ``tensor_dict1`` (in place) and return it.

    Raises :class:`DataProtoError` when the batch sizes differ or a shared key holds
    tensors that are not equal.
    """
    require(
        tensor_dict1.batch_size == tensor_dict2.batch_size,
        f"Two tensor dict must have identical batch size. Got {tensor_dict1.batch_size} and {tensor_dict2.batch_size}",
    )
    for key in tensor_dict2.keys():
        if key in tensor_dict1.keys():
            require(
                tensor_dict1[key].equal(tensor_dict2[key]),
                f"{key} in tensor_dict1 and tensor_dict2 are not the same object",
            )
        else:
            tensor_dict1[key] = tensor_dict2[key]
    return tensor_dict1


def deep_equal(a: Any, b: Any, _seen: set[int] | None = None) -> bool:
    """Strict structural equality: same types, NaN equals NaN, arrays compared element-wise.

    Object arrays are compared element by element (recursively); cycles count as equal.
    """
    if type(a) is not type(b):
        return False
    seen = set() if _seen is None else _seen
    if id(a) in seen:
        return True
    seen.add(id(a))
    try:
        if isinstance(a, float):
            return (math.isnan(a) and math.isnan(b)) or a == b
        if isinstance(a, np.ndarray):
            if a.dtype != b.dtype or a.shape != b.shape:
                return False
            if a.dtype != object:
                return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
            return all(deep_equal(x, y, seen) for x, y in zip(a.flat, b.flat))
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(deep_equal(x, y, seen) for x, y in zip(a, b))
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(deep_equal(a[k], b[k], seen) for k in a)
        if isinstance(a, torch.Tensor):
            return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
        result = a == b
        return bool(result) if not isinstance(result, np.ndarray) else bool(result.all())
    finally:
        seen.discard(id(a))


def values_equal(a: Any, b: Any) -> bool:
    """Equality for meta_info values: identical, ``==`` (so ``1 == 1.0`` as in verl), or
    :func:`deep_equal` (NaN-aware, arrays and tensors element-wise)."""
    if a is b:
        return True
    if not isinstance(a, (np.ndarray, torch.Tensor)) and not isinstance(b, (np.ndarray, torch.Tensor)):
        try:
            result = a == b
        except Exception:  # noqa: BLE001 - exotic __eq__; fall back to the structural check
            result = False
        if isinstance(result, bool) and result:
            return True
    return deep_equal(a, b)


def union_numpy_dict(tensor_dict1: dict[str, np.ndarray], tensor_dict2: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Add ``tensor_dict2``'s arrays to ``tensor_dict1`` (in place) and return it.

    A key present in both must hold deeply equal arrays (NaN-aware, element-wise for object
    dtype), otherwise :class:`DataProtoError` is raised.
    """
    for key, val in tensor_dict2.items():
        if key in tensor_dict1:
            require(isinstance(val, np.ndarray), f"`{key}` in tensor_dict2 is not a numpy array")
            require(isinstance(tensor_dict1[key], np.ndarray), f"`{key}` in tensor_dict1 is not a numpy array")
            require(
                deep_equal(tensor_dict1[key], val),
                f"`{key}` in tensor_dict1 and tensor_dict2 are not the same object.",
            )
        tensor_dict1[key] = val
    return tensor_dict1


def union_two_dict(dict1: dict, dict2: dict) -> dict:
    """Add ``dict2``'s items to ``dict1`` (in place); a shared key must hold equal values."""
    for key, val in dict2.items():
        if key in dict1:
            require(values_equal(dict1[key], val), f"{key} in meta_dict1 and meta_dict2 are not the same object")
        dict1[key] = val
    return dict1


def list_of_dict_to_dict_of_list(list_of_dict: list[dict]) -> dict[str, list]:
    """``[{"a": 1}, {"a": 2}] -> {"a": [1, 2]}``; every dict must have the first dict's keys."""
    if not list_of_dict:
        return {}
    output: dict[str, list] = {key: [] for key in list_of_dict[0]}
    for data in list_of_dict:
        require(data.keys() == output.keys(), f"keys differ: {sorted(data)} vs {sorted(output)}")
        for key, item in data.items():
            output[key].append(item)
    return output


def numpy_dict_to_tensor_dict(numpy_dict: dict[str, np.ndarray]) -> TensorDict:
    """Wrap numeric numpy arrays as tensors (sharing memory) in a TensorDict."""
    tensors = {key: torch.from_numpy(val) for key, val in numpy_dict.items()}
    batch = next(iter(tensors.values())).shape[:1] if tensors else ()
    return TensorDict(tensors, batch_size=batch)


def as_object_array(values: Any) -> np.ndarray:
    """A 1-d (or more) numpy array holding ``values``; lists of Python objects become dtype object.

    Unlike ``np.array(list_of_lists, dtype=object)`` this keeps a list of equal-length
    lists as a 1-d array of lists when numpy would otherwise build a 2-d array it cannot
    (ragged input raises in numpy>=1.24).
    """
    if isinstance(values, np.ndarray):
        return values
    try:
        return np.array(values, dtype=object)
    except ValueError:
        out = np.empty(len(values), dtype=object)
        for i, v in enumerate(values):
            out[i] = v
        return out


__all__ = [
    "DataProtoError",
    "as_object_array",
    "deep_equal",
    "list_of_dict_to_dict_of_list",
    "numpy_dict_to_tensor_dict",
    "union_numpy_dict",
    "union_tensor_dict",
    "union_two_dict",
    "values_equal",
]
