"""``python -m services.launch.feeder_process --config feeder.yaml [a.b=c ...]``: the prompt feeder on its own.

``meshrl run`` feeds prompts from inside its controller. When the services run as separate
containers (docker-compose, Kubernetes) with a Redis queue backend, this process does that
one job from its view (:class:`services.config.views.FeederView`): it reads the job's
training data, and keeps at most ``(async.max_staleness + 1) * data.train_batch_size``
prompts in flight, counting as finished the samples the trainer reports on its
``/metrics`` (``trainer_metrics_url``: trained + dropped) divided by ``rollout.n`` — the
same admission rule as the controller. It serves its own ``/health``, ``/ready`` and
``/metrics`` (``meshrl_feeder_prompts_total``, ``meshrl_feeder_in_flight_prompts``) and
announces readiness with the one ``MESHRL_READY {...}`` line. With ``async.mode=sync`` a
batch goes out only once every replica in ``rollout_metrics_urls`` serves the trainer's
version.

With ``--state FILE`` (on a volume) the feeder's position is kept there, so a restarted
feeder goes on with the prompts not fed yet (as ``meshrl run`` does with
``RUN_DIR/feeder.json``). Without it a restarted feeder starts the data order again from
the top; the prompts it re-sends carry the same ``uid``/``sample_id`` as before, and
consumers drop them as duplicates.
"""

from __future__ import annotations

import sys


def build_parser():
    from services.entrypoint import service_parser

    p = service_parser("feeder", "meshrl prompt feeder (admission control)", default_id="feeder")
    p.prog = "python -m services.launch.feeder_process"
    p.add_argument("--poll", type=float, default=1.0, help="seconds between trainer scrapes")
    p.add_argument("--state", default=None, help="file keeping the feeder's position across restarts")
    return p


async def feed(view, poll: float, stop, gauges, state: str | None = None) -> None:
    """Top the prompts stream up until ``stop`` is set; export the feeder's counters and the
    streams' depths (``gauges["control"]``, a ControlMetrics). With ``async.mode=sync`` a batch
    goes out only once every replica in ``view.rollout_metrics_urls`` serves the trainer's version."""
    import asyncio

    from services.launch.feeder import build_feeder
    from services.launch.report import scrape
    from services.queues import make_queue

    control = gauges["control"]
    queue = make_queue(view.queues, stream="prompts", group="controller", consumer="feeder", metrics=control.queues)
    watched = [make_queue(view.queues, stream=name, group=group, consumer="feeder", metrics=control.queues)
               for name, group in (("prompts", "rollout"), ("rollouts", "reward"), ("experience", "trainer"))]
    feeder = build_feeder(view, queue, state_path=state)
    n = view.rollout.n
    try:
        while not stop.is_set():
            t = await asyncio.to_thread(scrape, view.trainer_metrics_url)
            if "meshrl_trainer_samples_total" not in t:  # the trainer is down or restarting
                await asyncio.sleep(poll)
                continue
            finished = (t.get("meshrl_trainer_samples_total", 0.0) + t.get("meshrl_trainer_dropped_stale_samples_total", 0.0)
                        + t.get("meshrl_trainer_dropped_error_samples_total", 0.0)) / n  # fmt: skip
            current = t.get("meshrl_trainer_policy_version")
            served = [(await asyncio.to_thread(scrape, u)).get("meshrl_rollout_served_version")
                      for u in view.rollout_metrics_urls]
            try:
                put = await feeder.top_up(int(finished), timeout=view.queues.put_timeout_s,
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
    from services.config.views import FeederView
    from services.entrypoint import load_view_or_exit, parse_with_overrides

    args = parse_with_overrides(build_parser(), argv)
    view = load_view_or_exit(FeederView, args, "feed")
    if not view.trainer_metrics_url:
        print("feed: trainer_metrics_url is not set (the job's services.trainer.metrics_port is 0); set "
              "services.trainer.metrics_port in the job, or pass trainer_metrics_url=http://HOST:PORT/metrics",
              file=sys.stderr)
        return 2
    if view.async_.mode == "sync" and not view.rollout_metrics_urls:
        print("feed: async.mode=sync paces batches on the replicas' served version: set "
              "rollout_metrics_urls=[http://REPLICA:PORT/metrics, ...] (every replica)", file=sys.stderr)
        return 2
    import asyncio
    import signal
    import threading

    from services.launch.control_metrics import ControlMetrics
    from services.metrics.server import MetricsServer
    from services.readiness import announce_ready

    control = ControlMetrics()
    gauges: dict = {"control": control, "ready": False}
    res = view.resources
    server = MetricsServer(control.registry, host=res.host, port=res.metrics_port, ready=lambda: gauges["ready"]).start()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    announce_ready("feeder", args.id, {"metrics": f"{server.host}:{server.port}"})
    try:
        asyncio.run(feed(view, args.poll, stop, gauges, args.state))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
