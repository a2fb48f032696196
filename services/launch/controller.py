"""The job controller behind ``meshrl run``: one job on this machine.

It hosts the embedded queue broker (when ``queues.type == "embedded"``), cuts one view
per service out of the job and writes it to ``<run_dir>/config/<name>.yaml``
(:mod:`services.config.views`), starts the trainer, the reward workers and the rollout
replicas as child processes on those files (each announces readiness with one
``MESHRL_READY`` line, :mod:`services.readiness`), feeds prompts with admission control,
and supervises them with the restart policy of :mod:`services.launch.supervision`
(``services.restart``): a crashed or silent service is restarted with backoff while the
rest keeps running, the job fails only when a service exhausts its budget or the job
stalls past its deadline (saying which and why). SIGTERM / Ctrl-C stops every service at once (the trainer acks
and checkpoints the step in progress); the trainer finishing ``trainer.total_steps``
ends the job. Running the same command on the same run dir resumes it: the broker's
file, the feeder's position (``feeder.json``) and the trainer's checkpoint agree.
Progress goes to a bar on stderr, to ``<run_dir>/status.json`` (read by the gateway's
local launcher; the final state always reaches it) and to the controller's own
``/metrics`` (the job ledger and restarts; feeder, queue depths and the embedded broker's
per-stage ledger from :mod:`services.launch.control_metrics`; its URL is ``metrics_url``
in ``status.json``); at the end ``summary.json`` and PNG plots.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from services import auth
from services.config.job import dump_job
from services.config.views import derive_views, dump_view, write_private, write_view
from services.launch.ledger import Ledger, audit
from services.launch.procs import (ServiceFailed, ServiceProcess, become_subreaper, http_get, kill_adopted,
                                   log_tail, python_module_argv)
from services.launch.report import History, scrape, write_report
from services.launch.supervision import Supervisor, stall_reason
from services.net import free_port

log = logging.getLogger("meshrl.run")


class BrokerThread:
    """The embedded broker on an event loop of its own thread: nothing the controller does
    (loading the data set, writing plots, waiting on a service) can keep the services
    from reaching their queues."""

    def __init__(self, host: str, port: int, aof_path: Path, credential: "auth.JobCredential | None" = None) -> None:
        self.host, self.port, self.aof_path, self.credential = host, port, aof_path, credential
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="embedded-broker", daemon=True)
        self.broker = None

    def start(self) -> "BrokerThread":
        from services.queues.broker_server import EmbeddedBroker

        self.thread.start()
        self.broker = asyncio.run_coroutine_threadsafe(
            EmbeddedBroker(host=self.host, port=self.port, aof_path=self.aof_path, credential=self.credential).start(),
            self.loop).result(120)
        return self

    async def ledger_stages(self) -> list[str]:
        """The latest stage of every sample in the broker's ledger (read on its own loop)."""

        async def read() -> list[str]:
            return list(self.broker.state.ledger.values())

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(read(), self.loop))

    def stop(self) -> None:
        try:
            if self.broker is not None:
                asyncio.run_coroutine_threadsafe(self.broker.stop(), self.loop).result(30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)


class JobController:
    """Runs ``spec`` (a validated JobSpec) with its files under ``run_dir``."""

    def __init__(self, spec: Any, run_dir: str | Path, *, progress: bool = True, poll_s: float = 0.5) -> None:
        self.spec = spec
        self.run_dir = Path(run_dir).resolve()
        self.progress = progress
        self.poll_s = poll_s
        self.procs: list[ServiceProcess] = []
        self.history = History(self.run_dir / "trainer_metrics.jsonl")
        self._stop_signal: int | None = None
        self._t0 = time.monotonic()
        self.state = "pending"
        self.detail = ""
        self.sup = Supervisor(spec.services.restart, [])
        self.ledger = Ledger(self.run_dir, spec.rollout.n)
        self.feeder = None
        self.tracking = None  # loggers + validation rounds (services.launch.run_tracking)
        self.queues: dict[str, int] = {}
        self.metrics_url: str | None = None
        self._broker: BrokerThread | None = None
        self._restarting: dict[str, asyncio.Task] = {}
        self._scrapes: dict[str, dict[str, float]] = {}  # the last /metrics of each live service
        self._stopping = False
        self.credential: auth.JobCredential | None = None
        self.credential_file = self.run_dir / auth.FILE_NAME
        self.placement = None  # services.launcher=ray: the job's placement group (services/launch/ray_services.py)
        self._instance_views: dict[str, Any] = {}
        self._trainer_weights: dict[str, Any] = {}
        self._node_ports: dict[tuple[str, str], list[int]] = {}
        self._trainer_placed = threading.Event()

    def _make_credential(self) -> auth.JobCredential:
        """This job's own secret: a new one per run, in ``<run_dir>/job.credential`` (0600),
        handed to every service through ``MESHRL_JOB_CREDENTIAL_FILE`` (restarted ones too)."""
        cred = auth.JobCredential.generate()
        cred.write(self.credential_file)
        return cred

    # ------------------------------------------------------------------ config files

    def _views(self) -> dict[str, Path]:
        """Fix what only this run knows (broker address, weight-channel ports, run-dir paths),
        cut the services' views out of the job once, and write each child's view to
        ``<run_dir>/config/<name>.yaml``: that file is the child's whole config."""
        job = self.spec.model_copy(deep=True)
        host = job.services.host
        if job.queues.type == "embedded":
            job.queues = job.queues.model_copy(update={"address": f"{self._broker_host()}:{self.broker_port}"})
        # A local job owns its ports: fixed defaults (meant for one service per container)
        # would let two jobs on one machine collide.
        job.weights = job.weights.model_copy(update={
            "host": host, "control_port": free_port(host), "rendezvous_port": free_port(host),
            "snapshot_dir": job.weights.snapshot_dir or str(self.run_dir / "snapshots"),
        })  # fmt: skip
        job.trainer.default_local_dir = str(self.run_dir / job.trainer.default_local_dir)
        job.trainer.metrics_file = str(self.history.metrics_file)
        # Fixed metrics ports: a restarted service comes back where the supervisor looks.
        sv = job.services
        sv.trainer.metrics_port = sv.trainer.metrics_port or free_port(host)
        views = derive_views(job)
        self.views = views
        cfg_dir = self.run_dir / "config"
        out = {"trainer": write_view(views["trainer"], cfg_dir / "trainer.yaml")}
        self._instance_views = {"trainer": views["trainer"]}
        write_view(views["feeder"], cfg_dir / "feeder.yaml")  # the feeder runs in this process
        for kind, count in (("reward", job.services.reward.replicas), ("rollout", job.services.rollout.replicas)):
            view = views[kind]
            for i in range(count):
                res = view.resources
                # several replicas on one host: fixed ports become consecutive ranges
                ports = {k: getattr(res, k) + i for k in ("grpc_port", "metrics_port") if getattr(res, k)}
                ports.setdefault("metrics_port", free_port(host))
                one = view.model_copy(update={"resources": res.model_copy(update=ports)})
                out[f"{kind}-{i}"] = write_view(one, cfg_dir / f"{kind}-{i}.yaml")
                self._instance_views[f"{kind}-{i}"] = one
        write_private(self.run_dir / "job.yaml", dump_job(self.spec))  # 0600: may carry the queue's password
        return out

    def _broker_host(self) -> str:
        """Where services reach the embedded broker: ``services.host``; for Ray actors on
        other nodes a wildcard bind (0.0.0.0) is advertised as this machine's Ray node IP."""
        host = self.spec.services.host
        if self.placement is not None and host in ("0.0.0.0", "::"):
            return self.placement.ray.util.get_node_ip_address()
        return host

    def _service(self, name: str, cfg: Path):
        """Where service ``name`` runs: a child process here, or (services.launcher=ray) a
        Ray actor of the job's placement group, wherever Ray placed its bundle."""
        env = {"OMP_NUM_THREADS": "1", "MESHRL_RUN_DIR": str(self.run_dir), auth.ENV: str(self.credential_file)}
        module = {"trainer": "trainer_svc", "reward": "reward_svc", "rollout": "rollout_svc"}[name.split("-")[0]]
        if module == "rollout_svc":
            kv = self.views["rollout"].rollout.kv_cache_space_gib
            env["VLLM_CPU_KVCACHE_SPACE"] = str(int(max(1, kv or 1)))
        log_path = self.run_dir / "logs" / f"{name}.log"
        if self.placement is not None:
            from services.launch.ray_services import RayServiceProcess

            return RayServiceProcess(name, self.placement, lambda node: self._render(name, node), cfg, log_path, env)
        argv = python_module_argv(module, "--config", str(cfg), "--id", name)
        return ServiceProcess(name, argv, log_path, env=env)

    def _render(self, name: str, node: dict[str, Any]) -> str:
        """The view of ``name`` for the Ray node it landed on: its servers bind that node's
        IP, on ports free there (the same ones again when it comes back to that node); the
        trainer's weight channel is where replicas reach it (a replica waits until the
        trainer is placed)."""
        view = self._instance_views[name]
        ports = self._node_ports.setdefault((name, node["node_id"]), list(node["ports"]))
        res = {"host": node["ip"]}
        if "metrics_port" in type(view.resources).model_fields and not self._fixed_metrics_port(name):
            res["metrics_port"] = ports[0]
        update: dict[str, Any] = {"resources": view.resources.model_copy(update=res)}
        weights = getattr(view, "weights", None)
        if name == "trainer" and weights is not None:
            self._trainer_weights = {"host": node["ip"], "control_port": ports[1], "rendezvous_port": ports[2]}
            self._trainer_placed.set()
        if weights is not None:
            if not self._trainer_placed.wait(self.spec.services.ray.placement_timeout_s):
                raise ServiceFailed(f"{name}: the trainer was not placed within services.ray.placement_timeout_s")
            update["weights"] = weights.model_copy(update=self._trainer_weights)
        return dump_view(view.model_copy(update=update))

    def _fixed_metrics_port(self, name: str) -> bool:
        """The job spec itself set the service's metrics port (a firewall rule, say): keep it."""
        res = getattr(self.spec.services, name.split("-")[0])
        return bool(res.metrics_port)

    # ------------------------------------------------------------------ main

    def run(self) -> int:
        """Run the job to the end; returns the exit code (0 done, 1 failed, 130 interrupted)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        become_subreaper()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        code = 1
        try:
            code = asyncio.run(self._main())
            return code
        except BaseException as exc:  # the final state always reaches status.json
            if self.state not in ("failed", "cancelled"):
                self.state, self.detail = "failed", f"controller error: {type(exc).__name__}: {exc}"
                self._log(f"meshrl run: {self.detail}")
            raise
        finally:
            self._stop_all()
            if self.placement is not None:
                self.placement.release()
            if self.state in ("pending", "starting", "running"):
                self.state = "failed" if code else self.state
                self.detail = self.detail or "the controller stopped unexpectedly"
            self._write_status()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._stop_signal = signum

    async def _main(self) -> int:
        spec = self.spec
        broker = None
        self.credential = self._make_credential()
        self.broker_port = free_port(spec.services.host)
        if spec.queues.type == "embedded":
            broker = self._broker = await asyncio.to_thread(BrokerThread(spec.services.host, self.broker_port,
                                                                         self.run_dir / "broker.aof",
                                                                         self.credential).start)
        server = self._start_metrics()
        try:
            if spec.services.launcher == "ray":
                from services.launch.ray_services import RayPlacement, instance_names

                self.placement = RayPlacement(spec, instance_names(spec))
                await asyncio.to_thread(self.placement.connect)
            configs = self._views()
            self.state = "starting"
            self._write_status()
            if self.placement is not None:
                self._log(f"meshrl run: Ray cluster at {self.placement.address}; placing {len(configs)} services "
                          f"(strategy {spec.services.ray.strategy})")
                await asyncio.to_thread(self.placement.reserve, lambda: self._stop_signal is not None)
            self.procs = [self._service(n, p) for n, p in configs.items()]
            for p in self.procs:
                p.start()
            # all at once; a service that never becomes ready is misconfigured: restarting
            # cannot help, the job fails at once naming it
            failed: list[ServiceFailed] = []

            async def ready(p: ServiceProcess) -> None:
                timeout = spec.rollout.engine_startup_timeout_s if p.name.startswith("rollout") else 600.0
                try:
                    await asyncio.to_thread(p.wait_ready, timeout, lambda: self._stop_signal is not None or bool(failed))
                except ServiceFailed as exc:
                    failed.append(exc)
                    return
                if self._stop_signal is None and not failed:
                    self.sup.started(p.name, time.monotonic())
                    self._log(f"{p.name} ready")
                    self._write_status()

            await asyncio.gather(*(ready(p) for p in self.procs))
            if failed:
                raise failed[0]
            if self._stop_signal is not None:
                self.state, self.detail = "cancelled", f"stopped by signal {self._stop_signal}"
                return 130
            self.state = "running"
            return await self._loop()
        except ServiceFailed as exc:
            self.state, self.detail = "failed", str(exc)
            self._log(f"meshrl run: {exc}")
            return 1
        finally:
            self._stopping = True
            for task in self._restarting.values():
                task.cancel()
            # Off the event loop: it hosts the embedded broker, which the trainer needs to
            # reach while it acks and checkpoints the step in progress.
            await asyncio.to_thread(self._stop_all)
            await self._final_audit()
            await self._broker_ledger()
            if broker is not None:
                await asyncio.to_thread(broker.stop)
            server.stop()

    def _queue_credential(self):
        return self.credential if self.spec.queues.type == "embedded" else None

    def _queue_cfg(self):
        cfg = self.spec.queues
        if cfg.type == "embedded":
            cfg = cfg.model_copy(update={"address": f"{self.spec.services.host}:{self.broker_port}"})
        return cfg

    async def _loop(self) -> int:
        from services.queues import make_queue

        spec = self.spec
        qm = self.control.queues
        cred = self._queue_credential()
        prompts = make_queue(self._queue_cfg(), stream="prompts", group="controller", consumer="feeder", metrics=qm,
                             credential=cred)
        watched = {name: make_queue(self._queue_cfg(), stream=name, group=group, consumer="controller", metrics=qm,
                                    credential=cred)
                   for name, group in (("prompts", "rollout"), ("rollouts", "reward"), ("experience", "trainer"))}
        self.feeder = await asyncio.to_thread(self._make_feeder, prompts)  # tokenizes the data set
        self.ledger.prompts_fed = self.feeder.state.fed
        if self.feeder.state.fed:
            self._log(f"resuming: {self.feeder.state.fed} prompts fed before (epoch {self.feeder.state.epoch}, "
                      f"position {self.feeder.state.cursor})")
        from services.launch.run_tracking import RunTracking

        self.tracking = RunTracking(spec, self.run_dir, self.history, log=self._log)
        await self.tracking.start(prompts, lambda stream, group: make_queue(
            self._queue_cfg(), stream=stream, group=group, consumer="controller", metrics=qm, credential=cred))
        bar = self._progress_bar()
        self.sup.touch(time.monotonic())
        try:
            while True:
                if self._stop_signal is not None:
                    self.state, self.detail = "cancelled", f"stopped by signal {self._stop_signal}"
                    self._log("meshrl run: interrupted; stopping the services (the trainer checkpoints first); "
                              f"resume with the same command and --run-dir {self.run_dir}")
                    return 130
                trainer = self._proc("trainer")
                if trainer.returncode == 0 and "trainer" not in self._restarting:
                    await self._observe(bar)  # the lines it wrote just before exiting
                    last = max((r["step"] for r in self.history.steps), default=0)
                    if last >= spec.trainer.total_steps:
                        tracking, self.tracking = self.tracking, None
                        await tracking.finish(succeeded=True)  # the last validation round, while replicas run
                        self.state, self.detail = "succeeded", f"trained {spec.trainer.total_steps} steps"
                        return 0
                    trainer.kill_reason = f"stopped at step {last} of {spec.trainer.total_steps}"
                self._supervise()
                await self._heartbeats()
                await self._observe(bar)
                await self.tracking.tick()
                finished = self.ledger.finished_prompts()
                if finished is not None and "trainer" not in self._restarting:
                    current = self._scrapes.get("trainer", {}).get("meshrl_trainer_policy_version")
                    served = [self._scrapes.get(p.name, {}).get("meshrl_rollout_served_version")
                              for p in self.procs if p.name.startswith("rollout")]
                    try:
                        put = await self.feeder.top_up(
                            int(finished), timeout=min(5.0, spec.queues.put_timeout_s),
                            replicas_current=current is not None and all(v == current for v in served))
                    except Exception as exc:  # noqa: BLE001 - a queue outage: fed on a later round
                        self._log(f"feeder: put failed, retrying: {type(exc).__name__}: {exc}")
                        put = 0
                    self.ledger.prompts_fed = self.feeder.state.fed
                    self.control.fed(put, self.feeder.state.fed, int(finished), self.feeder.max_in_flight)
                    await self._broker_ledger()
                self.queues = await self._depths(watched)
                self._check_stall()
                self._write_status()
                if spec.async_.mode == "sync":
                    await self._sync_feed(self.poll_s)  # the next batch as soon as a step ends
                else:
                    await asyncio.sleep(self.poll_s)
        finally:
            if self.tracking is not None:
                await self.tracking.finish(succeeded=False)
            if bar is not None:
                bar.close()
            await prompts.close()
            for q in watched.values():
                await q.close()

    async def _sync_feed(self, budget_s: float, tick_s: float = 0.05) -> None:
        """``async.mode=sync``, between two rounds of the loop: put the next batch as soon as
        the last one is trained and every replica serves the trainer's new version.

        The loop's round (scrapes, depths, status) runs every ``poll_s``; waiting that long
        between steps would charge the synchronous baseline for the controller's poll, so
        this watches cheaply in between: while a batch is out it only stats the trainer's
        metrics file (a line per committed step), and scrapes the trainer, then the replicas,
        only once a step has ended.
        """
        end = time.monotonic() + budget_s
        mfile = self.history.metrics_file

        def size() -> int:
            try:
                return mfile.stat().st_size if mfile is not None else 0
            except OSError:
                return 0

        seen, step_ended = size(), False
        rollouts = {p.name: p.url("metrics") + "/metrics" for p in self.procs
                    if p.name.startswith("rollout") and p.ready}
        trainer = next((p for p in self.procs if p.name == "trainer"), None)
        while time.monotonic() < end:
            finished = self.ledger.finished_prompts()
            if (finished is None or self.feeder is None or trainer is None or not trainer.ready
                    or self._restarting or self._stop_signal is not None):
                break
            if self.feeder.state.fed > finished:  # the batch is out
                if not step_ended and size() == seen:
                    await asyncio.sleep(tick_s)
                    continue
                seen, step_ended = size(), True  # a step line: its counters follow at once
                got = await asyncio.to_thread(scrape, trainer.url("metrics") + "/metrics")
                self.ledger.observe("trainer", got)
                if got:
                    self._scrapes["trainer"] = got
                if self.ledger.finished_prompts() is not None and self.feeder.state.fed > self.ledger.finished_prompts():
                    await asyncio.sleep(tick_s)
                continue
            current = self._scrapes.get("trainer", {}).get("meshrl_trainer_policy_version")
            served = await asyncio.gather(*(asyncio.to_thread(scrape, u) for u in rollouts.values()))
            if current is not None and all(r.get("meshrl_rollout_served_version") == current for r in served):
                put = await self.feeder.top_up(int(finished), timeout=min(5.0, self.spec.queues.put_timeout_s),
                                               replicas_current=True)
                self.ledger.prompts_fed = self.feeder.state.fed
                self.control.fed(put, self.feeder.state.fed, int(finished), self.feeder.max_in_flight)
                break
            await asyncio.sleep(tick_s)
        await asyncio.sleep(max(0.0, end - time.monotonic()))

    # ------------------------------------------------------------------ supervision

    def _proc(self, name: str) -> ServiceProcess:
        return next(p for p in self.procs if p.name == name)

    def _supervise(self) -> None:
        """Restart services that exited (or fail the job when one is out of budget)."""
        for p in self.procs:
            if self._stop_signal is not None:
                return  # a group-wide SIGTERM (gateway cancel) also stops the services: not a crash
            if p.name in self._restarting or p.returncode is None:
                continue
            if p.name == "trainer":
                self.ledger.trainer = {}  # its successor reports counters restored from the checkpoint
            how = f"exited with code {p.returncode}" + (f" ({p.kill_reason})" if p.kill_reason else "")
            decision = self.sup.exited(p.name, how, time.monotonic())
            self._reap_orphans()
            if decision.action == "fail":
                raise ServiceFailed(f"{decision.reason}; last lines of {p.log_path}:\n{_tail(p)}")
            self._log(f"meshrl run: {decision.reason}")
            self._restarting[p.name] = asyncio.create_task(self._restart(p, decision.delay_s))

    async def _restart(self, p: ServiceProcess, delay: float) -> None:
        try:
            await asyncio.sleep(delay)
            if self._stopping:
                return
            p.kill_reason = ""
            p.start()
            timeout = self.spec.rollout.engine_startup_timeout_s if p.name.startswith("rollout") else 600.0
            try:
                await asyncio.to_thread(p.wait_ready, timeout)
            except ServiceFailed as exc:
                if p.returncode is None:  # alive but never ready: counts as a crash
                    p.kill_reason = "not ready after restart"
                    p.signal(signal.SIGKILL)
                    await asyncio.to_thread(_wait_exit, p)
                self._log(f"meshrl run: {p.name} failed to come back: {str(exc).splitlines()[0]}")
                return
            self.sup.started(p.name, time.monotonic())
            self._log(f"{p.name} ready again")
        finally:
            self._restarting.pop(p.name, None)

    async def _heartbeats(self) -> None:
        """Probe every running service's /health; kill those silent past the deadline."""
        live = [p for p in self.procs if p.name not in self._restarting and p.returncode is None and p.ready]
        oks = await asyncio.gather(*(asyncio.to_thread(http_get, p.url("metrics") + "/health", 1.0)
                                     for p in live))
        now = time.monotonic()
        self._silent = []
        for p, (status, _) in zip(live, oks):
            if status == 200:
                self.sup.beat(p.name, now)
            else:
                self._silent.append(p.name)
        for name, why in self.sup.stuck(now):
            p = self._proc(name)
            if p.returncode is None and name not in self._restarting:
                self._log(f"meshrl run: {name} is stuck ({why}); killing it")
                p.kill_reason = why
                p.signal(signal.SIGCONT)
                p.signal(signal.SIGKILL)
                await asyncio.to_thread(_wait_exit, p)

    def _reap_orphans(self) -> None:
        """Kill helpers a dead service left behind (vLLM engine processes), adopted by us."""
        keep = {p.proc.pid for p in self.procs if getattr(p, "proc", None) is not None and p.returncode is None}
        gone = kill_adopted(exclude=keep)
        if gone:
            log.warning("killed %d process(es) left behind by a dead service", len(gone))

    def _check_stall(self) -> None:
        in_flight = self.feeder.state.fed - int(self.ledger.finished_prompts() or 0)
        down = getattr(self, "_silent", [])
        why = stall_reason(self.queues, in_flight=in_flight, max_in_flight=self.feeder.max_in_flight,
                           restarting=list(self._restarting), down=down)
        stall = self.sup.stall(time.monotonic(), why)
        if stall is None:
            if self.detail.startswith("stalled"):
                self.detail = ""
            return
        if not self.detail.startswith("stalled") or int(stall.seconds) % 60 == 0:
            self._log(f"meshrl run: stalled: {stall.reason}")
        self.detail = f"stalled: {stall.reason}"
        if stall.fatal:
            raise ServiceFailed(f"job stalled: {stall.reason}")

    async def _observe(self, bar) -> None:
        """Scrape every service into the ledger and the step history."""
        live = [p for p in self.procs if p.name not in self._restarting and p.returncode is None and p.ready]
        urls = {p.name: p.url("metrics") + "/metrics" for p in live}
        scrapes = await asyncio.gather(*(asyncio.to_thread(scrape, u) for u in urls.values()))
        self._scrapes = {}
        for name, got in zip(urls, scrapes):
            self.ledger.observe(name, got, incarnation=self.sup.restarts().get(name, 0))
            self._scrapes[name] = got
        current = self._scrapes.get("trainer", {}).get("meshrl_trainer_policy_version")
        served = {n: s.get("meshrl_rollout_served_version") for n, s in self._scrapes.items() if n.startswith("rollout")}
        self.sup.versions(current, served, self.spec.async_.max_staleness, time.monotonic())
        c = self.ledger.counts()
        self.sup.progress({k: c[k] for k in ("generated", "scored", "trained", "dropped_stale", "dropped_error")},
                          time.monotonic())
        if self.history.read(self.ledger.tokens(), time.monotonic() - self._t0) and bar is not None:
            last = self.history.steps[-1]
            bar.update(last["step"] - bar.n)
            bar.set_postfix(reward=f"{last['reward_mean']:.3f}", staleness=f"{last['staleness']:.2f}",
                            tok_s=f"{last['tokens_per_s']:.0f}")

    async def _final_audit(self) -> None:
        """The per-sample check of the ledger (from the queue) once every service stopped."""
        if self.feeder is None or not self.feeder.state.fed:
            return
        from services.queues import make_queue

        self.ledger.read_checkpoint(Path(self.spec.trainer.default_local_dir) if Path(
            self.spec.trainer.default_local_dir).is_absolute() else self.run_dir / self.spec.trainer.default_local_dir)

        q = make_queue(self._queue_cfg(), stream="experience", group="trainer", consumer="controller",
                       credential=self._queue_credential())
        try:
            self.ledger.audited = await asyncio.wait_for(
                audit(q, self.feeder.fed_uids(), self.spec.rollout.n, self.ledger.counts()["trained"]), 60)
        except Exception as exc:  # noqa: BLE001 - the audit is a report, never a failure
            log.warning("ledger audit failed: %s", exc)
        finally:
            await q.close()
        self.ledger.save()

    async def _broker_ledger(self) -> None:
        """The embedded broker's per-stage ledger into ``meshrl_ledger_samples{stage}``."""
        if self._broker is not None and self._broker.broker is not None:
            try:
                self.control.set_ledger(await asyncio.wait_for(self._broker.ledger_stages(), 5.0))
            except Exception as exc:  # noqa: BLE001 - a metric, never fatal
                log.warning("reading the broker's ledger failed: %s", exc)

    async def _depths(self, queues: dict) -> dict[str, int]:
        out = {}
        for name, q in queues.items():
            try:
                out[name] = int(await asyncio.wait_for(q.depth(), timeout=2.0))
            except Exception:  # noqa: BLE001 - a depth we cannot read is left out, never fatal
                pass
        return out

    def _make_feeder(self, queue):
        from services.launch.feeder import build_feeder

        return build_feeder(self.views["feeder"], queue, log=self._log, state_path=self.run_dir / "feeder.json")

    # ------------------------------------------------------------------ helpers

    def _start_metrics(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from services.launch.control_metrics import ControlMetrics
        from services.metrics import MetricsServer

        ctl = self

        class _Collector:
            def collect(self):
                fam = CounterMetricFamily("meshrl_job_ledger_samples",
                                          "samples per job ledger stage, over restarts (docs/supervision.md)",
                                          labels=["stage"])
                for stage, v in ctl.ledger.counts().items():
                    fam.add_metric([stage], float(v))
                yield fam
                rs = CounterMetricFamily("meshrl_job_service_restarts", "restarts per service", labels=["service"])
                for name, v in ctl.sup.restarts().items():
                    rs.add_metric([name], float(v))
                yield rs
                st = GaugeMetricFamily("meshrl_job_stalled", "1 while the job makes no progress")
                st.add_metric([], 1.0 if ctl.detail.startswith("stalled") else 0.0)
                yield st

        self.control = ControlMetrics()
        self.control.registry.register(_Collector())
        server = MetricsServer(self.control.registry, host=self.spec.services.host, port=0, status=self._status).start()
        self.metrics_url = f"http://{self.spec.services.host}:{server.port}/metrics"
        return server

    def _progress_bar(self):
        if not self.progress:
            return None
        from tqdm import tqdm

        return tqdm(total=self.spec.trainer.total_steps, desc=f"{self.spec.name}", unit="step", dynamic_ncols=True)

    def _log(self, msg: str) -> None:
        print(msg, flush=True)

    def _stop_all(self) -> None:
        """SIGTERM to every service at once, then wait for each (SIGKILL after its grace):
        the trainer acks and checkpoints the step in progress, the others just stop."""
        live = [p for p in self.procs if p.returncode is None]
        for p in live:
            p.signal(signal.SIGCONT)  # a stopped process must be able to act on the SIGTERM
            p.signal(signal.SIGTERM)
        threads = [threading.Thread(target=p.stop, kwargs={"grace": 60.0 if p.name == "trainer" else 15.0})
                   for p in live]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        leftovers = kill_adopted()
        if leftovers:  # vLLM engine helpers outliving their replica by a moment: expected, nothing to do
            log.info("killed %d leftover descendant process(es) of the job's services", len(leftovers))

    def _status(self) -> dict[str, Any]:
        last = self.history.steps[-1] if self.history.steps else {}
        tps = last.get("tokens_per_s")
        return {
            "state": self.state, "detail": self.detail, "step": last.get("step", 0),
            "total_steps": self.spec.trainer.total_steps, "reward_mean": last.get("reward_mean"),
            "staleness": last.get("staleness"), "tokens_per_s": None if tps is None else max(0.0, tps),
            "prompts_fed": self.feeder.state.fed if self.feeder else None,
            "elapsed_s": round(time.monotonic() - self._t0, 1),
            "pid": os.getpid(), "queues": self.queues, "metrics_url": self.metrics_url,
            **{k: last.get(k) for k in ("loss", "kl", "entropy", "grad_norm", "logprob_diff")},
            "val_score": self.history.latest_val_score(),  # the newest finished validation round
            "ledger": self.ledger.as_dict(), "restarts": self.sup.restarts(),
            "ledger_stages": (self.control.ledger_counts() if getattr(self, "control", None) else {}),
            "stalled": self.detail.startswith("stalled"),
            "services": {p.name: {"pid": _pid(p), "alive": p.returncode is None,
                                  "restarts": self.sup.restarts().get(p.name, 0),
                                  "restarting": p.name in self._restarting,
                                  **({"node": p.node} if getattr(p, "node", None) else {})}
                         for p in self.procs},
            "launcher": self.spec.services.launcher,
        }

    def _write_status(self) -> None:
        status = self._status()
        tmp = self.run_dir / "status.json.tmp"
        tmp.write_text(json.dumps(status))
        os.replace(tmp, self.run_dir / "status.json")
        if self.state in ("succeeded", "failed", "cancelled"):
            self.ledger.save()
            write_report(self.history, self.run_dir, ledger=self.ledger.as_dict(),
                             restarts=self.sup.restarts())


def _pid(p: Any) -> int | None:
    """A service's pid (on its own node, for a Ray actor's service)."""
    proc = getattr(p, "proc", None)
    return proc.pid if proc is not None else getattr(p, "pid", None)


def _wait_exit(p: Any, timeout: float = 60.0) -> None:
    if isinstance(p, ServiceProcess):
        if p.proc is not None:
            p.proc.wait()
    else:
        p.wait_exit(timeout)


def _tail(p: Any) -> str:
    return log_tail(p.log_path) if isinstance(p, ServiceProcess) else p.tail()
