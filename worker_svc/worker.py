"""``meshrl worker``: the loop each service container of a deployment runs.

A deployment (compose, Kubernetes) runs one long-lived container per service (trainer,
rollout replicas, reward workers, feeder). None of them is tied to a job: each runs
``meshrl worker --role ROLE -- CMD``, which waits for the deployment's current job (the
gateway's ``deployment`` launcher hands it out through the files of
:mod:`services.handoff`), runs ``CMD`` for it (``{view}`` in CMD is replaced by the
role's view of the job, ``RUN_DIR/config/<role>.yaml``; ``{spec}`` and ``{run_dir}`` by the
job's files, ``{name}`` by the worker's name) and goes back to waiting when the job ends.

Each worker supervises its service with the job's restart policy (``services.restart``),
the same :class:`~services.supervision.Supervisor` ``meshrl run`` applies
(docs/supervision.md): a service that exits (any exit, except the trainer's ``0``) is
started again after the backoff, up to ``max_restarts`` times over the job, while the other
containers keep running; once it announced readiness its worker probes its ``/health`` and
kills one silent for ``heartbeat_timeout_s`` (then the restart rule). Every worker reports
its service's ledger counters in ``RUN_DIR/workers/<name>.json``, which the launcher sums
into the job's progress.

The trainer's worker (``--ends-job``) ends the job when the trainer exits 0 (succeeded); a
service that exhausts its restart budget fails it, naming the service and why. Once
``finished.json`` exists (whoever wrote it: a worker, or the gateway cancelling) every
worker stops its service (SIGTERM, SIGKILL after a grace period).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from services.handoff import (CONTROL, CURRENT, FINISHED, LEDGER_COUNTERS, SPEC, VIEWS, WORKERS, finish,
                                     read_json, write_json)


def _metrics_url(view: Path) -> str | None:
    """The service's own /metrics, from its view (``resources.metrics_port``), on loopback."""
    try:
        res = (yaml.safe_load(view.read_text()) or {}).get("resources") or {}
        port = int(res.get("metrics_port") or 0)
    except (OSError, yaml.YAMLError, AttributeError, TypeError, ValueError):
        return None
    return f"http://127.0.0.1:{port}/metrics" if port > 0 else None


class ServiceMeter:
    """A worker's run count and its service's ledger counters (:data:`LEDGER_COUNTERS`),
    summed over the runs of the job's service on this worker. The trainer's are taken as
    they are: a restarted trainer restores them from its checkpoint."""

    def __init__(self, role: str, before: dict[str, Any] | None) -> None:
        before = before or {}
        self.role = role
        self.runs = int(before.get("runs") or 0) + 1
        kept = before.get("counters") if isinstance(before.get("counters"), dict) else {}
        self.base = {} if role == "trainer" else {k: float(v) for k, v in kept.items() if isinstance(v, (int, float))}
        self.counters = dict(kept) if role == "trainer" else dict(self.base)
        self.ready = False  # the service answered /ready once (the stall clock waits for every service)

    def read(self, url: str) -> bool:
        from services.metrics.scrape import http_get, scrape

        if not self.ready:
            self.ready = http_get(url.rsplit("/", 1)[0] + "/ready", timeout=2.0)[0] == 200
        got = scrape(url, timeout=2.0)
        if not got:
            return False
        self.counters = {k: self.base.get(k, 0.0) + got.get(k, 0.0) for k in LEDGER_COUNTERS
                         if k in got or k in self.base}
        return True

    def restarted(self) -> None:
        """Its worker started the service again: the counters of the runs before carry on."""
        if self.role != "trainer":
            self.base = dict(self.counters)
        self.ready = False

    def fields(self) -> dict[str, Any]:
        return {"runs": self.runs, "counters": self.counters, "ready": self.ready}


class Worker:
    """Runs ``command`` for every job the deployment's gateway hands out (see the module doc)."""

    def __init__(self, role: str, runs_dir: str | Path, command: list[str], *, name: str | None = None,
                 ends_job: bool = False, grace_s: float = 30.0, poll_s: float = 0.5,
                 state_file: str | Path | None = None, scrape_s: float = 5.0) -> None:
        if not command:
            raise ValueError("meshrl worker: give the service's command after --")
        self.role, self.runs_dir, self.command = role, Path(runs_dir), list(command)
        self.name = name or f"{role}-{socket.gethostname()}"
        self.ends_job, self.grace_s, self.poll_s = ends_job, grace_s, poll_s
        self.state_file = Path(state_file) if state_file else None
        self.scrape_s = scrape_s
        self._stop = False
        self._done: set[str] = set()

    def stop(self, *_: Any) -> None:
        self._stop = True

    def _idle(self, idle: bool, job: str = "") -> None:
        self._state("idle" if idle else "starting", job)

    def _state(self, word: str, job: str = "") -> None:
        """For the container's health check: ``idle``, ``starting JOB`` (the service is
        not ready yet), ``restarting JOB`` (waiting out a restart's backoff) -- all healthy
        by themselves -- or ``running JOB``, when the check is the service's /health."""
        if self.state_file is not None:
            self.state_file.write_text(f"{word} {job}".strip() + "\n")


    def next_job(self) -> tuple[str, Path] | None:
        cur = read_json(self.runs_dir / CURRENT)
        if not cur or not cur.get("run_dir") or not cur.get("job_id"):
            return None
        run_dir = Path(cur["run_dir"])
        if str(run_dir) in self._done or (run_dir / FINISHED).exists() or not (run_dir / SPEC).exists():
            return None
        return str(cur["job_id"]), run_dir

    def run_forever(self) -> int:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        self._idle(True)
        while not self._stop:
            job = self.next_job()
            if job is None:
                time.sleep(self.poll_s)
                continue
            self.run_job(*job)
            self._idle(True)
        return 0

    def _report(self, run_dir: Path, **fields: Any) -> None:
        write_json(run_dir / WORKERS / f"{self.name}.json", {"name": self.name, "role": self.role, **fields})

    def run_job(self, job_id: str, run_dir: Path) -> int | None:
        """Run the role's service for one job, supervised by the job's restart policy
        (``services.restart``, the same :class:`~services.supervision.Supervisor` as
        ``meshrl run``): a crash is restarted after the backoff until the budget is spent,
        and a service whose ``/health`` stays silent is killed and restarted (see the module
        doc). Returns the service's last exit code."""
        from services import auth
        from services.procs import log_tail
        from services.supervision import Supervisor
        from services.metrics.scrape import http_get
        from services.readiness import scan_log_for_ready

        self._done.add(str(run_dir))
        self._idle(False, job_id)
        policy = job_restart_policy(run_dir)
        sup = Supervisor(policy, [self.name])
        view = run_dir / VIEWS / f"{self.role}.yaml"
        argv = [a.replace("{view}", str(view)).replace("{spec}", str(run_dir / SPEC)).replace("{run_dir}", str(run_dir))
                .replace("{name}", self.name) for a in self.command]
        env = dict(os.environ, MESHRL_RUN_DIR=str(run_dir), MESHRL_JOB_ID=job_id, PYTHONUNBUFFERED="1")
        if (run_dir / auth.FILE_NAME).exists():
            env[auth.ENV] = str(run_dir / auth.FILE_NAME)
        log_path = run_dir / "logs" / f"{self.name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # A worker that comes back (its container restarted) runs the job's service again:
        # one more run, and the counters of the runs before carry on (docs/metrics.md).
        meter = ServiceMeter(self.role, read_json(run_dir / WORKERS / f"{self.name}.json"))
        metrics_url = _metrics_url(view)
        proc: subprocess.Popen | None = None
        rc: int | None = None
        restart_at = 0.0
        offset, url, kill_reason, answering = 0, None, "", True
        paused = stopping_since = None
        next_scrape = time.monotonic() + self.scrape_s
        info: dict[str, Any] = {}  # what this worker last reported beside its state
        while True:
            now = time.monotonic()
            stopping = self._stop or (run_dir / FINISHED).exists()
            if proc is None:  # not started yet, or waiting out a restart's backoff
                if stopping:
                    break
                if now >= restart_at:
                    with open(log_path, "ab") as log:
                        offset = log.tell()  # this start's output: its readiness line is after it
                        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                                cwd=run_dir, env=env, start_new_session=True)
                    url, kill_reason, answering, paused = None, "", True, None
                    self._state("starting", job_id)
                    if sup.restarts()[self.name]:
                        meter.restarted()
                    info = {"pid": proc.pid, "started": time.time(), "restarts": sup.restarts()[self.name]}
                    self._report(run_dir, state="running", **info, **meter.fields())
                    continue
            elif (rc := proc.poll()) is not None:
                self._signal(proc, signal.SIGKILL)  # helpers the service left behind in its session
                if stopping:
                    break
                if self.ends_job and rc == 0:
                    finish(run_dir, "succeeded", f"{self.name} finished")
                    break
                how = f"exited with code {rc}" + (f" ({kill_reason})" if kill_reason else "")
                decision = sup.exited(self.name, how, now)
                if decision.action == "fail":
                    self._say(log_path, decision.reason)
                    finish(run_dir, "failed",
                           f"{self.name} ({self.role}): {decision.reason}; last lines of its log:\n{log_tail(log_path)}")
                    break
                self._say(log_path, decision.reason)
                info = {"exit_code": rc, "last_exit": how, "restarts": sup.restarts()[self.name]}
                self._report(run_dir, state="restarting", **info, **meter.fields())
                self._state("restarting", job_id)
                proc, restart_at = None, now + decision.delay_s
                continue
            elif stopping:
                if stopping_since is None:
                    stopping_since = now
                    self._signal(proc, signal.SIGTERM)
                    self._signal(proc, signal.SIGCONT)
                elif now - stopping_since > self.grace_s:
                    self._signal(proc, signal.SIGKILL)
            else:
                want = bool((read_json(run_dir / CONTROL) or {}).get("paused", False))
                if want != bool(paused):
                    self._signal(proc, signal.SIGSTOP if want else signal.SIGCONT)
                    paused = want
                    if not want:  # a pause is not silence
                        sup.beat(self.name, now)
                if not paused:
                    if url is None:
                        ready, offset = scan_log_for_ready(log_path, offset)
                        if ready is not None and "metrics" in ready.addresses:
                            url = "http://" + local_address(ready.address("metrics"))
                            sup.started(self.name, now)
                            self._state("running", job_id)
                    else:
                        answering = http_get(url + "/health", timeout=1.0)[0] == 200
                        if answering:
                            sup.beat(self.name, now)
                        for _, why in sup.stuck(now) if not kill_reason else ():
                            self._say(log_path, f"{self.name} is stuck ({why}); killing it")
                            kill_reason = why
                            self._signal(proc, signal.SIGCONT)
                            self._signal(proc, signal.SIGKILL)
                    scrape_url = metrics_url or (url + "/metrics" if url else None)
                    if scrape_url and now >= next_scrape:
                        next_scrape = now + self.scrape_s
                        if meter.read(scrape_url):
                            self._report(run_dir, state="running", **info, **meter.fields(), answering=answering)
            time.sleep(self.poll_s)
        self._report(run_dir, state="exited", exit_code=rc, ended=time.time(),
                     restarts=sup.restarts()[self.name], **meter.fields())
        return rc

    def _say(self, log_path: Path, msg: str) -> None:
        """A supervision event: on the worker's output and in the service's log."""
        line = f"meshrl worker: {msg}"
        print(line, flush=True)
        try:
            with open(log_path, "a") as fh:
                fh.write(line + "\n")
        except OSError:
            pass

    @staticmethod
    def _signal(proc: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def job_restart_policy(run_dir: Path) -> Any:
    """The job's ``services.restart`` (its spec.yaml), the defaults where it says nothing."""
    from services.config.restart import RestartConfig

    try:
        raw = yaml.safe_load((run_dir / SPEC).read_text()) or {}
        return RestartConfig.model_validate(((raw.get("services") or {}).get("restart")) or {})
    except (OSError, yaml.YAMLError, ValueError, AttributeError):
        return RestartConfig()


def local_address(address: str) -> str:
    """``host:port`` a service announced, as its worker (in the same container) reaches it:
    a wildcard bind is the loopback."""
    host, _, port = address.rpartition(":")
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host in ("::", "[::]"):
        host = "[::1]"
    return f"{host}:{port}"


def add_worker_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--role", required=True, help="the service this container runs: trainer, rollout, reward, feeder...")
    p.add_argument("--runs-dir", default=os.environ.get("MESHRL_RUNS_DIR", "runs"),
                   help="the RUNS_DIR the deployment's gateway shares (default $MESHRL_RUNS_DIR)")
    p.add_argument("--name", default=None, help="this worker's name (default ROLE-HOSTNAME)")
    p.add_argument("--ends-job", action="store_true", help="the job ends when this service exits (the trainer)")
    p.add_argument("--grace", type=float, default=30.0, help="seconds from SIGTERM to SIGKILL when a job ends")
    p.add_argument("--scrape", type=float, default=5.0,
                   help="seconds between reads of the service's /metrics for the job ledger (its report)")
    p.add_argument("--state-file", default="/tmp/meshrl-worker.state",
                   help="'idle', 'starting JOB', 'restarting JOB' or 'running JOB' (the service announced "
                   "readiness: check its /health) for the container's health check")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="-- then the service's command; {view} is the role's view of the job (RUN_DIR/config/ROLE.yaml), "
                   "{spec} and {run_dir} name the job's files, {name} this worker")
