"""Host-side messages between trainer ranks: rank 0 tells the others what to do next.

A message is a small JSON control dict plus an optional DataProto, sent as one
``services.wire`` frame (never pickle) over the gloo ``cpu_group``: first an int64 length,
then the uint8 bytes. Every call waits at most the group's timeout (set at
``init_process_group``), so a dead rank 0 makes the others fail instead of hanging.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

from services import wire
from services.protocol import DataProto

_CONTROL_KEY = "__meshrl_trainer_control__"


def broadcast_message(
    control: dict[str, Any] | None, data: DataProto | None, *, group: dist.ProcessGroup, src: int = 0
) -> tuple[dict[str, Any], DataProto | None]:
    """Broadcast ``(control, data)`` from ``src`` to every rank of ``group``.

    On ``src`` pass the values; on the other ranks pass ``None`` and read the return value.
    ``control`` must be JSON-serialisable. The returned DataProto owns its memory.
    """
    rank = dist.get_rank()
    if rank == src:
        if control is None:
            raise ValueError("the source rank must give a control dict")
        meta = {_CONTROL_KEY: json.dumps(control)}
        if data is None:
            carrier = DataProto(batch=None, non_tensor_batch={}, meta_info=meta)
        else:
            carrier = DataProto(batch=data.batch, non_tensor_batch=data.non_tensor_batch, meta_info={**data.meta_info, **meta})
        frame = wire.encode(carrier)
        payload = torch.frombuffer(frame, dtype=torch.uint8) if len(frame) else torch.zeros(0, dtype=torch.uint8)
        size = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        size = torch.zeros(1, dtype=torch.int64)
    dist.broadcast(size, src=src, group=group)
    if rank != src:
        payload = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(payload, src=src, group=group)
    if rank == src:
        return control, data
    buf = bytearray(payload.numpy().tobytes())
    decoded = wire.decode(buf)
    ctrl = json.loads(decoded.meta_info.pop(_CONTROL_KEY))
    if decoded.batch is None and not decoded.non_tensor_batch:
        return ctrl, None
    return ctrl, decoded

