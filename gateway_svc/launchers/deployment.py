"""The gateway's ``deployment`` launcher: jobs run by a deployment's own service containers.

    launcher = DeploymentLauncher("deploy/config/deployment.yaml")      # the deployment's wiring
    handle = launcher.start(job_id, spec_yaml, run_dir)                 # RUN_DIR under the shared RUNS_DIR

A deployment (compose, Kubernetes) runs one long-lived ``meshrl worker`` container per
service (worker_svc/worker.py). The launcher never starts a process of a job itself:
``start`` writes the job's files on the storage the whole deployment shares and names it the
current job; pause, resume and cancel write ``control.json`` / ``finished.json``; status reads
what the workers report (the files: services/handoff.py).

The wiring (``--deployment-config``, e.g. ``deploy/config/deployment.yaml``) is the part
of a spec that belongs to the deployment, not to the job: where the services bind and meet
(queues, hosts, ports) and where checkpoints go; ``{job_id}`` in its strings is replaced.

A deployment job has no controller: the launcher sums the ledger counters its workers
report (:func:`job_progress`) and, with none moving for ``stall_warn_s``, reports the job
stalled (the status detail); past ``stall_timeout_s`` it fails the job. A job ends when the
trainer's worker sees the trainer exit 0 (succeeded), when a service exhausts its restart
budget or the job stalls past its deadline (failed, naming the service and why), or when the
gateway cancels it. If no worker takes a job within ``pickup_timeout_s`` it fails with a
message saying so.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from gateway_svc.launchers.base import JobState, JobStatus, LaunchError, Launcher
from services.handoff import CONTROL, CURRENT, FINISHED, SPEC, VIEWS, WORKERS, finish, read_json, write_json

WIRING_ENV = "MESHRL_DEPLOYMENT_CONFIG"


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
        current = read_json(runs / CURRENT)
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
        write_json(run_dir / CONTROL, {"paused": False})
        write_json(runs / CURRENT, {"job_id": job_id, "run_dir": str(run_dir), "at": time.time()})
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
        return [w for p in sorted((run_dir / WORKERS).glob("*.json")) if (w := read_json(p))]

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
        done = read_json(run_dir / FINISHED)
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
        paused = bool((read_json(run_dir / CONTROL) or {}).get("paused", False))
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
        write_json(run_dir / CONTROL, {"paused": paused})

    def pause(self, handle: dict[str, Any]) -> None:
        self._control(handle, True)

    def resume(self, handle: dict[str, Any]) -> None:
        self._control(handle, False)

    def cancel(self, handle: dict[str, Any], timeout: float = 30.0) -> None:
        run_dir = Path(handle["run_dir"])
        finish(run_dir, JobState.CANCELLED.value, "cancelled")
        write_json(run_dir / CONTROL, {"paused": False})
        deadline = time.monotonic() + timeout + self.stop_timeout_s
        while time.monotonic() < deadline:
            if not any(w.get("state") == "running" for w in self._workers(run_dir)):
                return
            time.sleep(0.25)


# ------------------------------------------------------------------------------------------------
# Job-level progress of a deployment job (no controller: the workers report, the launcher sums)

STAGES_EVERY_S = 10.0  # how often the launcher counts the Redis ledger's stages (one server-side script)
_COUNT_STAGES = """
local t = {}
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do t[v] = (t[v] or 0) + 1 end
return cjson.encode(t)
"""


class _JobWatch:
    """What the launcher keeps about one deployment job between status calls."""

    def __init__(self, run_dir: Path) -> None:
        from services.config.job import parse_job
        from services.supervision import Supervisor

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
    from services.ledger import Ledger

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
