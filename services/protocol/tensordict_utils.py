"""Building a single TensorDict from tensors, per-sample lists and batch-wide values.

The meshrl counterpart of verl's ``verl.utils.tensordict_utils.get_tensordict``, as used with
``DataProto.from_tensordict``: tensors stay tensors, per-sample Python lists become
``NonTensorStack`` entries, ``non_tensor_dict`` values become ``NonTensorData``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from services.protocol.errors import require


def get_tensordict(tensor_dict: dict[str, Any], non_tensor_dict: dict[str, Any] | None = None) -> TensorDict:
    """One TensorDict with batch size ``[B]`` (``B`` = dim 0 shared by all per-sample entries).

    ``tensor_dict`` values: tensors ``[B, ...]`` or lists/object arrays of length ``B``;
    ``non_tensor_dict`` values: any Python value, stored once (batch-wide).
    """
    sizes = {key: (val.shape[0] if isinstance(val, (torch.Tensor, np.ndarray)) else len(val)) for key, val in tensor_dict.items()}
    require(len(set(sizes.values())) <= 1, f"entries have different batch sizes: {sizes}")
    batch = next(iter(sizes.values())) if sizes else 0
    out = TensorDict({}, batch_size=[batch])
    for key, val in tensor_dict.items():
        if isinstance(val, torch.Tensor):
            out.set(key, val)
        else:
            out.set(key, NonTensorStack(*[NonTensorData(x) for x in list(val)], batch_size=[batch]) if batch
                    else NonTensorStack(batch_size=[0]))
    for key, val in (non_tensor_dict or {}).items():
        out.set_non_tensor(key, val)
    return out
