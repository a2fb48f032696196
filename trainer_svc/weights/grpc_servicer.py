"""gRPC side of the publisher: the ``WeightService`` handlers.

All state lives in the publisher (:class:`~trainer_svc.weights.publisher.WeightPublisher`); the
servicer only translates between it and the wire. The publisher imports this module to
serve it, so what the handlers need from the publisher is declared here
(:class:`PublisherSide`) rather than imported from it.
"""

from __future__ import annotations

import itertools
import queue
from typing import Any, Protocol

import grpc

from services.config.weights import WeightChannelConfig
from services.pb import weights_pb2 as pb
from services.pb import weights_pb2_grpc as pb_grpc
from services.weights.errors import SnapshotError, TransferError, VersionError
from services.weights.messages import check_replica_id, check_serve_dtype, control


class Subscription(Protocol):
    """One replica's subscription: the control messages queued for its stream."""

    outbox: queue.Queue
    connected: bool


class PublisherSide(Protocol):
    """The part of the publisher the handlers call (the publisher's own, not public, API)."""

    cfg: WeightChannelConfig
    session: int

    @property
    def latest_version(self) -> int: ...

    @property
    def snapshot_version(self) -> int: ...

    def _subscribe(self, replica_id: str, served_version: int, served_session: int = 0,
                   serve_dtype: str = "", promoted_only: bool = False) -> Subscription: ...

    def snapshot_for(self, replica_id: str, min_version: int, chunk_bytes: int) -> Any: ...

    def resume(self, reason: str = "") -> None: ...

    def _unsubscribe(self, sub: Any) -> None: ...

    def _ack(self, req: pb.AckRequest) -> bool: ...

    def _status(self) -> pb.StatusReply: ...


K = pb.ControlKind


class WeightServicer(pb_grpc.WeightServiceServicer):
    """gRPC handlers; all state lives in the publisher."""

    def __init__(self, pub: PublisherSide):
        self.pub = pub

    def Subscribe(self, request, context):  # noqa: N802 (gRPC naming)
        try:
            rid = check_replica_id(request.replica_id)
            sub = self.pub._subscribe(rid, request.served_version, request.served_session,
                                      check_serve_dtype(request.serve_dtype), request.promoted_only)
        except (ValueError, TransferError) as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT if isinstance(e, ValueError) else grpc.StatusCode.UNAVAILABLE, str(e))
        context.add_callback(lambda: self.pub._unsubscribe(sub))
        yield control(K.CONTROL_KIND_WELCOME, self.pub.session, 0, -1,
                      welcome=pb.Welcome(latest_version=self.pub.latest_version,
                                         snapshot_version=self.pub.snapshot_version))
        while True:
            try:
                msg = sub.outbox.get(timeout=1.0)
            except queue.Empty:
                if not context.is_active() or not sub.connected:
                    return
                continue
            if msg is None:
                return
            yield msg

    def Ack(self, request, context):  # noqa: N802
        if request.status not in (pb.ACK_STATUS_RECEIVED, pb.ACK_STATUS_FAILED, pb.ACK_STATUS_LOADED):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Ack with status {request.status}")
        return pb.AckReply(known=self.pub._ack(request))

    def FetchSnapshot(self, request, context):  # noqa: N802
        try:
            chunks = self.pub.snapshot_for(request.replica_id, request.min_version, self.pub.cfg.snapshot_chunk_kb << 10)
        except SnapshotError as e:
            context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        try:
            first = next(chunks)
        except SnapshotError as e:
            context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        except StopIteration:
            context.abort(grpc.StatusCode.INTERNAL, "empty snapshot")
        try:
            for version, total, offset, data in itertools.chain([first], chunks):
                yield pb.SnapshotChunk(policy_version=version, total_bytes=total, offset=offset, data=data)
        except SnapshotError as e:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(e))

    def Status(self, request, context):  # noqa: N802
        return self.pub._status()

    def Resume(self, request, context):  # noqa: N802
        try:
            self.pub.resume(request.reason[:500])
        except VersionError as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return self.pub._status()
