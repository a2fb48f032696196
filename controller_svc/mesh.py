"""The processes of one job: each service's view on disk, its process, readiness,
supervision and stop.

:class:`ServiceMesh` cuts one view per service out of the job and writes it to
``<run_dir>/config/<name>.yaml`` (:mod:`services.config.views`): that file is the child's
whole config. It starts the trainer, the reward workers, the rollout replicas and the prompt
feeder (``feeder_svc``) as child processes on those files -- the replicas first, the others
as CPUs allow -- and waits for each one's readiness line; the feeder holds its first put
until the controller lets it go (:meth:`ServiceMesh.start_feeder`). With
``services.launcher: ray`` the others are Ray actors of the job's placement group
(:mod:`services.ray_launcher.placement`) and the feeder is started once it knows where the
trainer and the replicas answer. It applies the restart policy of :mod:`services.supervision`: a
service that exits or stops answering its ``/health`` is restarted with backoff while the
rest keeps running; a service out of budget fails the job, naming it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from services import auth
from services.config.job import dump_job
from services.config.views import derive_views, dump_view, write_private, write_view
from services.config.weights import REJECT_EXIT_CODE
from services.sandbox.confine import INPUTS_ENV
from services.procs import ServiceFailed, ServiceProcess, kill_adopted, log_tail, python_module_argv
from services.supervision import Supervisor
from services.metrics.scrape import http_get
from services.net import PortReservations

log = logging.getLogger("meshrl.run")

#: The module each kind of service runs (``python -m <module> --config VIEW --id NAME``).
MODULES = {"trainer": "trainer_svc", "reward": "reward_svc", "rollout": "rollout_svc", "feeder": "feeder_svc"}


def kind_of(name: str) -> str:
    """``rollout-1`` -> ``rollout``."""
    return name.split("-")[0]



def sandbox_inputs(spec: Any) -> list[str]:
    """The job's inputs that sandboxed user code may read (bound read-only in its sandbox):
    the model and tokenizer, the data files, the reward function's file, the tool config."""
    model, data, reward = spec.model, spec.data, spec.reward
    paths = [model.path, model.tokenizer_path, *data.train_files, *data.val_files, reward.tokenizer_path,
             reward.custom_reward_function.path, spec.rollout.multi_turn.tool_config_path]
    return [os.path.abspath(p) for p in paths if isinstance(p, str) and p and os.path.exists(p)]

class ServiceMesh:
    """The services of the job ``spec`` under ``run_dir`` (see module doc)."""

    def __init__(self, spec: Any, run_dir: Path, sup: Supervisor, *, credential_file: Path,
                 metrics_file: Path, log_line: Callable[[str], None] = print) -> None:
        self.spec, self.run_dir, self.sup = spec, run_dir, sup
        self.credential_file, self.metrics_file = credential_file, metrics_file
        self._log = log_line
        self.procs: list[Any] = []
        self.views: dict[str, Any] = {}
        self.placement = None  # services.launcher=ray: the job's placement group
        self.restarting: dict[str, asyncio.Task] = {}
        self.silent: list[str] = []  # services whose /health did not answer in the last probe
        self.stopping = False
        self._instance_views: dict[str, Any] = {}
        # the ports picked here stay reserved until the job ends: a restarted service binds
        # its port again, and no other picker on the machine takes it in between
        self.ports = PortReservations()
        self._trainer_weights: dict[str, Any] = {}
        self._node_ports: dict[tuple[str, str], list[int]] = {}
        self._trainer_placed = threading.Event()
        self.fleet = None  # services.rollout.fleet: the fleet's directory (controller_svc/fleet_attach.py)
        self.attachment = None

    # ------------------------------------------------------------------ views

    def write_views(self, queue_address: str | None) -> dict[str, Path]:
        """Fix what only this run knows (broker address, weight-channel ports, run-dir paths),
        cut the services' views out of the job once, and write each child's view to
        ``<run_dir>/config/<name>.yaml``. The feeder's view is written when it starts."""
        job = self.spec.model_copy(deep=True)
        host = job.services.host
        if job.queues.type == "embedded":
            job.queues = job.queues.model_copy(update={"address": queue_address})
        # A local job owns its ports: fixed defaults (meant for one service per container)
        # would let two jobs on one machine collide.
        job.weights = job.weights.model_copy(update={
            "host": host, "control_port": self.ports.take(host), "rendezvous_port": self.ports.take(host),
            "snapshot_dir": job.weights.snapshot_dir or str(self.run_dir / "snapshots"),
        })  # fmt: skip
        job.trainer.default_local_dir = str(self.run_dir / job.trainer.default_local_dir)
        job.trainer.metrics_file = str(self.metrics_file)
        # Fixed metrics ports: a restarted service comes back where the supervisor looks.
        sv = job.services
        sv.trainer.metrics_port = sv.trainer.metrics_port or self.ports.take(host)
        sv.feeder.metrics_port = sv.feeder.metrics_port or self.ports.take(host)
        if job.services.rollout.fleet:  # the fleet's replicas serve the job: as many as it has
            from controller_svc.fleet_attach import fleet_for

            self.fleet = fleet_for(job.services.rollout.fleet)
            state = self.fleet.state()
            sc = state.get("scaling") or {}
            if job.async_.mode == "sync" and sc.get("max", 0) > sc.get("min", 0):
                raise ValueError(f"services.rollout.fleet={self.fleet.name} with async.mode=sync: fleet "
                                 f"{self.fleet.name!r} scales ({sc['min']}..{sc['max']} replicas) and a synchronous "
                                 "job's feeder waits for every replica to serve its version; use async.mode=async "
                                 "or a fleet of fixed size")
            # a view for every replica the fleet may run: one that joins later finds the job
            job.services.rollout.replicas = len(state["replicas"])
        self.views = views = derive_views(job)
        cfg_dir = self.run_dir / "config"
        out = {"trainer": write_view(views["trainer"], cfg_dir / "trainer.yaml")}
        self._instance_views = {"trainer": views["trainer"]}
        for kind, count in (("reward", job.services.reward.replicas), ("rollout", job.services.rollout.replicas)):
            view = views[kind]
            for i in range(count):
                res = view.resources
                # several replicas on one host: fixed ports become consecutive ranges
                ports = {k: getattr(res, k) + i for k in ("grpc_port", "metrics_port") if getattr(res, k)}
                if "metrics_port" not in ports:
                    ports["metrics_port"] = self.ports.take(host)
                one = view.model_copy(update={"resources": res.model_copy(update=ports)})
                out[f"{kind}-{i}"] = write_view(one, cfg_dir / f"{kind}-{i}.yaml")
                self._instance_views[f"{kind}-{i}"] = one
        write_private(self.run_dir / "job.yaml", dump_job(self.spec))  # 0600: may carry the queue's password
        if self.fleet is not None:
            from controller_svc.fleet_attach import FleetAttachment, job_id_of

            self.attachment = FleetAttachment(self.fleet, job_id_of(self.run_dir),
                                              {n: p for n, p in out.items() if kind_of(n) == "rollout"},
                                              self.credential_file)
        return out

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
        return bool(getattr(self.spec.services, kind_of(name)).metrics_port)

    # ------------------------------------------------------------------ processes

    def _process(self, name: str, cfg: Path, extra: tuple[str, ...] = ()):
        """Where service ``name`` runs: a child process here, or (services.launcher=ray) a
        Ray actor of the job's placement group, wherever Ray placed its bundle. The feeder
        always runs here, beside the job's data and its position file."""
        env = {"OMP_NUM_THREADS": "1", "MESHRL_RUN_DIR": str(self.run_dir), auth.ENV: str(self.credential_file),
               INPUTS_ENV: os.pathsep.join(sandbox_inputs(self.spec))}  # what user code may read
        module = MODULES[kind_of(name)]
        if module == "rollout_svc" and self.attachment is not None:
            return self.attachment.replica(name, self.run_dir / "logs" / f"{name}.log")
        if module == "rollout_svc":
            kv = self.views["rollout"].rollout.kv_cache_space_gib
            env["VLLM_CPU_KVCACHE_SPACE"] = str(int(max(1, kv or 1)))
        log_path = self.run_dir / "logs" / f"{name}.log"
        if self.placement is not None and module != "feeder_svc":
            from services.ray_launcher.placement import RayServiceProcess

            return RayServiceProcess(name, module, self.placement, lambda node: self._render(name, node), cfg,
                                     log_path, env)
        return ServiceProcess(name, python_module_argv(module, "--config", str(cfg), "--id", name, *extra),
                              log_path, env=env)

    def proc(self, name: str) -> Any:
        return next(p for p in self.procs if p.name == name)

    def live(self) -> list[Any]:
        """Services running and ready, not being restarted."""
        return [p for p in self.procs if p.name not in self.restarting and p.returncode is None and p.ready]

    @staticmethod
    def startup_timeout(spec: Any, name: str) -> float:
        return spec.rollout.engine_startup_timeout_s if name.startswith("rollout") else 600.0

    async def start(self, configs: dict[str, Path], should_stop: Callable[[], bool]) -> None:
        """Start every service and wait until each is ready. A service that never becomes
        ready is misconfigured, so restarting cannot help: ServiceFailed at once, naming it.

        On this machine (not under Ray) the rollout replicas start first and the others
        ``parallel_starts()`` at a time, each once the one before is ready: a replica's start
        (vLLM's imports, twice, and its engine) is the longest, and the others' imports
        would otherwise take most of the CPUs it needs (docs/performance.md)."""
        procs = [self._process(n, p, self._feeder_args() if n == "feeder" else ()) for n, p in configs.items()]
        local = self.placement is None
        gate = asyncio.Semaphore(self.parallel_starts(sum(kind_of(p.name) == "rollout" for p in procs
                                                          if self.attachment is None)))
        failed: list[ServiceFailed] = []

        async def ready(p: Any) -> None:
            if failed or should_stop():
                return
            self.procs.append(p)  # only what was started is supervised and stopped
            p.start()
            try:
                await asyncio.to_thread(p.wait_ready, self.startup_timeout(self.spec, p.name),
                                        lambda: should_stop() or bool(failed))
            except ServiceFailed as exc:
                failed.append(exc)
                return
            if getattr(p, "parked", False):  # a fleet's replica not running now: follow_fleet takes it when it joins
                self._log(f"{p.name}: not running in the fleet now (parked)")
            elif not should_stop() and not failed:
                self.sup.started(p.name, time.monotonic())
                self._log(f"{p.name} ready")

        async def gated(p: Any) -> None:
            async with gate:
                await ready(p)

        # (a job on a fleet's warm replicas starts its feeder at once too: it feeds before the
        # trainer is ready, controller_svc/fleet_attach.py feed_early)
        first = [p for p in procs if not local or kind_of(p.name) == "rollout"
                 or (self.attachment is not None and p.name == "feeder")]
        await asyncio.gather(*(ready(p) for p in first), *(gated(p) for p in procs if p not in first))
        if failed:
            raise failed[0]

    @staticmethod
    def parallel_starts(replicas: int) -> int:
        """How many services besides the replicas start at once: the CPUs this process may
        use, less one per replica (at least one)."""
        return max(1, len(os.sched_getaffinity(0)) - replicas)

    @property
    def hold_file(self) -> Path:
        """While this file exists the feeder waits before its first put (``--hold``)."""
        return self.run_dir / "feeder.hold"

    def feeder_view(self, trainer_url: str, rollout_urls: list[str]) -> Path:
        """Write the feeder's view with the trainer's and the replicas' metrics addresses."""
        view = self.views["feeder"].model_copy(update={
            "trainer_metrics_url": trainer_url + "/metrics",
            "trainer_metrics_file": str(self.metrics_file),
            "rollout_metrics_urls": [u + "/metrics" for u in rollout_urls],
        })  # fmt: skip
        return write_view(view, self.run_dir / "config" / "feeder.yaml")

    def early_feeder_view(self) -> Path | None:
        """A local job knows every metrics address before it starts anything (the ports are
        fixed in the views): the feeder can then start with the other services, its imports
        and tokenizing overlapping the replicas' start, and hold its first put until the
        controller releases it. None where the addresses are known only once placed (Ray)."""
        if self.placement is not None:
            return None

        def url(name: str) -> str:
            res = self._instance_views[name].resources
            return f"http://{res.host or self.spec.services.host}:{res.metrics_port}"

        self.hold_file.touch()
        return self.feeder_view(url("trainer"), [url(n) for n in self._instance_views if n.startswith("rollout")])

    def _feeder_args(self) -> tuple[str, ...]:
        return ("--state", str(self.run_dir / "feeder.json"), "--poll", "0.5", "--hold", str(self.hold_file))

    async def start_feeder(self, should_stop: Callable[[], bool]) -> None:
        """Let the prompt feeder feed: release the one started with the others, or start it
        now on the trainer's and the replicas' announced addresses (Ray), with its position
        in ``<run_dir>/feeder.json``."""
        if any(p.name == "feeder" for p in self.procs):
            self.hold_file.unlink(missing_ok=True)
            return
        cfg = self.feeder_view(self.proc("trainer").url("metrics"),
                               [p.url("metrics") for p in self.procs if p.name.startswith("rollout")])
        proc = self._process("feeder", cfg, self._feeder_args())
        self.procs.append(proc)
        proc.start()
        await asyncio.to_thread(proc.wait_ready, 600.0, should_stop)
        if not should_stop():
            self.sup.started("feeder", time.monotonic())
            self._log("feeder ready")

    # ------------------------------------------------------------------ supervision

    def supervise(self, should_stop: Callable[[], bool], on_exit: Callable[[str], None] = lambda name: None) -> None:
        """Restart services that exited (or fail the job when one is out of budget)."""
        for p in self.procs:
            if should_stop():
                return  # a group-wide SIGTERM (gateway cancel) also stops the services: not a crash
            if p.name in self.restarting or p.returncode is None:
                continue
            on_exit(p.name)
            if p.name == "trainer" and p.returncode == REJECT_EXIT_CODE:
                raise ServiceFailed(f"trainer stopped: a version was rejected at the canary and "
                                    f"weights.rollout.on_reject=fail; last lines of {p.log_path}:\n{_tail(p)}")
            how = f"exited with code {p.returncode}" + (f" ({p.kill_reason})" if p.kill_reason else "")
            decision = self.sup.exited(p.name, how, time.monotonic())
            self.reap_orphans()
            if decision.action == "fail":
                raise ServiceFailed(f"{decision.reason}; last lines of {p.log_path}:\n{_tail(p)}")
            self._log(f"meshrl run: {decision.reason}")
            self.restarting[p.name] = asyncio.create_task(self._restart(p, decision.delay_s))

    def follow_fleet(self) -> None:
        """A job on a fleet that scales: park the replicas the fleet drains, take back those
        that joined (controller_svc/fleet_attach.py)."""
        if self.attachment is None:
            return
        for p in self.procs:
            if p.name in self.restarting or not hasattr(p, "follow"):
                continue
            change = p.follow()
            if change == "joined":
                self.sup.started(p.name, time.monotonic())
                self._log(f"meshrl run: {p.name} joined (the fleet added it)")
            elif change == "left":
                self.sup.parked(p.name)
                self._log(f"meshrl run: {p.name} left (the fleet drains it)")

    async def _restart(self, p: Any, delay: float) -> None:
        try:
            await asyncio.sleep(delay)
            if self.stopping:
                return
            p.kill_reason = ""
            p.start()
            try:
                await asyncio.to_thread(p.wait_ready, self.startup_timeout(self.spec, p.name))
            except ServiceFailed as exc:
                if p.returncode is None:  # alive but never ready: counts as a crash
                    p.kill_reason = "not ready after restart"
                    p.signal(signal.SIGKILL)
                    await asyncio.to_thread(_wait_exit, p)
                self._log(f"meshrl run: {p.name} failed to come back: {str(exc).splitlines()[0]}")
                return
            if getattr(p, "parked", False):  # the fleet drained it meanwhile
                self.sup.parked(p.name)
                self._log(f"{p.name}: the fleet drained it meanwhile (parked)")
                return
            self.sup.started(p.name, time.monotonic())
            self._log(f"{p.name} ready again")
        finally:
            self.restarting.pop(p.name, None)

    async def heartbeats(self) -> None:
        """Probe every running service's /health; kill those silent past the deadline."""
        live = self.live()
        oks = await asyncio.gather(*(asyncio.to_thread(http_get, p.url("metrics") + "/health", 1.0) for p in live))
        await self.answered({p.name: status == 200 for p, (status, _) in zip(live, oks)})

    async def answered(self, oks: dict[str, bool]) -> None:
        """Which live services answered a probe just now (their ``/health``, or the ``/metrics``
        scrape the controller makes anyway, which the same server answers); kill those
        silent past the deadline."""
        now = time.monotonic()
        self.silent = []
        for name, ok in oks.items():
            if ok:
                self.sup.beat(name, now)
            else:
                self.silent.append(name)
        for name, why in self.sup.stuck(now):
            p = self.proc(name)
            if p.returncode is None and name not in self.restarting:
                self._log(f"meshrl run: {name} is stuck ({why}); killing it")
                p.kill_reason = why
                p.signal(signal.SIGCONT)
                p.signal(signal.SIGKILL)
                await asyncio.to_thread(_wait_exit, p)

    def reap_orphans(self) -> None:
        """Kill helpers a dead service left behind (vLLM engine processes), adopted by us."""
        keep = {p.proc.pid for p in self.procs if getattr(p, "proc", None) is not None and p.returncode is None}
        gone = kill_adopted(exclude=keep)
        if gone:
            log.warning("killed %d process(es) left behind by a dead service", len(gone))

    def cancel_restarts(self) -> None:
        self.stopping = True
        for task in self.restarting.values():
            task.cancel()

    def stop_all(self) -> None:
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
        self.ports.close()
        leftovers = kill_adopted()
        if leftovers:  # vLLM engine helpers outliving their replica by a moment: expected, nothing to do
            log.info("killed %d leftover descendant process(es) of the job's services", len(leftovers))

    def describe(self) -> dict[str, dict[str, Any]]:
        """Per service: pid, alive, restarts, restarting (and its Ray node), for ``status.json``."""
        restarts = self.sup.restarts()
        return {p.name: {"pid": _pid(p), "alive": p.returncode is None, "restarts": restarts.get(p.name, 0),
                         "restarting": p.name in self.restarting,
                         **({"node": p.node} if getattr(p, "node", None) else {})}
                for p in self.procs}


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
