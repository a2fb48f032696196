"""Jobs on a deployment's own services (compose, Kubernetes): the gateway's ``deployment``
launcher and the ``meshrl worker`` loop each service container runs.

A deployment runs one long-lived container per service (trainer, rollout replicas, reward
workers, feeder). None of them is tied to a job: each runs ``meshrl worker --role ROLE -- CMD``,
which waits for the deployment's current job, runs ``CMD`` for it (``{view}`` in CMD is
replaced by the role's view of the job, ``RUN_DIR/config/<role>.yaml``; ``{spec}`` and
``{run_dir}`` by the job's files, ``{name}`` by the worker's name) and
goes back to waiting when the job ends. The gateway never starts a process of a job itself; it only writes files on the
storage the whole deployment shares (``RUNS_DIR``):

    RUNS_DIR/current-job.json           {"job_id", "run_dir"}: the job the workers run now
    RUN_DIR/spec.yaml                   the submitted spec + the deployment's wiring
    RUN_DIR/config/<service>.yaml       each service's view of it (its whole config: {view})
    RUN_DIR/job.credential              the job's credential (0600) -- unless the deployment
                                        gives every container one from a secret
    RUN_DIR/control.json                {"paused": bool}         (gateway -> workers)
    RUN_DIR/finished.json               {"state", "detail"}      (first writer wins)
    RUN_DIR/workers/<name>.json         {"role", "state", "exit_code", ...} (each worker)
    RUN_DIR/logs/<name>.log             the service's output

The wiring (``--deployment-config``, e.g. ``deploy/config/deployment.yaml``) is the part
of a spec that belongs to the deployment, not to the job: where the services bind and meet
(queues, hosts, ports) and where checkpoints go; ``{job_id}`` in its strings is replaced.
A job ends when the trainer's worker sees the trainer exit (0 = succeeded), when any other
service exits with an error (failed, naming it), or when the gateway cancels it; every
worker then stops its service (SIGTERM, SIGKILL after a grace period). If no worker takes a
job within ``pickup_timeout_s`` it fails with a message saying so.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from services.launch.base import JobState, JobStatus, LaunchError, Launcher

CURRENT = "current-job.json"
SPEC = "spec.yaml"
VIEWS = "config"  # RUN_DIR/config/<service>.yaml: the services' views of the job
CONTROL = "control.json"
FINISHED = "finished.json"
WORKERS = "workers"
WIRING_ENV = "MESHRL_DEPLOYMENT_CONFIG"


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def finish(run_dir: Path, state: str, detail: str) -> bool:
    """Record how the job ended; only the first caller's word counts (returns whether it was ours)."""
    try:
        fd = os.open(run_dir / FINISHED, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps({"state": state, "detail": detail[-4000:], "at": time.time()}))
    return True


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def _substitute(node: Any, job_id: str) -> Any:
    if isinstance(node, dict):
        return {k: _substitute(v, job_id) for k, v in node.items()}
    if isinstance(node, list):
        return [_substitute(v, job_id) for v in node]
    return node.replace("{job_id}", job_id) if isinstance(node, str) else node


class DeploymentLauncher(Launcher):
    """Hands jobs to the deployment's ``meshrl worker`` containers (see the module docstring)."""

    kind = "deployment"

    def __init__(self, wiring: str | Path | dict | None = None, pickup_timeout_s: float = 600.0,
                 stop_timeout_s: float = 60.0) -> None:
        wiring = wiring if wiring is not None else os.environ.get(WIRING_ENV)
        if wiring is None:
            raise LaunchError(f"the deployment launcher needs the deployment's wiring: --deployment-config FILE "
                              f"or {WIRING_ENV} (e.g. deploy/config/deployment.yaml)")
        if not isinstance(wiring, dict):
            try:
                wiring = yaml.safe_load(Path(wiring).read_text()) or {}
            except (OSError, yaml.YAMLError) as exc:
                raise LaunchError(f"cannot read the deployment wiring {wiring}: {exc}") from None
        if not isinstance(wiring, dict):
            raise LaunchError("the deployment wiring must be a mapping of job-spec blocks")
        self.wiring = wiring
        self.pickup_timeout_s = pickup_timeout_s
        self.stop_timeout_s = stop_timeout_s

    def start(self, job_id: str, spec_yaml: str, run_dir: Path) -> dict[str, Any]:
        from services import auth
        from services.config.job import JobSpecError, dump_job, parse_job

        run_dir = Path(run_dir).resolve()
        runs = run_dir.parent
        current = _read_json(runs / CURRENT)
        if current and not (Path(current.get("run_dir", "")) / FINISHED).exists():
            raise LaunchError(f"the deployment's services are running job {current.get('job_id')} "
                              "(a deployment runs one job at a time: set the gateway's max_running_jobs to 1 "
                              "so later jobs wait in its queue)")
        raw = yaml.safe_load(spec_yaml) or {}
        raw = _merge(raw, _substitute(json.loads(json.dumps(self.wiring)), job_id))
        try:
            spec = parse_job(raw)
        except JobSpecError as exc:
            raise LaunchError(f"the spec does not fit this deployment's wiring: {exc}") from None
        run_dir.mkdir(parents=True, exist_ok=True)
        if spec.queues.type == "redis":
            self._empty_redis(spec.queues)
        from services.config.views import derive_views, write_views

        write_views(derive_views(spec), run_dir / VIEWS)  # each service's whole config: {view} of its worker
        (run_dir / SPEC).write_text(dump_job(spec))
        if not os.environ.get(auth.ENV):  # no deployment-wide secret: one for this job only
            auth.JobCredential.generate().write(run_dir / auth.FILE_NAME)
        _write_json(run_dir / CONTROL, {"paused": False})
        _write_json(runs / CURRENT, {"job_id": job_id, "run_dir": str(run_dir), "at": time.time()})
        return {"kind": self.kind, "job_id": job_id, "run_dir": str(run_dir), "submitted_at": time.time()}

    @staticmethod
    def _empty_redis(cfg: Any) -> None:
        """The deployment's Redis database carries one job's streams at a time: a new job
        starts on an empty one, never on items of the job before."""
        import asyncio

        from services.queues.redis_backend import make_redis_client

        async def flush() -> None:
            client = make_redis_client(cfg)
            try:
                await asyncio.wait_for(client.flushdb(), timeout=cfg.op_timeout_s)
            finally:
                await client.aclose()

        try:
            asyncio.run(flush())
        except Exception as exc:  # noqa: BLE001 - any failure means the job cannot start cleanly
            raise LaunchError(f"cannot empty the deployment's Redis database before the job: {exc}") from None

    def _workers(self, run_dir: Path) -> list[dict[str, Any]]:
        return [w for p in sorted((run_dir / WORKERS).glob("*.json")) if (w := _read_json(p))]

    def status(self, handle: dict[str, Any]) -> JobStatus:
        run_dir = Path(handle["run_dir"])
        done = _read_json(run_dir / FINISHED)
        if done is not None:
            try:
                state = JobState(done.get("state"))
            except ValueError:
                state = JobState.FAILED
            return JobStatus(state, str(done.get("detail", "")))
        workers = self._workers(run_dir)
        running = [w for w in workers if w.get("state") == "running"]
        if not workers:
            waited = time.time() - float(handle.get("submitted_at", time.time()))
            if waited > self.pickup_timeout_s:
                detail = (f"no worker of the deployment took the job within {self.pickup_timeout_s:.0f}s: are its "
                          "service containers (meshrl worker ...) running and sharing RUNS_DIR with the gateway?")
                finish(run_dir, JobState.FAILED.value, detail)
                return JobStatus(JobState.FAILED, detail)
            return JobStatus(JobState.RUNNING, "waiting for the deployment's workers to take the job")
        names = ", ".join(sorted(w.get("name", "?") for w in running)) or "none"
        paused = (_read_json(run_dir / CONTROL) or {}).get("paused", False)
        return JobStatus(JobState.PAUSED if paused else JobState.RUNNING, f"services running: {names}")

    def _control(self, handle: dict[str, Any], paused: bool) -> None:
        run_dir = Path(handle["run_dir"])
        if (run_dir / FINISHED).exists():
            raise LaunchError("job is not running")
        _write_json(run_dir / CONTROL, {"paused": paused})

    def pause(self, handle: dict[str, Any]) -> None:
        self._control(handle, True)

    def resume(self, handle: dict[str, Any]) -> None:
        self._control(handle, False)

    def cancel(self, handle: dict[str, Any], timeout: float = 30.0) -> None:
        run_dir = Path(handle["run_dir"])
        finish(run_dir, JobState.CANCELLED.value, "cancelled")
        _write_json(run_dir / CONTROL, {"paused": False})
        deadline = time.monotonic() + timeout + self.stop_timeout_s
        while time.monotonic() < deadline:
            if not any(w.get("state") == "running" for w in self._workers(run_dir)):
                return
            time.sleep(0.25)


# ------------------------------------------------------------------------------------------------
# The worker: one per service container


class Worker:
    """Runs ``command`` for every job the deployment's gateway hands out (see the module doc)."""

    def __init__(self, role: str, runs_dir: str | Path, command: list[str], *, name: str | None = None,
                 ends_job: bool = False, grace_s: float = 30.0, poll_s: float = 0.5,
                 state_file: str | Path | None = None) -> None:
        if not command:
            raise ValueError("meshrl worker: give the service's command after --")
        self.role, self.runs_dir, self.command = role, Path(runs_dir), list(command)
        self.name = name or f"{role}-{socket.gethostname()}"
        self.ends_job, self.grace_s, self.poll_s = ends_job, grace_s, poll_s
        self.state_file = Path(state_file) if state_file else None
        self._stop = False
        self._done: set[str] = set()

    def stop(self, *_: Any) -> None:
        self._stop = True

    def _idle(self, idle: bool, job: str = "") -> None:
        if self.state_file is not None:
            self.state_file.write_text("idle\n" if idle else f"running {job}\n")

    def next_job(self) -> tuple[str, Path] | None:
        cur = _read_json(self.runs_dir / CURRENT)
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
        _write_json(run_dir / WORKERS / f"{self.name}.json", {"name": self.name, "role": self.role, **fields})

    def run_job(self, job_id: str, run_dir: Path) -> int | None:
        from services import auth
        from services.launch.procs import log_tail

        self._done.add(str(run_dir))
        self._idle(False, job_id)
        view = run_dir / VIEWS / f"{self.role}.yaml"
        argv = [a.replace("{view}", str(view)).replace("{spec}", str(run_dir / SPEC)).replace("{run_dir}", str(run_dir))
                .replace("{name}", self.name) for a in self.command]
        env = dict(os.environ, MESHRL_RUN_DIR=str(run_dir), MESHRL_JOB_ID=job_id, PYTHONUNBUFFERED="1")
        if (run_dir / auth.FILE_NAME).exists():
            env[auth.ENV] = str(run_dir / auth.FILE_NAME)
        log_path = run_dir / "logs" / f"{self.name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=run_dir, env=env, start_new_session=True)
        self._report(run_dir, state="running", pid=proc.pid, started=time.time())
        paused = stopping_since = None
        while proc.poll() is None:
            if self._stop or (run_dir / FINISHED).exists():
                if stopping_since is None:
                    stopping_since = time.monotonic()
                    self._signal(proc, signal.SIGTERM)
                    self._signal(proc, signal.SIGCONT)
                elif time.monotonic() - stopping_since > self.grace_s:
                    self._signal(proc, signal.SIGKILL)
            else:
                want = bool((_read_json(run_dir / CONTROL) or {}).get("paused", False))
                if want != bool(paused):
                    self._signal(proc, signal.SIGSTOP if want else signal.SIGCONT)
                    paused = want
            time.sleep(self.poll_s)
        rc = proc.returncode
        self._signal(proc, signal.SIGKILL)  # helpers the service left behind in its session
        self._report(run_dir, state="exited", exit_code=rc, ended=time.time())
        if self.ends_job and rc == 0:
            finish(run_dir, JobState.SUCCEEDED.value, f"{self.name} finished")
        elif rc != 0 and not (run_dir / FINISHED).exists():
            why = f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}"
            finish(run_dir, JobState.FAILED.value,
                   f"{self.name} ({self.role}) failed ({why}); last lines of its log:\n{log_tail(log_path)}")
        return rc

    @staticmethod
    def _signal(proc: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def add_worker_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--role", required=True, help="the service this container runs: trainer, rollout, reward, feeder...")
    p.add_argument("--runs-dir", default=os.environ.get("MESHRL_RUNS_DIR", "runs"),
                   help="the RUNS_DIR the deployment's gateway shares (default $MESHRL_RUNS_DIR)")
    p.add_argument("--name", default=None, help="this worker's name (default ROLE-HOSTNAME)")
    p.add_argument("--ends-job", action="store_true", help="the job ends when this service exits (the trainer)")
    p.add_argument("--grace", type=float, default=30.0, help="seconds from SIGTERM to SIGKILL when a job ends")
    p.add_argument("--state-file", default="/tmp/meshrl-worker.state",
                   help="'idle' or 'running JOB' for the container's health check")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="-- then the service's command; {view} is the role's view of the job (RUN_DIR/config/ROLE.yaml), "
                   "{spec} and {run_dir} name the job's files, {name} this worker")
