"""meshrl's own DataProto columns and their checks.

* ``sample_id`` — ``non_tensor_batch``, object array of ``str`` ``[B]``: unique per sample
  across the whole job; queue consumers dedupe on it.
* ``policy_version`` — ``batch``, ``torch.int64`` ``[B]``: version of the policy weights that
  generated each row (``-1`` before generation).
* ``uid`` — ``non_tensor_batch``, object array of ``str`` ``[B]``: the prompt group (verl's
  GRPO groups samples by it); the ``n`` samples of one prompt share it.
"""

from __future__ import annotations

import uuid

import numpy as np
import torch

from services.protocol.dataproto import DataProto
from services.protocol.errors import require

SAMPLE_ID = "sample_id"
POLICY_VERSION = "policy_version"
UID = "uid"


def new_sample_ids(n: int, prefix: str = "") -> np.ndarray:
    """``n`` fresh unique ids (``prefix`` + uuid4 hex) as an object array ``[n]``."""
    require(n >= 0, f"n must be >= 0, got {n}")
    out = np.empty(n, dtype=object)
    for i in range(n):
        out[i] = f"{prefix}{uuid.uuid4().hex}"
    return out


def set_policy_version(data: DataProto, version: int) -> DataProto:
    """Set ``batch["policy_version"]`` to ``version`` for every row (in place); returns ``data``."""
    require(data.batch is not None, "set_policy_version needs a tensor batch")
    data.batch[POLICY_VERSION] = torch.full((len(data),), int(version), dtype=torch.int64, device=data.batch.device)
    return data


def check_meshrl_columns(data: DataProto, *, sample_id: bool = True, policy_version: bool = False) -> None:
    """Validate meshrl's columns; raise :class:`services.protocol.DataProtoError` naming the problem.

    ``sample_id`` / ``policy_version``: whether the column must be present.  Present columns
    are always checked (dtype, shape, uniqueness of sample ids).
    """
    n = len(data)
    ids = data.non_tensor_batch.get(SAMPLE_ID)
    require(ids is not None or not sample_id, f"missing non-tensor column {SAMPLE_ID!r}")
    if ids is not None:
        require(ids.shape == (n,), f"{SAMPLE_ID} must have shape [{n}], got {ids.shape}")
        require(all(isinstance(x, str) and x for x in ids), f"{SAMPLE_ID} values must be non-empty str")
        require(len(set(ids.tolist())) == n, f"{SAMPLE_ID} values must be unique within a batch")
    has_version = data.batch is not None and POLICY_VERSION in data.batch.keys()
    require(has_version or not policy_version, f"missing tensor column {POLICY_VERSION!r}")
    if has_version:
        v = data.batch[POLICY_VERSION]
        require(v.dtype == torch.int64 and tuple(v.shape) == (n,),
                f"{POLICY_VERSION} must be int64 [{n}], got {v.dtype} {tuple(v.shape)}")
