"""``all_gather_data_proto``: make every rank of a process group hold the whole batch.

Each rank encodes its local DataProto as one ``services.wire`` frame (no pickle), the frame
lengths and then the (padded) frames are all-gathered as uint8 tensors, and every rank
decodes and concatenates them in rank order.  Works on gloo (CPU tensors) and NCCL (frames
travel through the current CUDA device).  Every collective waits at most ``timeout``.
"""

from __future__ import annotations

import datetime as _dt

import torch

from services.protocol.dataproto import DataProto
from services.protocol.errors import require
from services.wire.batches import decode_as, encode

DEFAULT_GATHER_TIMEOUT = _dt.timedelta(seconds=300)


def _gather(tensor: torch.Tensor, group, world: int, timeout: _dt.timedelta) -> list[torch.Tensor]:
    import torch.distributed as dist

    out = [torch.empty_like(tensor) for _ in range(world)]
    work = dist.all_gather(out, tensor, group=group, async_op=True)
    work.wait(timeout)
    return out


def all_gather_data_proto(data: DataProto, process_group=None, timeout: _dt.timedelta | float = DEFAULT_GATHER_TIMEOUT) -> None:
    """All-gather ``data`` across ``process_group`` in place (like ``torch.distributed.all_gather``).

    Afterwards ``data.batch`` and ``data.non_tensor_batch`` hold every rank's rows in rank
    order (on ``data``'s original device); ``meta_info`` stays local.  Ranks may hold
    different numbers of rows but must agree on the columns.  ``timeout`` bounds each
    collective (``RuntimeError`` from torch.distributed when it passes).
    """
    import torch.distributed as dist

    require(isinstance(data, DataProto), f"data must be a DataProto, got {type(data)}")
    if isinstance(timeout, (int, float)):
        timeout = _dt.timedelta(seconds=float(timeout))
    world = dist.get_world_size(group=process_group)
    if world == 1:
        return
    prev_device = data.batch.device if data.batch is not None else None
    local_batch = data.batch.to("cpu") if data.batch is not None else None
    frame = encode(DataProto(batch=local_batch, non_tensor_batch=data.non_tensor_batch, meta_info={}))
    comm_device = torch.device("cpu")
    if dist.get_backend(process_group) == "nccl":
        comm_device = torch.device("cuda", torch.cuda.current_device())
    payload = torch.frombuffer(frame, dtype=torch.uint8).to(comm_device)
    sizes = _gather(torch.tensor([payload.numel()], dtype=torch.int64, device=comm_device), process_group, world, timeout)
    lengths = [int(s.item()) for s in sizes]
    padded = torch.zeros(max(lengths), dtype=torch.uint8, device=comm_device)
    padded[: payload.numel()] = payload
    frames = _gather(padded, process_group, world, timeout)
    parts = [
        decode_as(bytearray(f[:n].cpu().numpy().tobytes()), DataProto, max_frame_bytes=max(n, 1))
        for f, n in zip(frames, lengths)
    ]
    merged = DataProto.concat(parts)
    data.batch = merged.batch.to(prev_device) if merged.batch is not None and prev_device is not None else merged.batch
    data.non_tensor_batch = merged.non_tensor_batch
    data.check_consistency()
