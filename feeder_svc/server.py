"""The feeder process: ``python -m feeder_svc --config feeder.yaml [--state FILE] [--poll S] [a.b=c ...]``.

It reads its view (:class:`services.config.views.FeederView`), tokenizes the training data,
serves ``/health``, ``/ready`` (once it knows from the queue's ledger which prompts fed
before are still in flight), ``/metrics`` and ``/status``, announces readiness with the one
``MESHRL_READY {...}`` line and runs the feeding loop (:class:`feeder_svc.loop.FeedLoop`)
until SIGTERM. With ``async.mode=sync``, ``trainer_metrics_url`` names the trainer's
``/metrics`` (its policy version) and ``rollout_metrics_urls`` every replica's.

With ``--state FILE`` (``meshrl run`` passes ``<run_dir>/feeder.json``; on a volume under
compose or Kubernetes) the position is kept there, so a restarted feeder goes on with the
prompts not fed yet. Without it a restarted feeder starts the data order again from the top;
the prompts it re-sends carry the same ``uid``/``sample_id`` as before, and consumers drop
them as duplicates.
"""

from __future__ import annotations

import sys


def build_parser():
    from services.entrypoint import service_parser

    p = service_parser("feeder", "meshrl prompt feeder (admission control)", default_id="feeder")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between rounds")
    p.add_argument("--state", default=None, help="file keeping the feeder's position across restarts")
    p.add_argument("--hold", default=None, help="wait while this file exists before the first put (the "
                   "controller starts the feeder with the other services and releases it once the job is set up)")
    return p


def _check(view) -> str | None:
    if view.async_.mode != "sync":
        return None
    if not view.trainer_metrics_url:
        return ("async.mode=sync paces batches on the trainer's version: trainer_metrics_url is not set (the "
                "job's services.trainer.metrics_port is 0); set services.trainer.metrics_port in the job, or pass "
                "trainer_metrics_url=http://HOST:PORT/metrics")
    if not view.rollout_metrics_urls:
        return ("async.mode=sync paces batches on the replicas' served version: set "
                "rollout_metrics_urls=[http://REPLICA:PORT/metrics, ...] (every replica)")
    return None


async def serve(view, args, should_stop) -> None:
    import asyncio
    import os

    from feeder_svc.feeder import build_feeder
    from feeder_svc.loop import WATCHED, FeedLoop
    from feeder_svc.metrics import FeederMetrics
    from services.metrics.server import MetricsServer
    from services.queues import make_queue
    from services.readiness import announce_ready

    metrics = FeederMetrics()
    prompts = make_queue(view.queues, stream="prompts", group="controller", consumer="feeder", metrics=metrics.queues)
    watched = [make_queue(view.queues, stream=name, group=group, consumer="feeder", metrics=metrics.queues)
               for name, group in WATCHED]
    try:
        age = _process_age()
        print(f"feeder: up{f' {age:.2f}s after exec' if age is not None else ''}; reading the prompts", flush=True)
        feeder = build_feeder(view, prompts, state_path=args.state, log=lambda line: print(line, flush=True))
        if feeder.state.fed:
            print(f"feeder: resuming: {feeder.state.fed} prompts fed before (epoch {feeder.state.epoch}, "
                  f"position {feeder.state.cursor})", flush=True)
        loop = FeedLoop(view, feeder, metrics, watched)
        res = view.resources
        server = MetricsServer(metrics.registry, host=res.host, port=res.metrics_port, ready=lambda: loop.ready,
                               status=loop.status).start()
        try:
            announce_ready("feeder", args.id, {"metrics": f"{server.host}:{server.port}"},
                           prompts=len(feeder.dataset), max_in_flight=loop.limit)
            await loop.recover()
            while args.hold and os.path.exists(args.hold) and not should_stop():
                await asyncio.sleep(0.05)
            await loop.run(should_stop, args.poll)
        finally:
            server.stop()
    finally:
        await prompts.close()
        for q in watched:
            await q.close()


def _process_age() -> float | None:
    """Seconds since this process started (its interpreter's start and imports), or None."""
    import os

    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def main(argv: list[str] | None = None) -> int:
    import asyncio
    import signal
    import threading

    from services.config.views import FeederView
    from services.entrypoint import load_view_or_exit, parse_with_overrides

    args = parse_with_overrides(build_parser(), argv)
    view = load_view_or_exit(FeederView, args, "feeder")
    problem = _check(view)
    if problem:
        print(f"feeder: {problem}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        asyncio.run(serve(view, args, stop.is_set))
    except ValueError as exc:  # an empty data set, a state file of other data
        print(f"feeder: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
