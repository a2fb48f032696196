"""``python -m services.launch.feeder_process --config job.yaml``: the prompt feeder on its own.

``meshrl run`` feeds prompts from inside its controller. When the services run as separate
containers (docker-compose, Kubernetes) with a Redis queue backend, this process does that
one job: it reads the job's training data, and keeps at most
``(async.max_staleness + 1) * data.train_batch_size`` prompts in flight, counting as
finished the samples the trainer reports on its ``/metrics`` (trained + dropped) divided by
``rollout.n`` — the same admission rule as the controller. It serves its own ``/health``,
``/ready`` and ``/metrics`` (``meshrl_feeder_prompts_total``, ``meshrl_feeder_in_flight_prompts``).

With ``--state FILE`` (on a volume) the feeder's position is kept there, so a restarted
feeder goes on with the prompts not fed yet (as ``meshrl run`` does with
``RUN_DIR/feeder.json``). Without it a restarted feeder starts the data order again from
the top; the prompts it re-sends carry the same ``uid``/``sample_id`` as before, and
consumers drop them as duplicates.
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m services.launch.feeder_process", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="the job spec (YAML)")
    p.add_argument("--trainer-metrics", required=True, help="the trainer's /metrics URL, e.g. http://trainer:9103/metrics")
    p.add_argument("--metrics-port", type=int, default=9104, help="port of this feeder's /health /ready /metrics")
    p.add_argument("--metrics-host", default="0.0.0.0", help="address of this feeder's /metrics")
    p.add_argument("--rollout-metrics", action="append", default=[], metavar="URL",
                   help="a replica's /metrics URL (repeat per replica); needed with async.mode=sync, where a "
                   "batch is fed only once every replica serves the trainer's version")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between trainer scrapes")
    p.add_argument("--state", default=None, help="file keeping the feeder's position across restarts")
    p.add_argument("overrides", nargs="*", help="a.b=c overrides of the spec")
    return p


async def feed(spec, trainer_metrics: str, poll: float, stop, gauges, rollout_metrics: list[str] = (),
               state: str | None = None) -> None:
    """Top the prompts stream up until ``stop`` is set; export the feeder's counters and the
    streams' depths (``gauges["control"]``, a ControlMetrics). With ``async.mode=sync`` a batch
    goes out only once every replica in ``rollout_metrics`` serves the trainer's version."""
    import asyncio

    from services.launch.feeder import build_feeder
    from services.launch.report import scrape
    from services.queues import make_queue

    control = gauges["control"]
    queue = make_queue(spec.queues, stream="prompts", group="controller", consumer="feeder", metrics=control.queues)
    watched = [make_queue(spec.queues, stream=name, group=group, consumer="feeder", metrics=control.queues)
               for name, group in (("prompts", "rollout"), ("rollouts", "reward"), ("experience", "trainer"))]
    feeder = build_feeder(spec, queue, state_path=state)
    n = spec.rollout.n
    try:
        while not stop.is_set():
            t = await asyncio.to_thread(scrape, trainer_metrics)
            if "meshrl_trainer_samples_total" not in t:  # the trainer is down or restarting
                await asyncio.sleep(poll)
                continue
            finished = (t.get("meshrl_trainer_samples_total", 0.0) + t.get("meshrl_trainer_dropped_stale_samples_total", 0.0)
                        + t.get("meshrl_trainer_dropped_error_samples_total", 0.0)) / n  # fmt: skip
            current = t.get("meshrl_trainer_policy_version")
            served = [(await asyncio.to_thread(scrape, u)).get("meshrl_rollout_served_version") for u in rollout_metrics]
            try:
                put = await feeder.top_up(int(finished), timeout=spec.queues.put_timeout_s,
                                          replicas_current=current is not None and all(v == current for v in served))
            except Exception as exc:  # noqa: BLE001 - a queue outage: the same prompts go next round
                print(f"feeder: put failed, retrying: {type(exc).__name__}: {exc}", flush=True)
                put = 0
            control.fed(put, feeder.state.fed, int(finished), feeder.max_in_flight)
            for q in watched:  # depth() sets meshrl_queue_depth_items{stream}
                try:
                    await asyncio.wait_for(q.depth(), timeout=5.0)
                except Exception:  # noqa: BLE001 - a depth we cannot read is left as it was, never fatal
                    pass
            gauges["ready"] = True
            await asyncio.sleep(poll)
    finally:
        await queue.close()
        for q in watched:
            await q.close()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import asyncio
    import signal
    import threading

    from services.config.job import JobSpecError, load_job
    from services.metrics.server import MetricsServer

    try:
        spec = load_job(args.config, args.overrides)
    except JobSpecError as exc:
        print(f"feed: {exc}", file=sys.stderr)
        return 2
    if spec.async_.mode == "sync" and not args.rollout_metrics:
        print("feed: async.mode=sync paces batches on the replicas' served version: pass --rollout-metrics URL "
              "for every replica", file=sys.stderr)
        return 2
    from services.launch.control_metrics import ControlMetrics

    control = ControlMetrics()
    gauges: dict = {"control": control, "ready": False}
    server = MetricsServer(control.registry, host=args.metrics_host, port=args.metrics_port, ready=lambda: gauges["ready"]).start()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"feeder ready metrics={args.metrics_host}:{server.port}", flush=True)
    try:
        asyncio.run(feed(spec, args.trainer_metrics, args.poll, stop, gauges, args.rollout_metrics, args.state))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
