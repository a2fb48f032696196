"""gRPC QueueService (proto/queue.proto) over a :class:`~services.queues.broker.BrokerState`.

    broker = EmbeddedBroker(port=50070, aof_path="/var/lib/meshrl/queues.aof")
    await broker.start()      # inside the controller's event loop
    ...
    await broker.stop()

Or as its own process: ``python -m services.queues --port 50070 --aof queues.aof``.
Every request is validated (names, sample ids, stages, sizes); a bad one is refused with
INVALID_ARGUMENT and a message naming the field, and changes nothing. A call without the
job's credential (:mod:`services.auth`) is refused with UNAUTHENTICATED before that.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from services import auth
from services.pb import queue_pb2, queue_pb2_grpc
from services.queues.base import check_name, check_sample_ids, check_stage
from services.queues.broker import BrokerState, Delivered, frame_len
from services.queues.chunkcodec import DELIVERY_CHUNK_FIELD, PUT_CHUNK_FIELD, chunk_deserializer, chunk_serializer

log = logging.getLogger("meshrl.queues.broker")

GRPC_MAX_MESSAGE = 80 << 20  # chunks are far smaller; this only bounds a misbehaving peer
INLINE_MAX = 256 << 10


def grpc_options() -> list[tuple[str, int]]:
    """Channel/server options shared by broker and clients."""
    return [
        ("grpc.max_send_message_length", GRPC_MAX_MESSAGE),
        ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2000),
        ("grpc.so_reuseport", 0),  # never share a port with another server silently
    ]


class _Invalid(ValueError):
    pass


def _check(fn, *args):  # noqa: ANN001, ANN202 - tiny adapter
    try:
        return fn(*args)
    except ValueError as exc:
        raise _Invalid(str(exc)) from None


class QueueServicer(queue_pb2_grpc.QueueServiceServicer):
    """The RPC handlers; all state lives in ``state``."""

    def __init__(self, state: BrokerState, *, max_frame_bytes: int = 1 << 30) -> None:
        self.state = state
        self.max_frame_bytes = max_frame_bytes

    async def Put(self, request_iterator: AsyncIterator[queue_pb2.QueuePutMessage], context: grpc.aio.ServicerContext):  # noqa: N802
        try:
            return await self._put(request_iterator)
        except _Invalid as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def _put(self, request_iterator: AsyncIterator[queue_pb2.QueuePutMessage]) -> queue_pb2.QueuePutReply:
        it = request_iterator.__aiter__()
        try:
            first = await it.__anext__()
        except StopAsyncIteration:
            raise _Invalid("empty Put call: the first message must be a QueuePutBatch") from None
        if first.WhichOneof("kind") != "batch":
            raise _Invalid("the first message of a Put call must be a QueuePutBatch")
        b = first.batch
        _check(check_name, "stream", b.stream)
        _check(check_name, "producer", b.producer)
        if b.stage:
            _check(check_stage, b.stage)
        if b.max_depth < 1:
            raise _Invalid("QueuePutBatch.max_depth must be >= 1")
        deadline = time.monotonic() + b.wait_ms / 1000
        reply = queue_pb2.QueuePutReply()
        cur: queue_pb2.QueuePutItem | None = None
        chunks: list[memoryview | bytes] = []
        off = 0

        async def finish(item: queue_pb2.QueuePutItem, data: bytes | list) -> None:
            eid, gaps = await self.state.put(b.stream, b.producer, item.seq, tuple(item.sample_ids), data,
                                             b.stage, max(1, b.ledger_max))
            reply.entry_ids.append(eid)
            reply.gaps += gaps

        async for msg in it:
            kind = "chunk" if isinstance(msg, memoryview) else msg.WhichOneof("kind")
            if kind == "item":
                if cur is not None:
                    raise _Invalid(f"item seq={cur.seq} ended after {off} of {cur.frame_bytes} bytes")
                item = msg.item
                _check(check_sample_ids, list(item.sample_ids))
                if item.seq < 1:
                    raise _Invalid("QueuePutItem.seq must be >= 1")
                if item.frame_bytes > self.max_frame_bytes:
                    raise _Invalid(f"QueuePutItem.frame_bytes={item.frame_bytes} exceeds the broker's {self.max_frame_bytes}")
                if not await self.state.wait_room(b.stream, b.max_depth, max(0.0, deadline - time.monotonic())):
                    reply.full = True
                    break
                if len(item.inline) == item.frame_bytes:
                    await finish(item, item.inline)
                else:
                    if item.inline:
                        raise _Invalid("QueuePutItem.inline must hold the whole frame or nothing")
                    cur, chunks, off = item, [], 0
            elif kind == "chunk":
                if cur is None:
                    raise _Invalid("chunk without a QueuePutItem")
                piece = msg if isinstance(msg, memoryview) else msg.chunk
                n = len(piece)
                if off + n > cur.frame_bytes:
                    raise _Invalid(f"item seq={cur.seq}: chunks exceed frame_bytes={cur.frame_bytes}")
                chunks.append(piece)  # kept as received: no assembly copy
                off += n
                if off == cur.frame_bytes:
                    await finish(cur, chunks)
                    cur, chunks = None, []
            else:
                raise _Invalid("a second PutBatch in one Put call")
        if cur is not None and not reply.full:
            raise _Invalid(f"item seq={cur.seq} ended after {off} of {cur.frame_bytes} bytes")
        return reply

    async def Get(self, request: queue_pb2.QueueGetRequest, context: grpc.aio.ServicerContext):  # noqa: N802
        try:
            self._check_consumer(request.stream, request.group, request.consumer, request.max_items)
        except _Invalid as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        got = await self.state.get(request.stream, request.group, request.consumer, request.max_items,
                                   request.wait_ms / 1000, max(1, request.dedupe_window))
        for msg in _deliveries(got, request.chunk_bytes):
            yield msg

    async def Reclaim(self, request: queue_pb2.QueueReclaimRequest, context: grpc.aio.ServicerContext):  # noqa: N802
        try:
            self._check_consumer(request.stream, request.group, request.consumer, request.max_items)
            exclude = frozenset(int(i) for i in request.exclude_ids)
        except (_Invalid, ValueError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        got = self.state.reclaim(request.stream, request.group, request.consumer, request.min_idle_ms / 1000,
                                 request.max_items, max(1, request.dedupe_window),
                                 own_only=request.own_only, exclude=exclude)
        for msg in _deliveries(got, request.chunk_bytes):
            yield msg

    def _check_consumer(self, stream: str, group: str, consumer: str, max_items: int) -> None:
        _check(check_name, "stream", stream)
        _check(check_name, "group", group)
        _check(check_name, "consumer", consumer)
        _check(self.state.check_group, stream, group)
        if max_items < 1:
            raise _Invalid("max_items must be >= 1")

    async def Ack(self, request: queue_pb2.QueueAckRequest, context: grpc.aio.ServicerContext) -> queue_pb2.QueueAckReply:  # noqa: N802
        try:
            _check(check_name, "stream", request.stream)
            ids = [int(i) for i in request.entry_ids]
            if request.stage:
                _check(check_stage, request.stage)
        except (_Invalid, ValueError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad Ack: {exc}")
        n = await self.state.ack(request.stream, ids, request.stage, list(request.sample_ids),
                                 max(1, request.ledger_max))
        return queue_pb2.QueueAckReply(acked=n)

    async def Depth(self, request: queue_pb2.QueueDepthRequest, context: grpc.aio.ServicerContext) -> queue_pb2.QueueDepthReply:  # noqa: N802
        try:
            _check(check_name, "stream", request.stream)
        except _Invalid as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        d, q, leased = self.state.depth(request.stream)
        return queue_pb2.QueueDepthReply(depth=d, queued=q, leased=leased)

    async def RecordStage(self, request: queue_pb2.QueueRecordStageRequest, context: grpc.aio.ServicerContext):  # noqa: N802
        try:
            _check(check_stage, request.stage)
            _check(check_sample_ids, list(request.sample_ids))
        except _Invalid as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        n = self.state.record(list(request.sample_ids), request.stage, max(1, request.ledger_max))
        return queue_pb2.QueueRecordStageReply(recorded=n)

    async def GetStages(self, request: queue_pb2.QueueGetStagesRequest, context: grpc.aio.ServicerContext):  # noqa: N802
        return queue_pb2.QueueGetStagesReply(stages=self.state.stages(list(request.sample_ids)))


def _deliveries(got: list[Delivered], chunk_bytes: int):  # noqa: ANN202 - generator of Delivery
    cs = max(4096, chunk_bytes or (2 << 20))
    for d in got:
        e = d.entry
        n = frame_len(e.data)
        h = queue_pb2.QueueDeliveryHeader(entry_id=str(e.id), producer=e.producer, seq=e.seq, sample_ids=e.sample_ids,
                                     fresh=d.fresh, delivery_count=e.deliveries, frame_bytes=n)
        if n <= min(cs, INLINE_MAX):
            h.inline = b"".join(e.data) if isinstance(e.data, list) else bytes(e.data)
            yield queue_pb2.QueueDelivery(header=h)
            continue
        yield queue_pb2.QueueDelivery(header=h)
        if isinstance(e.data, list):  # as the producer sent them; the serializer frames each
            yield from e.data
            continue
        view = memoryview(e.data)
        for off in range(0, n, cs):
            yield view[off : off + cs]


def service_handler(servicer: QueueServicer) -> grpc.GenericRpcHandler:
    """QueueService handlers; frame chunks use the zero-copy codec (:mod:`.chunkcodec`)."""
    pb = queue_pb2
    unary = grpc.unary_unary_rpc_method_handler
    deliveries = chunk_serializer(DELIVERY_CHUNK_FIELD)
    return grpc.method_handlers_generic_handler("meshrl.v1.QueueService", {
        "Put": grpc.stream_unary_rpc_method_handler(
            servicer.Put, request_deserializer=chunk_deserializer(PUT_CHUNK_FIELD, pb.QueuePutMessage),
            response_serializer=pb.QueuePutReply.SerializeToString),
        "Get": grpc.unary_stream_rpc_method_handler(
            servicer.Get, request_deserializer=pb.QueueGetRequest.FromString, response_serializer=deliveries),
        "Reclaim": grpc.unary_stream_rpc_method_handler(
            servicer.Reclaim, request_deserializer=pb.QueueReclaimRequest.FromString, response_serializer=deliveries),
        "Ack": unary(servicer.Ack, request_deserializer=pb.QueueAckRequest.FromString,
                     response_serializer=pb.QueueAckReply.SerializeToString),
        "Depth": unary(servicer.Depth, request_deserializer=pb.QueueDepthRequest.FromString,
                       response_serializer=pb.QueueDepthReply.SerializeToString),
        "RecordStage": unary(servicer.RecordStage, request_deserializer=pb.QueueRecordStageRequest.FromString,
                             response_serializer=pb.QueueRecordStageReply.SerializeToString),
        "GetStages": unary(servicer.GetStages, request_deserializer=pb.QueueGetStagesRequest.FromString,
                           response_serializer=pb.QueueGetStagesReply.SerializeToString),
    })


class EmbeddedBroker:
    """Hosts the QueueService on ``host:port`` inside the current event loop.

    ``credential``: the job credential every call must carry (default: :func:`services.auth.current`)."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, aof_path: str | Path | None = None,
                 fsync: bool = False, max_frame_bytes: int = 1 << 30,
                 credential: auth.JobCredential | None = None) -> None:
        self.host, self._port = host, port
        self.credential = auth.resolve(credential)
        self.state = BrokerState(aof_path, fsync=fsync)
        self._servicer = QueueServicer(self.state, max_frame_bytes=max_frame_bytes)
        self._server: grpc.aio.Server | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> str:
        return f"{self.host}:{self._port}"

    async def start(self) -> "EmbeddedBroker":
        self._server = grpc.aio.server(options=grpc_options(),
                                       interceptors=[self.credential.aio_server_interceptor()])
        self._server.add_generic_rpc_handlers((service_handler(self._servicer),))
        self._port = self._server.add_insecure_port(f"{self.host}:{self._port}")
        if self._port == 0:
            raise OSError(f"could not bind the queue broker on {self.host}")
        await self._server.start()
        log.info("queue broker listening on %s", self.address)
        return self

    async def stop(self, grace: float = 1.0) -> None:
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        self.state.close()

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()
