"""What one trainer rank does after the launcher started it (imports torch)."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from services.config.trainer import TrainerServiceSpec


def _make_source(spec: TrainerServiceSpec, vocab_size: int, consumer: str | None) -> Any:
    from trainer_svc.intake import QueueIntake, SyntheticIntake

    if spec.queue is None:
        s = spec.synthetic
        return SyntheticIntake(
            train_batch_size=spec.train_batch_size, n=spec.rollout_n, prompt_len=s.prompt_len,
            response_len=s.response_len, vocab_size=vocab_size, seed=s.seed,
        )
    from services.queues import make_queue

    queue = make_queue(spec.queue, stream="experience", group="trainer", consumer=consumer or "trainer-0")
    # With periodic checkpoints, a step's items are acked once a checkpoint holds it: a hard
    # kill then neither loses a trained step nor trains an item twice.
    return QueueIntake(queue, train_batch_size=spec.train_batch_size, max_staleness=spec.max_staleness,
                       defer_acks=spec.trainer.save_freq > 0)


def run_rank(spec: TrainerServiceSpec, *, consumer: str | None = None, log_level: str = "INFO") -> int:
    """Build this rank's worker and run the service loop; returns the exit code."""
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=log_level.upper() if rank == 0 else "WARNING",
        format=f"%(asctime)s trainer[{rank}] %(levelname)s %(name)s: %(message)s",
    )
    import torch
    from prometheus_client import CollectorRegistry

    from services.metrics import MetricsServer
    from trainer_svc.fsdp import init_distributed, set_torch_threads
    from trainer_svc.train_loop import TrainerMetrics, TrainerService
    from trainer_svc.worker import TrainerWorker

    set_torch_threads(spec.trainer.torch_threads, spec.trainer.nproc)
    ctx = init_distributed(spec.trainer.device, spec.trainer.collective_timeout_s)
    worker = TrainerWorker(spec, ctx)
    source = publisher = metrics = server = None
    if ctx.rank == 0:
        registry = CollectorRegistry()
        metrics = TrainerMetrics(registry)
        source = _make_source(spec, worker.model.config.vocab_size, consumer)
        if spec.weights is not None:
            from services.weights import WeightPublisher

            publisher = WeightPublisher(spec.weights, registry=registry).start()
    service = TrainerService(spec, ctx, worker, source=source, publisher=publisher, metrics=metrics)
    service.install_signal_handlers()
    try:
        service.resume()
        if ctx.rank == 0:
            server = MetricsServer(
                metrics.registry, host=spec.trainer.metrics_host, port=spec.trainer.metrics_port,
                ready=lambda: service.ready, status=service.status,
            ).start()
            addr = f"{server.host}:{server.port}"
            extra = f" weights={publisher.control_address}" if publisher is not None else ""
            print(f"trainer ready metrics={addr} version={worker.version} step={service.step_no}{extra}", flush=True)
        code = service.run()
    finally:
        if server is not None:
            server.stop()
        if publisher is not None:
            publisher.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    sys.stdout.flush()
    return code



__all__ = ["run_rank"]
