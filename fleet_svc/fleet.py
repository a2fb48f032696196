"""The fleet's process: start its replicas, keep them running, stop them.

:class:`Fleet` writes one rollout view per replica (the fleet's model and engine, no queues
and no weight channel: those come with each job that attaches) and starts each replica as
``python -m rollout_svc --config VIEW --id rollout-<i> --fleet-dir DIR --adapter-slots K``
(``rollout_svc/fleet_member.py``). A replica that exits is restarted with the fleet's
``restart`` policy (:mod:`services.supervision`, the same one a job applies to its
services); a replica silent on ``/health`` past ``restart.heartbeat_timeout_s`` is killed and
restarted. A restarted replica serves the attached jobs again from their views in the
fleet's directory, which outlive it; the jobs' controllers see it come back in its reports.

The fleet stops on SIGTERM/SIGINT or when its directory holds a ``stop`` request
(``meshrl fleet stop``): every replica gets SIGTERM (it stops leasing, returns or delivers what
it holds for each job, and exits), then the state file says ``stopped``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

from services.config.fleet import FleetSpec
from services.config.views import RolloutProcess, RolloutView, write_view
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

    def __init__(self, spec: FleetSpec, fdir: FleetDir, *, log_line: Callable[[str], None] = print) -> None:
        self.spec, self.fdir = spec, fdir
        self._log = log_line
        self.names = [f"rollout-{i}" for i in range(spec.replicas)]
        self.sup = Supervisor(spec.restart, self.names)
        self.procs: dict[str, ServiceProcess] = {}
        self.ports = PortReservations()
        self.restart_at: dict[str, float] = {}
        self._stop = threading.Event()
        self._detail = ""  # why the fleet failed, for its state file

    # ------------------------------------------------------------------ setup

    def views(self) -> dict[str, Path]:
        """One rollout view per replica under ``<fleet dir>/config/`` (its metrics port fixed,
        so a restarted replica comes back where the jobs look)."""
        s = self.spec
        out = {}
        for name in self.names:
            res = RolloutProcess(device=s.services.device, cpus=s.services.cpus, host=s.services.host,
                                 metrics_port=self.ports.take(s.services.host))
            view = RolloutView(model=s.model, rollout=s.rollout, resources=res)
            out[name] = write_view(view, self.fdir.path / "config" / f"{name}.yaml")
        return out

    def _process(self, name: str, view: Path) -> ServiceProcess:
        kv = self.spec.rollout.kv_cache_space_gib
        env = {"OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": str(int(max(1, kv or 1)))}
        argv = python_module_argv("rollout_svc", "--config", str(view), "--id", name, "--fleet-dir",
                                  str(self.fdir.path), "--adapter-slots", str(self.spec.max_jobs))
        return ServiceProcess(name, argv, self.fdir.log_file(name), env=env)

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
        self._state("starting")
        self._log(f"meshrl fleet: fleet {self.spec.name!r} ({len(self.names)} replica(s), {self.spec.max_jobs} "
                  f"adapter slot(s) each), directory {self.fdir.path}")
        code = 1
        try:
            for name in self.names:
                self.procs[name] = self._process(name, views[name])
            for p in self.procs.values():
                p.start()
            for p in self.procs.values():
                p.wait_ready(self.spec.rollout.engine_startup_timeout_s, self.stopping)
                if self.stopping():
                    break
                self.sup.started(p.name, time.monotonic())
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
        last_health = 0.0
        while not self.stopping():
            now = time.monotonic()
            for name, p in self.procs.items():
                if name in self.restart_at:
                    if now >= self.restart_at[name]:
                        self._restart(p)
                    continue
                if p.returncode is not None:
                    decision = self.sup.exited(name, f"exited with code {p.returncode}", now)
                    kill_adopted(exclude={q.proc.pid for q in self.procs.values() if q.proc and q.returncode is None})
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
            self._stop.wait(POLL_S)
        return 0

    def _restart(self, p: ServiceProcess) -> None:
        self.restart_at.pop(p.name, None)
        p.kill_reason = ""
        p.start()
        try:
            p.wait_ready(self.spec.rollout.engine_startup_timeout_s, self.stopping)
        except ServiceFailed as exc:
            self._log(f"meshrl fleet: {p.name} failed to come back: {str(exc).splitlines()[0]}")
            if p.returncode is None:
                p.signal(signal.SIGKILL)
            return
        self.sup.started(p.name, time.monotonic())
        self._log(f"meshrl fleet: {p.name} ready again")

    def _probe(self, now: float) -> None:
        """Beat the replicas that answer ``/health``; kill those silent past the deadline."""
        for name, p in self.procs.items():
            if name in self.restart_at or p.returncode is not None or p.ready is None:
                continue
            status, _ = http_get(p.url("metrics") + "/health", 1.0)
            if status == 200:
                self.sup.beat(name, now)
        for name, why in self.sup.stuck(now):
            p = self.procs[name]
            if p.returncode is None and name not in self.restart_at:
                self._log(f"meshrl fleet: {name} is stuck ({why}); killing it")
                p.kill_reason = why
                p.signal(signal.SIGKILL)

    def _stop_all(self) -> None:
        live = [p for p in self.procs.values() if p.returncode is None and p.proc is not None]
        for p in live:
            p.signal(signal.SIGCONT)
            p.signal(signal.SIGTERM)
        threads = [threading.Thread(target=p.stop, kwargs={"grace": 30.0}) for p in live]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        kill_adopted()
        self.ports.close()

    def _state(self, state: str, **extra: Any) -> None:
        replicas = {name: {"alive": p.returncode is None and p.proc is not None, "ready": p.ready is not None,
                           "restarts": self.sup.restarts().get(name, 0),
                           "metrics": p.url("metrics") if p.ready is not None else None,
                           "pid": p.proc.pid if p.proc is not None else None}
                    for name, p in self.procs.items()}
        self.fdir.write_state(state, self.names, members=replicas, model=self.spec.model.path,
                              max_jobs=self.spec.max_jobs, max_lora_rank=self.spec.max_lora_rank,
                              jobs=sorted(self.fdir.attached()), **extra)


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
