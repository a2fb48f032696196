"""Embedded backend of :class:`services.queues.base.Queue`: a client of the gRPC QueueService.

Frames travel in ``chunk_bytes`` pieces. Connection errors (the broker restarting) are
retried with backoff by the base class; a Put retried after a lost reply is harmless
(the broker drops a sequence number it already has), and entries leased by a Get whose
reply was lost are recovered by re-reading this consumer's own leases.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import grpc

from services import auth
from services.config.queues import EmbeddedQueueConfig
from services.pb import queue_pb2, queue_pb2_grpc
from services.queues.base import PutOutcome, Queue, RawItem, RawLeased
from services.queues.broker_server import INLINE_MAX, grpc_options
from services.queues.chunkcodec import DELIVERY_CHUNK_FIELD, PUT_CHUNK_FIELD, chunk_deserializer, chunk_serializer
from services.queues.stats import QueueMetrics

_TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
              grpc.StatusCode.ABORTED}
_PUT_WAIT_S = 0.5  # the broker waits this long for room before answering "full" (the base retries)


class BrokerUnreachable(ConnectionError):
    """A call to the broker failed in a way worth retrying (it may be restarting)."""


class _Connection:
    """One grpc.aio channel to the broker and the calls made on it."""

    def __init__(self, address: str, loop: asyncio.AbstractEventLoop, credential: auth.JobCredential) -> None:
        self.loop = loop
        self.md = credential.metadata()  # passed on every call (cheaper than a channel interceptor)
        self.channel = grpc.aio.insecure_channel(address, options=grpc_options())
        self.stub = queue_pb2_grpc.QueueServiceStub(self.channel)
        svc = "/meshrl.v1.QueueService/"
        deliveries = chunk_deserializer(DELIVERY_CHUNK_FIELD, queue_pb2.QueueDelivery)
        self.put = self.channel.stream_unary(
            svc + "Put", request_serializer=chunk_serializer(PUT_CHUNK_FIELD),
            response_deserializer=queue_pb2.QueuePutReply.FromString)
        self.get = self.channel.unary_stream(
            svc + "Get", request_serializer=queue_pb2.QueueGetRequest.SerializeToString, response_deserializer=deliveries)
        self.reclaim = self.channel.unary_stream(
            svc + "Reclaim", request_serializer=queue_pb2.QueueReclaimRequest.SerializeToString,
            response_deserializer=deliveries)


class EmbeddedQueue(Queue):
    """A stream on the embedded broker at ``cfg.address``; every call carries ``credential``
    (default: the process's job credential, :func:`services.auth.current`)."""

    transient_errors = (BrokerUnreachable,)

    def __init__(self, cfg: EmbeddedQueueConfig, *, stream: str, group: str, consumer: str,
                 metrics: QueueMetrics | None = None, credential: auth.JobCredential | None = None) -> None:
        super().__init__(cfg, stream=stream, group=group, consumer=consumer, metrics=metrics)
        self.cfg: EmbeddedQueueConfig = cfg
        self.credential = auth.resolve(credential)
        self._conn: _Connection | None = None  # opened on first use, on the loop that uses it
        self._recover = False
        self._held: set[str] = set()

    @property
    def _rpc(self) -> "_Connection":
        """The gRPC channel and its calls, bound to the running event loop.

        grpc.aio channels belong to the loop they were made on; a queue built outside a loop
        (or used from a new one) opens its channel lazily, on the loop that first uses it."""
        loop = asyncio.get_running_loop()
        if self._conn is None or self._conn.loop is not loop:
            self._conn = _Connection(self.cfg.address, loop, self.credential)
        return self._conn

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and conn.loop is asyncio.get_running_loop():
            await conn.channel.close()

    def _on_disconnect(self) -> None:
        self._recover = True

    async def _call(self, coro):  # noqa: ANN001, ANN202 - awaits one RPC, maps its errors
        try:
            return await coro
        except grpc.aio.AioRpcError as exc:
            if exc.code() in _TRANSIENT:
                raise BrokerUnreachable(f"{exc.code().name}: {exc.details()}") from exc
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise ValueError(f"queue broker refused the request: {exc.details()}") from exc
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise auth.CredentialError(f"the queue broker at {self.cfg.address} refused this job credential "
                                           f"({self.credential.source}): {exc.details()}") from exc
            raise

    # ------------------------------------------------------------------ put
    async def _put_once(self, items: Sequence[RawItem], seqs: Sequence[int], stage: str | None) -> PutOutcome:
        cfg = self.cfg
        cs = cfg.chunk_bytes

        async def messages() -> AsyncIterator[queue_pb2.QueuePutMessage]:
            yield queue_pb2.QueuePutMessage(batch=queue_pb2.QueuePutBatch(
                stream=self.stream, producer=self.producer_id, stage=stage or "", max_depth=cfg.max_depth,
                wait_ms=int(_PUT_WAIT_S * 1000), ledger_max=cfg.ledger_max_entries))
            for it, seq in zip(items, seqs, strict=True):
                n = len(it.payload)
                head = queue_pb2.QueuePutItem(seq=seq, sample_ids=it.sample_ids, frame_bytes=n)
                if n <= min(cs, INLINE_MAX):
                    head.inline = bytes(it.payload)
                    yield queue_pb2.QueuePutMessage(item=head)
                    continue
                yield queue_pb2.QueuePutMessage(item=head)
                view = memoryview(it.payload)
                for off in range(0, n, cs):
                    yield view[off : off + cs]  # framed as QueuePutMessage.chunk by the serializer

        reply = await self._call(self._rpc.put(messages(), timeout=cfg.op_timeout_s + _PUT_WAIT_S, metadata=self._rpc.md))
        return PutOutcome([i or None for i in reply.entry_ids], reply.gaps)

    # ------------------------------------------------------------------ get
    async def _collect(self, call) -> list[RawLeased]:  # noqa: ANN001 - a server-streaming call
        out: list[RawLeased] = []
        cur: RawLeased | None = None
        buf = bytearray()
        off = want = 0  # bytes of the current frame received / expected (buf empty: discard them)
        try:
            async for msg in call:
                if not isinstance(msg, memoryview) and msg.WhichOneof("kind") == "header":
                    if cur is not None:
                        raise BrokerUnreachable("the broker started an item inside a frame")
                    h = msg.header
                    r = RawLeased(id=h.entry_id, payload=b"", sample_ids=tuple(h.sample_ids), fresh=tuple(h.fresh),
                                  delivery_count=h.delivery_count, producer=h.producer, seq=h.seq)
                    out.append(r)
                    if len(h.inline) == h.frame_bytes:
                        r.payload = h.inline
                        continue
                    cur, off, want = r, 0, h.frame_bytes
                    if h.frame_bytes > self.cfg.max_frame_bytes:  # refuse to allocate it; drain and drop
                        r.error = f"frame of {h.frame_bytes} bytes exceeds max_frame_bytes={self.cfg.max_frame_bytes}"
                        buf = bytearray()
                    else:
                        buf = r.payload = bytearray(h.frame_bytes)
                else:
                    if cur is None:
                        raise BrokerUnreachable("broker sent a chunk without a header")
                    piece = msg if isinstance(msg, memoryview) else msg.chunk
                    n = len(piece)
                    if off + n > want:
                        raise BrokerUnreachable("the broker sent more bytes than the frame holds")
                    if buf:
                        buf[off : off + n] = piece
                    off += n
                    if off == want:
                        cur = None
        except grpc.aio.AioRpcError as exc:
            if exc.code() in _TRANSIENT:
                raise BrokerUnreachable(f"{exc.code().name}: {exc.details()}") from exc
            raise
        if cur is not None:
            raise BrokerUnreachable("the broker's stream ended inside a frame")
        # only now are they ours: items of a call that broke midway come back by recovery
        self._held.update(r.id for r in out)
        return out

    async def _read(self, max_items: int, timeout_s: float) -> list[RawLeased]:
        cfg = self.cfg
        if self._recover:
            got = await self._collect(self._rpc.reclaim(queue_pb2.QueueReclaimRequest(
                stream=self.stream, group=self.group, consumer=self.consumer, min_idle_ms=0, max_items=max_items,
                dedupe_window=cfg.dedupe_window, chunk_bytes=cfg.chunk_bytes, own_only=True,
                exclude_ids=sorted(self._held)), timeout=cfg.op_timeout_s, metadata=self._rpc.md))
            self._recover = False
            if got:
                return got
        wait = min(timeout_s, cfg.op_timeout_s / 2)
        return await self._collect(self._rpc.get(queue_pb2.QueueGetRequest(
            stream=self.stream, group=self.group, consumer=self.consumer, max_items=max_items,
            wait_ms=int(wait * 1000), dedupe_window=cfg.dedupe_window, chunk_bytes=cfg.chunk_bytes),
            timeout=wait + cfg.op_timeout_s, metadata=self._rpc.md))

    async def _claim_idle(self, min_idle_s: float, max_items: int) -> list[RawLeased]:
        cfg = self.cfg
        return await self._collect(self._rpc.reclaim(queue_pb2.QueueReclaimRequest(
            stream=self.stream, group=self.group, consumer=self.consumer, min_idle_ms=int(min_idle_s * 1000),
            max_items=max_items, dedupe_window=cfg.dedupe_window, chunk_bytes=cfg.chunk_bytes),
            timeout=cfg.op_timeout_s, metadata=self._rpc.md))

    # ------------------------------------------------------------------ ack / depth / ledger
    async def _ack_once(self, items: Sequence[RawLeased], stage: str | None) -> int:
        sids = [s for r in items for s, f in zip(r.sample_ids, r.fresh, strict=False) if f] if stage else []
        reply = await self._call(self._rpc.stub.Ack(queue_pb2.QueueAckRequest(
            stream=self.stream, group=self.group, entry_ids=[r.id for r in items], stage=stage or "",
            sample_ids=sids, ledger_max=self.cfg.ledger_max_entries), timeout=self.cfg.op_timeout_s,
            metadata=self._rpc.md))
        for r in items:
            self._held.discard(r.id)
        return reply.acked

    async def _depth_once(self) -> int:
        reply = await self._call(self._rpc.stub.Depth(queue_pb2.QueueDepthRequest(stream=self.stream),
                                                  timeout=self.cfg.op_timeout_s, metadata=self._rpc.md))
        return int(reply.depth)

    async def _record_once(self, sample_ids: Sequence[str], stage: str) -> None:
        await self._call(self._rpc.stub.RecordStage(queue_pb2.QueueRecordStageRequest(
            sample_ids=list(sample_ids), stage=stage, ledger_max=self.cfg.ledger_max_entries),
            timeout=self.cfg.op_timeout_s, metadata=self._rpc.md))

    async def _stages_once(self, sample_ids: Sequence[str]) -> list[str | None]:
        reply = await self._call(self._rpc.stub.GetStages(queue_pb2.QueueGetStagesRequest(sample_ids=list(sample_ids)),
                                                      timeout=self.cfg.op_timeout_s, metadata=self._rpc.md))
        return [s or None for s in reply.stages]
