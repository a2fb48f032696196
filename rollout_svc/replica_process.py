"""Assemble and run one replica process: engine, stream loop, gRPC, HTTP probes, weights."""

from __future__ import annotations

import asyncio
import json
import logging
import signal

from rollout_svc.settings import ReplicaSettings

log = logging.getLogger(__name__)


async def serve(settings: ReplicaSettings, *, name: str) -> int:
    """Run until SIGTERM/SIGINT; returns the process exit code."""
    from rollout_svc.engine import RolloutEngine
    from rollout_svc.grpc_server import start_grpc_server
    from rollout_svc.metrics import RolloutMetrics
    from rollout_svc.replica import Replica
    from services.metrics import MetricsServer

    cfg = settings.rollout
    engine = RolloutEngine(cfg, settings.model, dtype=settings.dtype, tokenizer=settings.tokenizer,
                           trust_remote_code=settings.trust_remote_code)
    metrics = RolloutMetrics()
    prompts = rollouts = None
    if settings.queues is not None:
        from services.queues import make_queue

        prompts = make_queue(settings.queues, stream="prompts", group="rollout", consumer=name)
        rollouts = make_queue(settings.queues, stream="rollouts", group="rollout", consumer=name)
    agent = None
    if cfg.multi_turn.enable:
        from rollout_svc.agent.loop import AgentLoop

        agent = AgentLoop(engine, cfg, registry=metrics.registry)
    replica = Replica(engine, cfg, name=name, prompts=prompts, rollouts=rollouts, metrics=metrics, agent=agent)
    http = MetricsServer(
        metrics.registry, host=cfg.host, port=cfg.metrics_port, ready=lambda: engine.healthy, status=replica.status
    ).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    grpc_server = None
    tasks: list[asyncio.Task] = []
    try:
        await engine.start()
        if agent is not None:
            await agent.start()
        grpc_server, grpc_port = await start_grpc_server(replica, cfg.host, cfg.grpc_port)
        if prompts is not None:
            tasks.append(asyncio.create_task(replica.run(stop), name="stream-loop"))
        if settings.weights is not None:
            from rollout_svc.subscriber import run_weight_subscriber

            tasks.append(asyncio.create_task(run_weight_subscriber(replica, settings.weights, name, stop), name="weights"))
        dead = asyncio.Event()
        tasks.append(asyncio.create_task(_watch_engine(engine, stop, dead), name="engine-watchdog"))
        print("READY " + json.dumps({"grpc_port": grpc_port, "metrics_port": http.port, "replica": name}), flush=True)
        await stop.wait()
        log.info("replica %s: stopping", name)
        if tasks:
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=cfg.weight_update_timeout_s)
        return 1 if dead.is_set() else 0
    finally:
        for t in tasks:
            t.cancel()
        if grpc_server is not None:
            await grpc_server.stop(grace=2.0)
        for q in (prompts, rollouts):
            if q is not None:
                await q.close()
        if agent is not None:
            await agent.close()
        engine.shutdown()
        http.stop()


async def _watch_engine(engine, stop: asyncio.Event, dead: asyncio.Event, period_s: float = 1.0) -> None:
    """Stop the replica (exit code 1) when vLLM's engine dies, so its launcher restarts it;
    leased prompt items are reclaimed by other replicas."""
    while not stop.is_set():
        if not engine.healthy:
            log.error("vLLM engine died; stopping the replica")
            dead.set()
            stop.set()
            return
        try:
            await asyncio.wait_for(stop.wait(), timeout=period_s)
        except TimeoutError:
            pass
