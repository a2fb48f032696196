"""What one trainer rank does after the launcher started it (imports torch)."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from services.config.views import TrainerView


def _make_source(spec: TrainerView, vocab_size: int, consumer: str | None, policy: Any) -> Any:
    from trainer_svc.intake import QueueIntake, SyntheticIntake

    if spec.queues is None:
        s = spec.synthetic
        return SyntheticIntake(
            train_batch_size=spec.data.train_batch_size, n=spec.rollout.n, prompt_len=s.prompt_len,
            response_len=s.response_len, vocab_size=vocab_size, seed=s.seed,
        )
    from services.queues import make_queue

    queue = make_queue(spec.queues, stream="experience", group="trainer", consumer=consumer or "trainer-0")
    # With periodic checkpoints, a step's items are acked once a checkpoint holds it: a hard
    # kill then neither loses a trained step nor trains an item twice.
    return QueueIntake(queue, train_batch_size=spec.data.train_batch_size, max_staleness=policy.staleness,
                       defer_acks=spec.trainer.save_freq > 0, policy=policy)


def run_rank(spec: TrainerView, *, consumer: str | None = None, log_level: str = "INFO") -> int:
    """Build this rank's worker and run the service loop; returns the exit code."""
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=log_level.upper() if rank == 0 else "WARNING",
        format=f"%(asctime)s trainer[{rank}] %(levelname)s %(name)s: %(message)s",
    )
    import torch
    from prometheus_client import CollectorRegistry

    from services.metrics import MetricsServer
    from services.readiness import announce_ready
    from trainer_svc.fsdp import init_distributed, set_torch_threads
    from trainer_svc.loop_metrics import TrainerMetrics
    from trainer_svc.promotion import make_policy
    from trainer_svc.train_loop import TrainerService
    from trainer_svc.worker import TrainerWorker

    res = spec.resources
    if res.device == "cuda" and not torch.cuda.is_available():
        print("trainer: resources.device (the job's services.trainer.device) is cuda, but torch sees no CUDA "
              "device on this machine; set services.trainer.device=cpu", file=sys.stderr, flush=True)
        return 2
    set_torch_threads(res.torch_threads, res.nproc)
    ctx = init_distributed(res.device, spec.trainer.collective_timeout_s)
    worker = TrainerWorker(spec, ctx)
    source = publisher = metrics = server = None
    if ctx.rank == 0:
        registry = CollectorRegistry()
        metrics = TrainerMetrics(registry)
        if spec.weights is not None:
            from trainer_svc.weights.publisher import WeightPublisher

            publisher = WeightPublisher(spec.weights, registry=registry).start()
    policy = make_policy(spec, publisher)  # rank 0 decides with the publisher; the others judge only
    if ctx.rank == 0:
        source = _make_source(spec, worker.model.config.vocab_size, consumer, policy)
    def announce() -> None:
        addresses = {"metrics": f"{server.host}:{server.port}"}
        if publisher is not None:
            addresses["weights"] = publisher.control_address
        announce_ready("trainer", consumer or "trainer-0", addresses, world_size=ctx.world_size, device=res.device,
                       dtype=str(next(worker.model.parameters()).dtype).removeprefix("torch."),
                       version=worker.version, step=service.step_no)

    service = TrainerService(spec, ctx, worker, source=source, publisher=publisher, metrics=metrics,
                             on_ready=announce if ctx.rank == 0 else None, policy=policy)
    service.install_signal_handlers()
    try:
        service.resume()
        if ctx.rank == 0:
            server = MetricsServer(
                metrics.registry, host=res.host, port=res.metrics_port,
                ready=lambda: service.ready, status=service.status,
            ).start()
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
