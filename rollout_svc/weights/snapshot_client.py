"""The receiver's snapshot client: ``FetchSnapshot`` streamed into one buffer and parsed.

A replica that missed a broadcast (it joined late, a transfer failed, or in canary mode its
version's broadcast went out without it) catches up from the publisher's snapshot: the
safetensors bytes of the latest version -- or, in canary mode, of the version this replica
is to serve -- checked chunk by chunk and parsed zero-copy (:mod:`services.weights.snapshot`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import torch

from services.config.weights import WeightChannelConfig
from services.pb import weights_pb2 as pb
from services.weights.errors import SnapshotError, WeightChannelError
from services.weights.snapshot import parse_safetensors

from rollout_svc.weights.control import ControlStream


@dataclass
class Snapshot:
    """A fetched snapshot: ``version`` and its tensors (views of one received buffer)."""

    version: int
    named_tensors: list[tuple[str, torch.Tensor]]

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.named_tensors)


class SnapshotClient:
    """Downloads the publisher's snapshot over the control stream's channel."""

    def __init__(self, cfg: WeightChannelConfig, control: ControlStream):
        self.cfg = cfg
        self.control = control

    def fetch(self, min_version: int = -1, timeout: float | None = None) -> Snapshot | None:
        """See ``WeightReceiver.fetch_snapshot``."""
        stub = self.control.stub
        if stub is None:
            raise WeightChannelError("connect() first")
        timeout = self.cfg.transfer_timeout_s if timeout is None else timeout
        req = pb.SnapshotRequest(replica_id=self.control.replica_id, min_version=min_version)
        buf: bytearray | None = None
        version = total = pos = -1
        try:
            for chunk in stub.FetchSnapshot(req, timeout=timeout):
                if buf is None:
                    version, total, pos = chunk.policy_version, chunk.total_bytes, 0
                    buf = bytearray(total)
                if chunk.policy_version != version or chunk.total_bytes != total or chunk.offset != pos:
                    raise SnapshotError(f"snapshot chunk out of order: v{chunk.policy_version} at {chunk.offset}, "
                                        f"expected v{version} at {pos} of {total}")
                end = pos + len(chunk.data)
                if end > total or not chunk.data:
                    raise SnapshotError(f"snapshot chunk at {pos} with {len(chunk.data)} bytes overruns {total}")
                buf[pos:end] = chunk.data
                pos = end
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise SnapshotError(f"fetching the snapshot failed: {e.code().name}: {e.details()}") from e
        if buf is None or pos != total:
            raise SnapshotError(f"snapshot stream ended at {pos} of {total} bytes")
        file_version, tensors = parse_safetensors(buf)
        if file_version is not None and file_version != version:
            raise SnapshotError(f"snapshot file says v{file_version}, the stream said v{version}")
        return Snapshot(version, tensors)
