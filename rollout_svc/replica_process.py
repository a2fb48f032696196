"""Assemble and run one replica process: engine, stream loop, gRPC, HTTP probes, weights."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from services.config.views import RolloutView

log = logging.getLogger(__name__)


async def serve(view: RolloutView, *, name: str) -> int:
    """Run until SIGTERM/SIGINT; returns the process exit code."""
    problem = device_problem(view.resources.device)
    if problem:
        print(f"rollout_svc: {problem}", file=sys.stderr, flush=True)
        return 2
    from rollout_svc.engine import RolloutEngine
    from rollout_svc.grpc_server import start_grpc_server
    from rollout_svc.metrics import RolloutMetrics
    from rollout_svc.replica import Replica
    from services.metrics import MetricsServer
    from services.readiness import announce_ready

    cfg, res = view.rollout, view.resources
    from rollout_svc.lora import LoraServing

    engine = RolloutEngine(cfg, view.model.path, dtype=view.model.dtype, tokenizer=view.model.tokenizer_path,
                           trust_remote_code=view.model.trust_remote_code,
                           lora=LoraServing.from_model_config(view.model))
    metrics = RolloutMetrics()
    prompts = rollouts = None
    if view.queues is not None:
        from services.queues import make_queue

        prompts = make_queue(view.queues, stream="prompts", group="rollout", consumer=name)
        rollouts = make_queue(view.queues, stream="rollouts", group="rollout", consumer=name)
    agent = None
    if cfg.multi_turn.enable:
        from rollout_svc.agent.loop import AgentLoop

        agent = AgentLoop(engine, cfg, registry=metrics.registry)
    replica = Replica(engine, cfg, name=name, prompts=prompts, rollouts=rollouts, metrics=metrics, agent=agent)
    http = MetricsServer(
        metrics.registry, host=res.host, port=res.metrics_port, ready=lambda: engine.healthy, status=replica.status
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
        grpc_server, grpc_port = await start_grpc_server(replica, res.host, res.grpc_port)
        if prompts is not None:
            tasks.append(asyncio.create_task(replica.run(stop), name="stream-loop"))
        if view.weights is not None:
            from rollout_svc.subscriber import run_weight_subscriber

            tasks.append(asyncio.create_task(run_weight_subscriber(replica, view.weights, name, stop), name="weights"))
        dead = asyncio.Event()
        tasks.append(asyncio.create_task(_watch_engine(engine, stop, dead), name="engine-watchdog"))
        announce_ready("rollout", name, {"grpc": f"{res.host}:{grpc_port}", "metrics": f"{http.host}:{http.port}"},
                       device=res.device, dtype=engine.served_dtype())
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


def device_problem(device: str) -> str | None:
    """Why this vLLM build cannot run on ``device`` (the job's services.rollout.device), or None."""
    from vllm.platforms import current_platform

    have = "cpu" if current_platform.is_cpu() else "cuda" if current_platform.is_cuda_alike() else current_platform.device_type
    if have != device:
        return (f"resources.device (the job's services.rollout.device) is {device}, but this vLLM build runs on {have}; "
                f"set services.rollout.device={have} or install the {device} build of vLLM")
    return None
