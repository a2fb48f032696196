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
    RUN_DIR/workers/<name>.json         {"role", "state", "restarts", "counters", ...} (each worker)
    RUN_DIR/logs/<name>.log             the service's output

The wiring (``--deployment-config``, e.g. ``deploy/config/deployment.yaml``) is the part
of a spec that belongs to the deployment, not to the job: where the services bind and meet
(queues, hosts, ports) and where checkpoints go; ``{job_id}`` in its strings is replaced.
Each worker supervises its service with the job's restart policy (``services.restart``),
the same :class:`~services.launch.supervision.Supervisor` ``meshrl run`` applies
(docs/supervision.md): a service that exits (any exit, except the trainer's ``0``) is
started again after the backoff, up to ``max_restarts`` times over the job, while the other
containers keep running; once it announced readiness its worker probes its ``/health`` and
kills one silent for ``heartbeat_timeout_s`` (then the restart rule). Every worker reports
its service's ledger counters in ``RUN_DIR/workers/<name>.json``; the launcher sums them
(:func:`job_progress`) and, with none moving for ``stall_warn_s``, reports the job stalled
(the status detail), past ``stall_timeout_s`` fails it.

A job ends when the trainer's worker sees the trainer exit 0 (succeeded), when a service
exhausts its restart budget or the job stalls past its deadline (failed, naming the service
and why), or when the gateway cancels it; every worker then stops its service (SIGTERM,
SIGKILL after a grace period). If no worker takes a job within ``pickup_timeout_s`` it fails
with a message saying so.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import threading
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


def _fit_queue_type(raw: dict[str, Any], wiring: dict[str, Any]) -> dict[str, Any]:
    """A spec resolved for another queue backend than the deployment's (the gateway stores
    every default, e.g. ``queues.type: embedded`` with its ``address``) keeps only the queue
    keys both backends share; the deployment's wiring gives the rest."""
    want = (wiring.get("queues") or {}).get("type") if isinstance(wiring.get("queues"), dict) else None
    have = raw.get("queues") if isinstance(raw.get("queues"), dict) else None
    if want and have and have.get("type", want) != want:
        from services.config.queues import QueueCommon

        raw["queues"] = {k: v for k, v in have.items() if k in QueueCommon.model_fields}
    return raw


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
        self._watch: dict[str, _JobWatch] = {}
        self._watch_lock = threading.Lock()  # status() runs in the gateway's poller and request threads

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
        wiring = _substitute(json.loads(json.dumps(self.wiring)), job_id)
        raw = _merge(_fit_queue_type(raw, wiring), wiring)
        try:
            spec = parse_job(raw)
        except JobSpecError as exc:
            raise LaunchError(f"the spec does not fit this deployment's wiring: {exc}") from None
        run_dir.mkdir(parents=True, exist_ok=True)
        if spec.queues.type == "redis":
            self._empty_redis(spec.queues)
        from services.config.views import derive_views, write_private, write_views

        write_views(derive_views(spec), run_dir / VIEWS)  # each service's whole config: {view} of its worker
        write_private(run_dir / SPEC, dump_job(spec))  # 0600, as the views: they may carry the queue's password
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

    def _progress(self, run_dir: Path, workers: list[dict[str, Any]], *, live: bool,
                  paused: bool = False) -> tuple[dict[str, Any], str]:
        key = str(run_dir)
        with self._watch_lock:
            try:
                watch = self._watch.get(key) or self._watch.setdefault(key, _JobWatch(run_dir))
            except Exception:  # noqa: BLE001 - no readable spec: no job-level progress, the job still runs
                return {}, ""
            if not live:
                self._watch.pop(key, None)
            return job_progress(watch, run_dir, workers, live=live, paused=paused)

    def status(self, handle: dict[str, Any]) -> JobStatus:
        run_dir = Path(handle["run_dir"])
        done = _read_json(run_dir / FINISHED)
        if done is not None:
            try:
                state = JobState(done.get("state"))
            except ValueError:
                state = JobState.FAILED
            progress, _ = self._progress(run_dir, self._workers(run_dir), live=False)
            return JobStatus(state, str(done.get("detail", "")), progress=progress)
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
        paused = bool((_read_json(run_dir / CONTROL) or {}).get("paused", False))
        progress, stalled = self._progress(run_dir, workers, live=True, paused=paused)
        watch = self._watch.get(str(run_dir))
        if stalled and watch is not None and watch.fatal:  # the workers see finished.json and stop
            finish(run_dir, JobState.FAILED.value, f"job stalled: {stalled}")
            return self.status(handle)
        detail = f"services running: {names}"
        restarting = sorted(str(w.get("name", "?")) for w in workers if w.get("state") == "restarting")
        if restarting:
            detail += f"; restarting: {', '.join(restarting)}"
        if stalled:
            detail = f"stalled: {stalled}; {detail}"
        return JobStatus(JobState.PAUSED if paused else JobState.RUNNING, detail, progress=progress)

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
# Job-level progress of a deployment job (no controller: the workers report, the launcher sums)

#: Counters a worker reads from its service's /metrics into its report (the job ledger's sources).
LEDGER_COUNTERS = (
    "meshrl_rollout_samples_total", "meshrl_rollout_regenerated_samples_total", "meshrl_rollout_tokens_total",
    "meshrl_reward_samples_total", "meshrl_feeder_prompts_total",
    "meshrl_trainer_samples_total", "meshrl_trainer_failed_score_samples_total",
    "meshrl_trainer_dropped_stale_samples_total", "meshrl_trainer_dropped_error_samples_total",
    "meshrl_trainer_steps_total",
)
STAGES_EVERY_S = 10.0  # how often the launcher counts the Redis ledger's stages (one server-side script)
_COUNT_STAGES = """
local t = {}
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do t[v] = (t[v] or 0) + 1 end
return cjson.encode(t)
"""


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
        from services.launch.procs import http_get
        from services.launch.report import scrape

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


class _JobWatch:
    """What the launcher keeps about one deployment job between status calls."""

    def __init__(self, run_dir: Path) -> None:
        from services.config.job import parse_job
        from services.launch.supervision import Supervisor

        spec = parse_job(yaml.safe_load((run_dir / SPEC).read_text()) or {})
        self.n = spec.rollout.n
        self.total_steps = spec.trainer.total_steps
        self.ckpt = Path(spec.trainer.default_local_dir)
        self.queues = spec.queues
        self.sup = Supervisor(spec.services.restart, [])
        self.running: frozenset[str] = frozenset()
        self.paused = False
        self.stages: dict[str, int] = {}
        self.stages_at = float("-inf")
        self.fatal = False  # stalled past services.restart.stall_timeout_s

    def ledger_stages(self) -> dict[str, int]:
        """Samples by latest stage in the Redis ledger (at most every :data:`STAGES_EVERY_S`)."""
        if self.queues.type != "redis" or time.monotonic() - self.stages_at < STAGES_EVERY_S:
            return self.stages
        self.stages_at = time.monotonic()
        import asyncio

        from services.queues.redis_backend import make_redis_client

        async def count() -> dict[str, int]:
            client = make_redis_client(self.queues)
            try:
                raw = await asyncio.wait_for(client.eval(_COUNT_STAGES, 1, f"{self.queues.namespace}:ledger:h"),
                                             timeout=min(self.queues.op_timeout_s, 5.0))
            finally:
                await client.aclose()
            got = json.loads(raw) if raw not in (None, b"", b"[]", b"{}") else {}
            return {str(k): int(v) for k, v in got.items()} if isinstance(got, dict) else {}

        try:
            self.stages = asyncio.run(count())
        except Exception:  # noqa: BLE001 - a metric: keep the last counts
            pass
        return self.stages


def job_progress(watch: _JobWatch, run_dir: Path, workers: list[dict[str, Any]], *, live: bool,
                 paused: bool) -> tuple[dict[str, Any], str]:
    """The deployment job's progress (the fields ``status.json`` has for a controller's job:
    ``ledger``, ``restarts``, ``stalled``, ``ledger_stages``, ``step``) and a stall reason ("" if none)."""
    from services.launch.ledger import Ledger

    ledger = Ledger(run_dir, watch.n)
    fed = 0.0
    step = None
    for w in workers:
        c = w.get("counters") if isinstance(w.get("counters"), dict) else {}
        role, name = str(w.get("role", "")), str(w.get("name", "?"))
        if role == "trainer":
            ledger.observe("trainer", c)
            if "meshrl_trainer_steps_total" in c:
                step = int(c["meshrl_trainer_steps_total"])
        elif role == "feeder":
            fed += float(c.get("meshrl_feeder_prompts_total", 0.0))
        elif role in ("rollout", "reward"):
            ledger.observe(f"{role}/{name}", c)
    ledger.prompts_fed = int(fed)
    if not live:
        ledger.read_checkpoint(watch.ckpt)  # exact at the end: the last scrape may predate the last step
    counts = ledger.counts()
    progress: dict[str, Any] = {
        "ledger": counts, "total_steps": watch.total_steps,
        "restarts": {str(w.get("name", "?")): max(0, int(w.get("runs") or 1) - 1) + int(w.get("restarts") or 0)
                     for w in workers},
    }
    if step is not None:
        progress["step"] = step
    if not live:
        watch.stages_at = float("-inf")  # the final counts: read now, not the last (up to 10 s old) reading
    stages = watch.ledger_stages()
    if stages:
        progress["ledger_stages"] = stages
    # Stalled: every service running and ready, nothing fed, generated, scored or trained for
    # stall_warn_s (the clock starts again when a service (re)starts or gets ready, and on resume).
    why = ""
    now = time.monotonic()
    running = frozenset(f"{w.get('name')}:{w.get('state')}:{bool(w.get('ready'))}" for w in workers
                        if w.get("state") in ("running", "restarting"))
    if running != watch.running or paused != watch.paused:
        watch.sup.touch(now)
        watch.running, watch.paused = running, paused
    watch.sup.progress({k: counts[k] for k in ("fed", "generated", "scored", "trained")}, now)
    all_ready = all(w.get("ready") for w in workers if w.get("state") == "running")
    if live and not paused and running and all_ready:
        restarting = sorted(str(w.get("name")) for w in workers if w.get("state") == "restarting")
        stall = watch.sup.stall(now, f"waiting for {', '.join(restarting)} to restart" if restarting
                                else "no sample generated, scored or trained by the deployment's services")
        why = stall.reason if stall is not None else ""
        watch.fatal = stall is not None and stall.fatal
    progress["stalled"] = bool(why)
    return progress, why


# ------------------------------------------------------------------------------------------------
# The worker: one per service container


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
        """Run the role's service for one job, supervised by the job's restart policy
        (``services.restart``, the same :class:`~services.launch.supervision.Supervisor` as
        ``meshrl run``): a crash is restarted after the backoff until the budget is spent,
        and a service whose ``/health`` stays silent is killed and restarted (see the module
        doc). Returns the service's last exit code."""
        from services import auth
        from services.launch.procs import http_get, log_tail
        from services.launch.supervision import Supervisor
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
        meter = ServiceMeter(self.role, _read_json(run_dir / WORKERS / f"{self.name}.json"))
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
                    finish(run_dir, JobState.SUCCEEDED.value, f"{self.name} finished")
                    break
                how = f"exited with code {rc}" + (f" ({kill_reason})" if kill_reason else "")
                decision = sup.exited(self.name, how, now)
                if decision.action == "fail":
                    self._say(log_path, decision.reason)
                    finish(run_dir, JobState.FAILED.value,
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
                want = bool((_read_json(run_dir / CONTROL) or {}).get("paused", False))
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
