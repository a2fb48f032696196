"""The reward service: ``rollouts`` → decode + score → ``experience``, plus gRPC ``Score``.

    server = RewardServer(cfg, decoder, queue_cfg=queues, consumer="reward-0", resources=RewardProcess(...))
    await server.start()          # sandbox pool, gRPC, /health /ready /metrics, queues
    await server.run(stop_event)  # lease, score, put, ack -- until stop_event is set
    await server.stop()

Validation groups (``meta_info["validate"]``, generated with ``rollout.val_kwargs``) go to
``validation_stream`` instead, read by the job controller, never trained on.

Delivery: a leased group is acked only after its scored copy was put into ``experience``
(at-least-once; the trainer dedupes on ``sample_id``). A group that cannot be scored at
all (missing columns, undecodable ids) is logged, counted in
``meshrl_reward_malformed_total{path="queue"}``, recorded as ``dropped`` and acked so it
cannot block the stream; the other groups of the same lease are unaffected.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import grpc

from reward_svc.decode import Decoder
from reward_svc.manager import MalformedBatchError, RewardManager, ScoreReport
from reward_svc.metrics import RewardMetrics
from reward_svc.sandbox.pool import SandboxPool, SandboxSpec
from services import auth
from services.config.loader import ConfigError
from services.config.reward import RewardConfig
from services.config.views import RewardProcess
from services.metrics import MetricsServer

log = logging.getLogger("meshrl.reward")

#: After a get that found fewer groups than ``get_batch``, the reader waits this long before
#: the next one, so the groups a replica delivers one write at a time are leased, put and
#: acked together: each queue call costs both ends about a millisecond of CPU whatever it
#: carries, and a quick-start step's 32 groups took 43 calls (docs/performance.md). A group
#: waits at most this long more for its score.
GATHER_S = 0.1


def sandbox_spec(cfg: RewardConfig) -> SandboxSpec:
    """The sandbox settings of a :class:`RewardConfig`."""
    fn = cfg.custom_reward_function
    return SandboxSpec(
        path=fn.path,
        name=fn.name,
        kwargs=dict(fn.reward_kwargs),
        num_workers=cfg.num_workers,
        call_timeout_s=cfg.call_timeout_s,
        batch_timeout_s=cfg.batch_timeout_s,
        memory_limit_mb=cfg.memory_limit_mb,
        allow_network=cfg.allow_network,
        max_result_bytes=cfg.max_result_bytes,
        max_extra_columns=cfg.max_extra_columns,
        start_timeout_s=cfg.worker_start_timeout_s,
    )


class RewardServer:
    """One reward service instance (see module doc)."""

    def __init__(self, cfg: RewardConfig, decoder: Decoder, *, queue_cfg: Any = None, consumer: str = "reward-0",
                 credential: auth.JobCredential | None = None, resources: RewardProcess | None = None) -> None:
        self.cfg = cfg
        self.credential = credential  # None: the process's job credential, resolved when gRPC starts
        self.res = resources or RewardProcess()
        self.queue_cfg = queue_cfg
        self.consumer = consumer
        self.metrics = RewardMetrics()
        needs_pool = not cfg.reward_model.enable and (cfg.custom_reward_function.path is not None or cfg.isolate_builtin)
        self.pool = SandboxPool(sandbox_spec(cfg)) if needs_pool else None
        self.decoder = decoder
        self.manager: RewardManager | None = None if cfg.reward_model.enable else RewardManager(cfg, decoder, self.pool)
        self.http: MetricsServer | None = None
        self.grpc_server: grpc.aio.Server | None = None
        self.grpc_port: int | None = None
        self._inq = self._outq = self._valq = None
        self._ready = False

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> "RewardServer":
        """Start the probes (``/ready`` is 503 until the end), the sandbox pool (or the reward
        model), gRPC and the queues; on failure, release what was started and raise."""
        self.http = MetricsServer(
            self.metrics.registry, host=self.res.host, port=self.res.metrics_port, ready=lambda: self._ready, status=self.status
        ).start()
        try:
            await self._start_rest()
        except BaseException:
            await self.stop()
            raise
        self._ready = True
        return self

    async def _start_rest(self) -> None:
        if self.pool is not None:  # first: a broken user function fails the start at once
            await asyncio.to_thread(self.pool.start)
        if self.manager is None:  # the reward model is loaded before reporting ready
            from reward_svc.reward_model import RewardModelScorer

            rmc, device = self.cfg.reward_model, self.res.device
            if device == "cuda":
                import torch

                if not torch.cuda.is_available():
                    raise ConfigError("resources.device (the job's services.reward.device) is cuda, but torch sees "
                                      "no CUDA device on this machine; set services.reward.device=cpu")
            rm = await asyncio.to_thread(
                RewardModelScorer, rmc.path, micro_batch_size=rmc.micro_batch_size, max_length=rmc.max_length, device=device
            )
            self.manager = RewardManager(self.cfg, self.decoder, rm=rm)
        await asyncio.to_thread(self._warm_up)
        if self.res.grpc_port is not None:
            await self._start_grpc()
        if self.queue_cfg is not None:
            from services.queues import make_queue

            self._inq = make_queue(
                self.queue_cfg, stream=self.cfg.input_stream, group=self.cfg.consumer_group, consumer=self.consumer,
                credential=self.credential if self.queue_cfg.type == "embedded" else None,
            )
            cred = self.credential if self.queue_cfg.type == "embedded" else None
            self._outq = make_queue(self.queue_cfg, stream=self.cfg.output_stream, group=self.cfg.output_group,
                                    consumer=self.consumer, credential=cred)
            self._valq = make_queue(self.queue_cfg, stream=self.cfg.validation_stream, group=self.cfg.validation_group,
                                    consumer=self.consumer, credential=cred)
            await self._inq.depth()  # fail fast if the backend is unreachable

    async def stop(self) -> None:
        """Stop serving and release everything this instance started (idempotent; every
        step bounded, so a dead backend cannot hold the shutdown)."""
        self._ready = False
        grpc_server, self.grpc_server = self.grpc_server, None
        if grpc_server is not None:
            await grpc_server.stop(grace=1.0)
        queues, self._inq, self._outq, self._valq = (self._inq, self._outq, self._valq), None, None, None
        for q in queues:
            if q is not None:
                try:
                    await asyncio.wait_for(q.close(), timeout=5.0)
                except (asyncio.TimeoutError, Exception) as exc:  # noqa: BLE001 - shutting down anyway
                    log.warning("reward: closing a queue failed: %s", exc)
        http, self.http = self.http, None
        if http is not None:
            http.stop()
        pool, self.pool = self.pool, None
        if pool is not None:
            await asyncio.to_thread(pool.close)

    def status(self) -> dict[str, Any]:
        """The /status JSON: mean score per data source, sandbox state."""
        return {
            "ready": self._ready,
            "mean_score": self.metrics.mean_scores(),
            "sandbox_network": self.pool.network if self.pool else None,
            "worker_restarts": self.pool.restarts if self.pool else 0,
            "grpc_port": self.grpc_port,
        }

    def _warm_up(self) -> None:
        """Run one dummy sample through wire + decode + scoring before reporting ready, so the
        first real group does not pay seconds of lazy imports (tensordict, torch ops)."""
        import numpy as np
        import torch

        from services import wire
        from services.protocol import DataProto

        data = DataProto.from_dict(
            tensors={"responses": torch.zeros((1, 2), dtype=torch.int64), "attention_mask": torch.ones((1, 3), dtype=torch.int64)},
            non_tensors={
                self.cfg.reward_fn_key: np.array(["meshrl/warm-up"], dtype=object),
                "reward_model": np.array([{"ground_truth": "0"}], dtype=object),
                "sample_id": np.array(["warm-up"], dtype=object),
            },
        )
        data = wire.decode(wire.encode(data))
        if self.pool is None and self.manager.rm is None:  # user code / a model: not called for a dummy
            self.manager.score_many([data])
        data.select_idxs([0])
        wire.encode(data)

    # -- scoring ---------------------------------------------------------------------------

    def _score_many(self, datas: list[Any], path: str) -> list[Any]:
        """Score groups; each entry is ``(data, report)`` or an exception. Records metrics."""
        t0 = time.perf_counter()
        try:
            outs = self.manager.score_many(datas)
        except Exception:  # noqa: BLE001 - isolate the group that broke the batch
            outs = []
            for d in datas:
                try:
                    outs.append(self.manager.score_many([d])[0])
                except Exception as exc:  # noqa: BLE001
                    outs.append(MalformedBatchError(f"cannot score group: {type(exc).__name__}: {exc}"))
        self.metrics.latency.observe(time.perf_counter() - t0)
        for out in outs:
            if isinstance(out, Exception):
                self.metrics.malformed.labels(path).inc()
            else:
                rep: ScoreReport = out[1]
                self.metrics.groups.labels(path).inc()
                self.metrics.observe(rep.data_sources, rep.scores, rep.error_kinds)
        if self.pool is not None:
            self.metrics.restarts.set(self.pool.restarts)
        return outs

    def _score_and_encode(self, items: list[Any]) -> tuple[list[tuple[Any, Any]], list[tuple[Any, Exception]]]:
        """Score leased groups and encode the results (off the event loop).

        Returns ``(good, bad)``: ``good`` holds each leased item with the frame to put and
        whether it is a validation group, ``bad`` pairs each unusable item with its error.
        """
        from services import wire
        from services.queues import RawItem

        outs = self._score_many([it.data for it in items], "queue")
        good, bad = [], []
        for it, out in zip(items, outs, strict=True):
            if isinstance(out, Exception):
                bad.append((it, out))
                continue
            data = out[0]
            try:
                ids = tuple(str(s) for s in data.non_tensor_batch["sample_id"].tolist())
                good.append((it, RawItem(wire.encode(data), ids), bool((data.meta_info or {}).get("validate"))))
            except (TypeError, ValueError, KeyError) as exc:
                self.metrics.malformed.labels("queue").inc()
                bad.append((it, exc))
        return good, bad

    async def _deliver(self, good: list[tuple[Any, Any, bool]], bad: list[tuple[Any, Exception]]) -> None:
        """Put the scored groups (training ones to ``output_stream``, validation ones to
        ``validation_stream``), then ack them; ack the unusable ones as dropped."""
        for it, exc in bad:
            log.error("reward: dropping group %s (samples %s): %s", it.id, list(it.sample_ids)[:4], exc)
        for queue, stream, part in ((self._outq, self.cfg.output_stream, [g for g in good if not g[2]]),
                                    (self._valq, self.cfg.validation_stream, [g for g in good if g[2]])):
            if not part:
                continue
            try:
                # "scored" goes to the ledger once: a redelivered group must not set back
                # samples the trainer already took
                first = [raw for it, raw, _v in part if getattr(it, "delivery_count", 1) <= 1]
                again = [raw for it, raw, _v in part if getattr(it, "delivery_count", 1) > 1]
                if first:
                    await queue.put_frames(first, stage="scored")
                if again:
                    await queue.put_frames(again)
            except Exception as exc:  # noqa: BLE001 - not acked: the groups are redelivered later
                self.metrics.put_failures.inc()
                log.error("reward: put to %s failed, %d groups left unacked: %s", stream, len(part), exc)
            else:
                await self._inq.ack([it for it, _r, _v in part])
        if bad:
            await self._inq.ack([it for it, _ in bad], stage="dropped")

    async def step(self) -> int:
        """Lease one batch of groups, score, put, ack. Returns how many groups were leased."""
        items = await self._inq.get(self.cfg.get_batch, self.cfg.get_timeout_s)
        if items:
            await self._deliver(*await asyncio.to_thread(self._score_and_encode, items))
        return len(items)

    async def run(self, stop: asyncio.Event) -> None:
        """Consume ``input_stream`` until ``stop`` is set (no-op without a queue config).

        Three stages overlap: leasing the next batch, scoring (in a thread) the current
        one, and putting/acking the previous one. At most two batches wait between the
        stages; on stop, batches already leased are still scored and delivered.
        """
        if self._inq is None:
            await stop.wait()
            return
        leased: asyncio.Queue = asyncio.Queue(maxsize=2)
        # entry ids leased and not yet delivered: our own lease idle past lease_idle_s (a
        # slow scorer) comes back from our own get, and must not be scored a second time
        held: set[Any] = set()

        async def reader() -> None:
            """Lease batches until ``stop``; a stop interrupts a pending get at once (what it
            may have leased stays pending in the backend and is redelivered)."""
            stopped = asyncio.create_task(stop.wait())
            try:
                while not stop.is_set():
                    getter = asyncio.create_task(self._inq.get(self.cfg.get_batch, self.cfg.get_timeout_s))
                    await asyncio.wait({getter, stopped}, return_when=asyncio.FIRST_COMPLETED)
                    if not getter.done():
                        getter.cancel()
                        await asyncio.gather(getter, return_exceptions=True)
                        break
                    try:
                        items = getter.result()
                    except Exception as exc:  # noqa: BLE001 - a backend outage must not kill the service
                        log.error("reward: get from %s failed: %s", self.cfg.input_stream, exc)
                        await asyncio.wait({stopped}, timeout=min(1.0, self.cfg.get_timeout_s))
                        continue
                    partial = len(items) < self.cfg.get_batch
                    items = [it for it in items if it.id not in held]
                    if items:
                        held.update(it.id for it in items)
                        await leased.put(items)  # the loop below always drains: bounded by one scoring
                    if partial and items:  # let the next groups gather: one get, put and ack for several
                        await asyncio.wait({stopped}, timeout=GATHER_S)
            finally:
                stopped.cancel()
            await leased.put(None)

        async def deliver(items, good, bad) -> None:
            try:
                await self._deliver(good, bad)
            except Exception as exc:  # noqa: BLE001 - unacked items are redelivered after lease_idle_s
                log.error("reward: delivery failed: %s", exc)
            finally:
                held.difference_update(it.id for it in items)  # delivered, or left to a later reclaim

        read_task = asyncio.create_task(reader())
        pending: asyncio.Task | None = None
        try:
            while True:
                items = await leased.get()
                if items is None:
                    break
                try:
                    good, bad = await asyncio.to_thread(self._score_and_encode, items)
                except Exception as exc:  # noqa: BLE001 - left unacked: redelivered after lease_idle_s
                    log.error("reward: scoring %d groups failed: %s", len(items), exc)
                    held.difference_update(it.id for it in items)
                    continue
                if pending is not None:
                    await pending
                pending = asyncio.create_task(deliver(items, good, bad))
        finally:
            if pending is not None:
                await pending
            read_task.cancel()
            try:
                await read_task
            except asyncio.CancelledError:
                pass

    # -- gRPC --------------------------------------------------------------------------------

    async def _start_grpc(self) -> None:
        from services.pb import reward_pb2_grpc

        opts = [
            ("grpc.max_receive_message_length", self.cfg.grpc_max_message_bytes),
            ("grpc.max_send_message_length", self.cfg.grpc_max_message_bytes),
            ("grpc.so_reuseport", 0),  # never share a port with another server silently
        ]
        credential = auth.resolve(self.credential)  # every call must carry the job's credential
        self.grpc_server = grpc.aio.server(options=opts, interceptors=[credential.aio_server_interceptor()])
        reward_pb2_grpc.add_RewardServiceServicer_to_server(_Servicer(self), self.grpc_server)
        port = self.grpc_server.add_insecure_port(f"{self.res.host}:{self.res.grpc_port}")
        if port == 0:
            raise RuntimeError(f"cannot bind the RewardService gRPC port {self.res.host}:{self.res.grpc_port}")
        self.grpc_port = port
        await self.grpc_server.start()

    def score_frame(self, frame: bytes) -> tuple[bytes, ScoreReport]:
        """Decode a wire frame, score it, encode the result. Raises ValueError on bad input."""
        from services import wire

        try:
            data = wire.decode(bytearray(frame), max_frame_bytes=self.cfg.grpc_max_message_bytes)
        except wire.WireError as exc:
            self.metrics.malformed.labels("grpc").inc()
            raise ValueError(f"malformed frame: {exc}") from None
        out = self._score_many([data], "grpc")[0]
        if isinstance(out, Exception):
            raise ValueError(str(out))
        scored, report = out
        return bytes(wire.encode(scored)), report


class _Servicer:
    """gRPC glue for :meth:`RewardServer.score_frame`."""

    def __init__(self, server: RewardServer) -> None:
        self.server = server

    async def Score(self, request, context):  # noqa: N802 (gRPC method name)
        from services.pb import reward_pb2

        try:
            frame, rep = await asyncio.to_thread(self.server.score_frame, request.frame)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)[:4000])
        n = len(rep.scores)
        return reward_pb2.RewardScoreResponse(
            frame=frame,
            num_samples=n,
            num_errors=sum(1 for k in rep.error_kinds if k is not None),
            mean_score=(sum(rep.scores) / n) if n else 0.0,
        )
