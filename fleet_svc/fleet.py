"""The fleet's process: start its replicas, keep them running, stop them.

:class:`Fleet` writes one rollout view per replica (the fleet's model and engine, no queues
and no weight channel: those come with each job that attaches) and starts each replica as
``python -m rollout_svc --config VIEW --id rollout-<i> --fleet-dir DIR --adapter-slots K``
(``rollout_svc/fleet_member.py``). A replica that exits is restarted with the fleet's
``restart`` policy (:mod:`services.supervision`, the same one a job applies to its
services); a replica silent on ``/health`` past ``restart.heartbeat_timeout_s`` is killed and
restarted. A restarted replica serves the attached jobs again from their views in the
fleet's directory, which outlive it; the jobs' controllers see it come back in its reports.

With ``scaling.max_replicas`` above ``scaling.min_replicas`` the replica count follows the
jobs' backlog (:mod:`fleet_svc.scaling`): every ``scaling.interval_s`` the fleet reads the
jobs' load files, its policy decides, and the fleet starts a replica (the next free name; it
serves every attached job, each from that job's current version, before it leases) or drains
one (the newest: its phase becomes ``draining`` in the state file first, so the jobs'
controllers take its exit for a departure, not a crash; then SIGTERM: it stops leasing and
delivers or returns what it holds; killed after ``scaling.drain_timeout_s``). Each decision
is a line of ``events.jsonl``, a log line and ``meshrl_fleet_scale_decisions_total{reason}``
on the fleet's ``/metrics``.

The fleet stops on SIGTERM/SIGINT or when its directory holds a ``stop`` request
(``meshrl fleet stop``): every replica gets SIGTERM (it stops leasing, returns or delivers what
it holds for each job, and exits), then the state file says ``stopped``.

With ``services.launcher: ray`` the fleet's process is the Ray driver (``services.ray.address``)
and each replica runs in a Ray actor (:class:`~services.ray_launcher.placement.RayServiceProcess`,
the handle a job's controller has of its Ray services: ``start``, ``wait_ready``,
``returncode``, ``signal``, ``stop``), which starts the same command on its node. Each replica
has a placement group of its own (:class:`~services.ray_launcher.placement.InstanceGroups`: one
bundle, ``services.ray.replica``), created when the replica starts and removed when it is
drained or the fleet stops; a restart reuses it. Not one group with a bundle per possible
replica (``max_replicas``): that would hold the cluster's CPUs and GPUs for replicas the
fleet drained, which scaling down is there to give back, and would keep a fleet from
starting on a cluster that has room for ``min_replicas`` only. So a replica that joins may
wait for room: past ``services.ray.placement_timeout_s`` its join fails (the replica is
``off`` again, its group removed) and the policy may try again after its cool-down. Scaling is
otherwise the same: a join starts an actor, a drain SIGTERMs the replica through its actor
and waits (SIGKILL after ``scaling.drain_timeout_s``), a dead actor (its process or its node
gone) is an exit (code -9) the supervisor restarts. The replica's view is rendered for the
node its actor landed on (its servers bind the node's IP, its metrics port one free there,
the same again when it comes back to that node); it reads the fleet's directory at the same
path as the fleet's process, so on a multi-node cluster that path must be on a filesystem
every node shares.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

from fleet_svc.scaling import BacklogPolicy, Decision, ScalingPolicy, SignalReader, job_load
from services.config.fleet import FleetSpec
from services.config.views import RolloutProcess, RolloutView, dump_view, write_view
from services.fleets import FleetDir
from services.metrics.scrape import http_get
from services.net import PortReservations
from services.procs import ServiceFailed, ServiceProcess, kill_adopted, python_module_argv
from services.supervision import Supervisor

log = logging.getLogger("meshrl.fleet")

POLL_S = 0.5
HEALTH_EVERY_S = 2.0


class Fleet:
    """The replicas of fleet ``spec`` with their state in ``fdir`` (see module doc)."""

    def __init__(self, spec: FleetSpec, fdir: FleetDir, *, log_line: Callable[[str], None] = print,
                 policy: ScalingPolicy | None = None) -> None:
        self.spec, self.fdir = spec, fdir
        self._log = log_line
        self.names = spec.replica_names()  # every replica it may run (max_replicas)
        self.bounds = spec.scaling.bounds(spec.replicas)
        self.sup = Supervisor(spec.restart, self.names)
        self.procs: dict[str, ServiceProcess] = {}
        #: per replica: off | starting | serving | draining (in the state file: what jobs follow)
        self.phase: dict[str, str] = {n: "off" for n in self.names}
        self.ports = PortReservations()
        self.restart_at: dict[str, float] = {}
        self.policy = policy or BacklogPolicy.from_config(spec.scaling)
        self.signals = SignalReader()
        self.last_signals: dict[str, Any] = {}
        self.metrics = FleetMetrics(spec.name)
        self._changes: dict[str, threading.Thread] = {}  # replicas starting or draining
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._detail = ""  # why the fleet failed, for its state file
        self.on_ray = spec.services.launcher == "ray"
        self.placement: Any = None  # services.launcher=ray: the replicas' placement groups (InstanceGroups)
        self._views: dict[str, RolloutView] = {}
        self._node_ports: dict[tuple[str, str], int] = {}  # (replica, Ray node) -> its metrics port there

    # ------------------------------------------------------------------ setup

    def views(self) -> dict[str, Path]:
        """One rollout view per replica under ``<fleet dir>/config/`` (its metrics port fixed,
        so a restarted replica comes back where the jobs look)."""
        s = self.spec
        out = {}
        for name in self.names:
            # on Ray: the host and port of the node the replica lands on (_render)
            port = 0 if self.on_ray else self.ports.take(s.services.host)
            res = RolloutProcess(device=s.services.device, cpus=s.services.cpus, host=s.services.host,
                                 metrics_port=port)
            view = self._views[name] = RolloutView(model=s.model, rollout=s.rollout, resources=res)
            out[name] = write_view(view, self.fdir.path / "config" / f"{name}.yaml")
        return out

    def _render(self, name: str, node: dict[str, Any]) -> str:
        """The view of replica ``name`` for the Ray node its actor landed on: its servers bind
        the node's IP, its metrics port is one free there (the same one when it comes back to
        that node)."""
        view = self._views[name]
        port = self._node_ports.setdefault((name, node["node_id"]), int(node["ports"][0]))
        res = view.resources.model_copy(update={"host": node["ip"], "metrics_port": port})
        return dump_view(view.model_copy(update={"resources": res}))

    def _connect(self) -> None:
        """Connect to the Ray cluster as its driver (services.launcher=ray); the replicas'
        placement groups come with their starts. Ray's driver takes SIGTERM for itself: the
        fleet's handlers are put back."""
        from services.ray_launcher.placement import InstanceGroups

        s = self.spec
        bundle: dict[str, float] = {"CPU": self._replica_cpus()}
        if s.services.device == "cuda":
            bundle["GPU"] = 1.0
        bundle.update({k: float(v) for k, v in s.services.ray.replica.resources.items()})
        bundle = {k: v for k, v in bundle.items() if v > 0}
        labels = dict(s.services.ray.replica.labels)
        self.placement = InstanceGroups(s.services.ray, f"fleet-{s.name}", {n: bundle for n in self.names},
                                        {n: labels for n in self.names})
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.placement.connect()
        finally:
            if threading.current_thread() is threading.main_thread():
                for sig, handler in handlers.items():
                    if handler is not None:
                        signal.signal(sig, handler)
        self._log(f"meshrl fleet: Ray cluster at {self.placement.address}; each replica in a placement group of "
                  f"its own {bundle}")

    def _replica_cpus(self) -> float:
        from services.placement import parse_cpu_list

        s = self.spec.services
        if s.ray.replica.num_cpus is not None:
            return float(s.ray.replica.num_cpus)
        return float(len(parse_cpu_list(s.cpus))) if s.cpus else 1.0

    def _process(self, name: str, view: Path) -> ServiceProcess:
        kv = self.spec.rollout.kv_cache_space_gib
        env = {"OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": str(int(max(1, kv or 1)))}
        args = ["--fleet-dir", str(self.fdir.path), "--adapter-slots", str(self.spec.max_jobs)]
        if self.placement is not None:
            from services.ray_launcher.placement import RayServiceProcess

            return RayServiceProcess(name, "rollout_svc", self.placement, lambda node: self._render(name, node), view,
                                     self.fdir.log_file(name), env, args=args)
        argv = python_module_argv("rollout_svc", "--config", str(view), "--id", name, *args)
        return ServiceProcess(name, argv, self.fdir.log_file(name), env=env)

    def _kill_adopted(self) -> None:
        """Kill what a dead local replica left behind (its vLLM engine processes, adopted by
        this subreaper). On Ray nothing of a replica is this process's: its actor's stop
        and guard end its process group on its node."""
        if not self.on_ray:
            kill_adopted(exclude={q.proc.pid for q in self.procs.values() if q.proc and q.returncode is None})

    def _release(self, name: str) -> None:
        """Give replica ``name``'s placement group back to the Ray cluster (a drain, a failed join)."""
        if self.placement is not None:
            self.placement.release_instance(name)

    # ------------------------------------------------------------------ run

    def stop(self) -> None:
        self._stop.set()

    def stopping(self) -> bool:
        return self._stop.is_set() or self.fdir.stop_requested()

    def run(self) -> int:
        """Start the replicas, supervise them until asked to stop; 0 on a clean stop, 1 when a
        replica ran out of restarts or never became ready."""
        from services.config.loader import dump_model

        self.fdir.create(dump_model(self.spec))
        views = self.views()
        self.http = self.metrics.serve(self.spec.services.host, self.spec.services.metrics_port, self.status)
        first = self.names[:self.spec.replicas]
        for name in first:
            self.phase[name] = "starting"
        if self.on_ray:
            try:
                self._connect()
            except ServiceFailed as exc:
                self._log(f"meshrl fleet: {exc}")
                self.phase = {n: "off" for n in self.names}
                self._stop_all()
                self._state("failed", detail=str(exc).splitlines()[0])
                self._log("meshrl fleet: failed")
                return 1
        for name in self.names:
            self.procs[name] = self._process(name, views[name])
        self._state("starting")
        lo, hi = self.bounds
        self._log(f"meshrl fleet: fleet {self.spec.name!r} ({len(first)} replica(s)"
                  + (f", {lo}..{hi} on the backlog" if hi > lo else "") + f", {self.spec.max_jobs} "
                  f"adapter slot(s) each), directory {self.fdir.path}, metrics {self.http.host}:{self.http.port}")
        code = 1
        try:
            for name in first:
                self.procs[name].start()
            for name in first:
                p = self.procs[name]
                p.wait_ready(self.spec.rollout.engine_startup_timeout_s, self.stopping)
                if self.stopping():
                    break
                self.sup.started(p.name, time.monotonic())
                self.phase[name] = "serving"
                self._log(f"meshrl fleet: {p.name} ready ({p.url('metrics')})")
            if not self.stopping():
                self._state("ready")
                self._log(f"meshrl fleet: ready; jobs attach with services.rollout.fleet={self.spec.name}")
            code = self._supervise()
        except ServiceFailed as exc:
            self._log(f"meshrl fleet: {exc}")
            self._detail = str(exc).splitlines()[0]
            code = 1
        finally:
            self._stop_all()
            final = "stopped" if code == 0 else "failed"
            self._state(final, **({"detail": self._detail} if self._detail else {}))
            self._log(f"meshrl fleet: {final}")
        return code

    def _supervise(self) -> int:
        last_health = last_scale = 0.0
        while not self.stopping():
            now = time.monotonic()
            for name, p in self.procs.items():
                if self.phase[name] != "serving":
                    continue  # off, or starting / draining under their own thread
                if name in self.restart_at:
                    if now >= self.restart_at[name]:
                        self._restart(p)
                    continue
                if p.returncode is not None:
                    decision = self.sup.exited(name, f"exited with code {p.returncode}"
                                               + (f" ({p.kill_reason})" if self.on_ray and p.kill_reason else ""), now)
                    self._kill_adopted()
                    if decision.action == "fail":
                        self._detail = decision.reason
                        self._log(f"meshrl fleet: {decision.reason}")
                        return 1
                    self._log(f"meshrl fleet: {decision.reason}")
                    self.restart_at[name] = now + decision.delay_s
            if now - last_health >= HEALTH_EVERY_S:
                last_health = now
                self._probe(now)
                self._state("ready")
            if now - last_scale >= self.spec.scaling.interval_s:
                last_scale = now
                self.scale(now)
            self._stop.wait(POLL_S)
        return 0

    # ------------------------------------------------------------------ scaling

    def read_signals(self, now: float):
        """The fleet's signals now: its replicas' phases and the jobs' load files."""
        with self._lock:
            serving = sum(ph == "serving" for ph in self.phase.values())
            changing = sum(ph in ("starting", "draining") for ph in self.phase.values())
        loads = {job: job_load(data) for job, data in self.fdir.loads().items()}
        return self.signals.read(loads, now=now, wall=time.time(), serving=serving, changing=changing)

    def scale(self, now: float) -> Decision:
        """Read the signals, ask the policy, carry out its decision (see module doc)."""
        self._follow_bounds()
        s = self.read_signals(now)
        self.last_signals = s.as_dict()
        self.metrics.observe(s, self.desired())
        d = self.policy.decide(s, *self.bounds)
        if d.action == "hold":
            return d
        total = s.serving + s.changing
        target = total + d.count if d.action == "add" else total - d.count
        self._log(f"meshrl fleet: scaling {total} -> {target} replica(s) ({d.reason}: backlog "
                  f"{s.backlog:g} group(s), {s.backlog_per_replica:.2f} per replica, {s.jobs} job(s), trainer "
                  f"waiting {s.trainer_wait:.0%})")
        self.metrics.decided(d.reason)
        if d.action == "add":
            chosen = [n for n in self.names if self.phase[n] == "off"][:d.count]
            for name in chosen:
                self._begin(name, "starting", self._join)
        else:
            chosen = [n for n in reversed(self.names) if self.phase[n] == "serving"][:d.count]
            for name in chosen:
                self._begin(name, "draining", self._drain)
        self.fdir.add_event({"action": d.action, "reason": d.reason, "replicas": chosen, "from": total,
                             "to": target, "signals": self.last_signals})
        self.policy.changed(now)
        self._state("ready")
        return d

    def _follow_bounds(self) -> None:
        """The operator's bounds (``meshrl fleet scale``), within 1 .. the spec's largest."""
        asked = self.fdir.requested_bounds()
        spec_bounds = self.spec.scaling.bounds(self.spec.replicas)
        want = spec_bounds if asked is None else asked
        if want == self.bounds:
            return
        lo, hi = want
        if not 1 <= lo <= hi <= len(self.names):
            self._log(f"meshrl fleet: ignoring the bounds {lo}..{hi} asked for: they must satisfy "
                      f"1 <= min <= max <= {len(self.names)} (scaling.max_replicas)")
            self.fdir.bounds_file.unlink(missing_ok=True)
            return
        self._log(f"meshrl fleet: replica bounds {self.bounds[0]}..{self.bounds[1]} -> {lo}..{hi}")
        self.bounds = want

    def desired(self) -> int:
        with self._lock:
            return sum(ph in ("starting", "serving") for ph in self.phase.values())

    def _begin(self, name: str, phase: str, work: Callable[[str], None]) -> None:
        with self._lock:
            self.phase[name] = phase
        if phase == "draining":
            self.sup.parked(name)  # its exit is no crash
            self.restart_at.pop(name, None)
            self._state("ready")  # the jobs read "draining" before the replica lets their groups go
        t = threading.Thread(target=work, args=(name,), name=f"{phase}-{name}", daemon=True)
        self._changes[name] = t
        t.start()

    def _join(self, name: str) -> None:
        """Start replica ``name`` and wait until it is ready (it then takes every attached job,
        each at the job's current version before leasing: rollout_svc/fleet_member.py)."""
        p = self.procs[name]
        p.kill_reason = ""
        if not self._bring_up(p, "failed to start"):
            if self.on_ray:
                p.stop(grace=0.0)  # its actor, if any, ends
                self._release(name)
            with self._lock:
                self.phase[name] = "off"
            return
        if self.stopping():
            return
        self.sup.started(name, time.monotonic())
        with self._lock:
            self.phase[name] = "serving"
        self._log(f"meshrl fleet: {name} joined ({p.url('metrics')})")
        self._state("ready")

    def _drain(self, name: str) -> None:
        """Stop replica ``name``: SIGTERM (it stops leasing, delivers or returns what it holds
        for each job, and exits), SIGKILL after ``scaling.drain_timeout_s``."""
        p = self.procs[name]
        if self.on_ray:  # through its actor, which then ends (also when the replica exited already)
            code = p.stop(grace=self.spec.scaling.drain_timeout_s)
            self._release(name)
        else:
            code = p.stop(grace=self.spec.scaling.drain_timeout_s) if p.returncode is None else p.returncode
        self._kill_adopted()
        with self._lock:
            self.phase[name] = "off"
        self._log(f"meshrl fleet: {name} drained (exit code {code})")
        self._state("ready")

    def _restart(self, p: Any) -> None:
        self.restart_at.pop(p.name, None)
        p.kill_reason = ""
        if not self._bring_up(p, "failed to come back"):
            return
        self.sup.started(p.name, time.monotonic())
        self._log(f"meshrl fleet: {p.name} ready again")

    def _bring_up(self, p: Any, failed: str) -> bool:
        """Start ``p`` and wait until it is ready; False (logged as ``failed``, the process
        killed) when it does not come up."""
        try:
            p.start()
            p.wait_ready(self.spec.rollout.engine_startup_timeout_s, self.stopping)
        except ServiceFailed as exc:
            self._log(f"meshrl fleet: {p.name} {failed}: {str(exc).splitlines()[0]}")
            if p.returncode is None:
                p.signal(signal.SIGKILL)
            return False
        return True

    def _probe(self, now: float) -> None:
        """Beat the replicas that answer ``/health``; kill those silent past the deadline."""
        for name, p in self.procs.items():
            if self.phase[name] != "serving" or name in self.restart_at or p.returncode is not None or p.ready is None:
                continue
            status, _ = http_get(p.url("metrics") + "/health", 1.0)
            if status == 200:
                self.sup.beat(name, now)
        for name, why in self.sup.stuck(now):
            p = self.procs[name]
            if p.returncode is None and name not in self.restart_at and self.phase[name] == "serving":
                self._log(f"meshrl fleet: {name} is stuck ({why}); killing it")
                p.kill_reason = why
                p.signal(signal.SIGKILL)

    def _stop_all(self) -> None:
        live = [p for p in self.procs.values() if p.returncode is None and _started(p)]
        for p in live:
            p.signal(signal.SIGCONT)
            p.signal(signal.SIGTERM)
        # on Ray also the actors of replicas that exited (a stop ends the actor)
        ending = [p for p in self.procs.values() if _started(p)] if self.on_ray else live
        threads = [threading.Thread(target=p.stop, kwargs={"grace": 30.0}) for p in ending]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for t in list(self._changes.values()):
            t.join(timeout=5.0)
        if self.placement is not None:
            self.placement.release()  # every replica's group, and the connection
        else:
            kill_adopted()
        self.ports.close()
        if getattr(self, "http", None) is not None:
            self.http.stop()

    def status(self) -> dict[str, Any]:
        """The fleet process's ``/status``: its state file's content."""
        return self.fdir.state() or {}

    def _state(self, state: str, **extra: Any) -> None:
        with self._lock:
            phase = dict(self.phase)
        replicas = {name: {"phase": phase[name], "alive": p.returncode is None and _started(p),
                           "ready": p.ready is not None, "restarts": self.sup.restarts().get(name, 0),
                           "metrics": p.url("metrics") if p.ready is not None and p.returncode is None else None,
                           "pid": _pid(p), **({"node": p.node} if getattr(p, "node", None) else {})}
                    for name, p in self.procs.items()}
        lo, hi = self.bounds
        scaling = {"min": lo, "max": hi, "desired": sum(ph in ("starting", "serving") for ph in phase.values()),
                   "policy": self.policy.name, "signals": self.last_signals}
        metrics = f"{self.http.host}:{self.http.port}" if getattr(self, "http", None) is not None else None
        self.fdir.write_state(state, self.names, members=replicas, model=self.spec.model.path,
                              max_jobs=self.spec.max_jobs, max_lora_rank=self.spec.max_lora_rank,
                              jobs=sorted(self.fdir.attached()), scaling=scaling, metrics=metrics, **extra)


def _started(p: Any) -> bool:
    """A replica with a process (local) or an actor (Ray) of its own now."""
    return getattr(p, "proc", None) is not None or getattr(p, "actor", None) is not None


def _pid(p: Any) -> int | None:
    """A replica's pid (on its node, for a Ray actor's replica)."""
    proc = getattr(p, "proc", None)
    return proc.pid if proc is not None else getattr(p, "pid", None)


class FleetMetrics:
    """The fleet process's ``/metrics``: replicas per phase, the signals, the decisions."""

    def __init__(self, fleet: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = r = CollectorRegistry()
        self.replicas = Gauge("meshrl_fleet_replicas", "replicas serving", registry=r)
        self.desired = Gauge("meshrl_fleet_desired_replicas", "replicas serving or starting", registry=r)
        self.changing = Gauge("meshrl_fleet_changing_replicas", "replicas starting or draining", registry=r)
        self.jobs = Gauge("meshrl_fleet_jobs", "jobs attached", registry=r)
        self.backlog = Gauge("meshrl_fleet_backlog_groups", "prompt groups queued and not leased, all jobs", registry=r)
        self.per_replica = Gauge("meshrl_fleet_backlog_per_replica", "backlog per serving replica (what the "
                                 "scaling policy and a Kubernetes HPA scale on)", registry=r)
        self.wait = Gauge("meshrl_fleet_trainer_wait_ratio", "largest share of time a job's trainer waited for "
                          "samples", registry=r)
        self.stale = Gauge("meshrl_fleet_dropped_stale_per_second", "samples dropped as stale per second, all jobs",
                           registry=r)
        self.tokens = Gauge("meshrl_fleet_tokens_per_second", "generated tokens per second, all jobs", registry=r)
        self.decisions = Counter("meshrl_fleet_scale_decisions", "replica count changes, by reason",
                                 ["reason"], registry=r)

    def serve(self, host: str, port: int, status: Callable[[], dict[str, Any]]):
        from services.metrics import MetricsServer

        return MetricsServer(self.registry, host=host, port=port, ready=lambda: True, status=status).start()

    def observe(self, s: Any, desired: int) -> None:
        self.replicas.set(s.serving)
        self.desired.set(desired)
        self.changing.set(s.changing)
        self.jobs.set(s.jobs)
        self.backlog.set(s.backlog)
        self.per_replica.set(s.backlog_per_replica)
        self.wait.set(s.trainer_wait)
        self.stale.set(s.dropped_stale_per_s)
        self.tokens.set(s.tokens_per_s)

    def decided(self, reason: str) -> None:
        self.decisions.labels(reason).inc()


def run_fleet(spec: FleetSpec, fdir: FleetDir) -> int:
    """Run fleet ``spec`` in this process until SIGTERM/SIGINT or ``meshrl fleet stop``."""
    from services.procs import become_subreaper

    if fdir.running():
        raise RuntimeError(f"fleet {spec.name!r} is already running (pid {fdir.state()['pid']}); "
                           f"`meshrl fleet stop {spec.name}` first")
    os.umask(0o077)
    become_subreaper()  # vLLM's engine processes of a dead replica are ours to reap
    fleet = Fleet(spec, fdir)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: fleet.stop())
    return fleet.run()
