"""The gateway's job logic, shared by the REST and gRPC front ends.

    manager = JobManager(open_store(url), LocalLauncher(), Path("runs"))
    row = manager.submit(spec_yaml_or_dict, ["rollout.n=4"])
    manager.pause(row.id); manager.resume(row.id); manager.cancel(row.id)
    manager.metrics(row.id) -> {"progress": {...}, "points": [...]}

Job states follow :class:`gateway_svc.launchers.base.JobState`. The manager refreshes a job's state
from its launcher whenever it is read, and a poller thread (``start()``) does the same for
every unfinished job, recording a metric point each time the job's progress changes — the
series the dashboard draws.

With ``max_running_jobs`` set, a submitted job beyond the limit waits ``pending`` (no
launcher handle yet) in a FIFO queue: it is launched, oldest first, when a running or paused
job finishes or is cancelled. Every step of a job's life is an event in the store
(``submitted``, ``queued``, ``started``, ``paused``, ``resumed``, ``cancelled``,
``restarted`` (a service of the job was restarted by its supervisor), ``finished``).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from gateway_svc import logs as joblogs
from gateway_svc import redact
from gateway_svc.policy import OperatorPolicy, inline_tool_config, policy_problems
from gateway_svc.spec_validation import SpecRejected, validate_spec
from gateway_svc.store import JobRow, JobStore
from gateway_svc.launchers.base import JobState, LaunchError, Launcher

log = logging.getLogger(__name__)
#: A job name, all of it (``re.fullmatch``: ``$`` would let a trailing newline through).
JOB_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_FINISHED = {s.value for s in JobState if s.finished}
_BUSY = (JobState.RUNNING.value, JobState.PAUSED.value)  # jobs holding a slot of max_running_jobs


class JobNotFound(LookupError):
    """No job has that id."""


class JobConflict(RuntimeError):
    """The job is not in a state that allows the request (e.g. pausing a finished job)."""


def job_to_dict(row: JobRow, *, with_spec: bool = False) -> dict[str, Any]:
    """The public view of a job (REST body and gRPC message carry the same fields)."""
    out: dict[str, Any] = {
        "id": row.id,
        "name": row.name,
        "state": row.state,
        "detail": row.detail,
        "exit_code": row.exit_code,
        "launcher": row.launcher,
        "overrides": row.overrides,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
        "progress": row.progress,
    }
    if with_spec:
        out["spec"] = row.spec_yaml
    return out


class JobManager:
    """Submit, list, control and observe jobs; state lives in the :class:`JobStore`."""

    def __init__(
        self,
        store: JobStore,
        launcher: Launcher,
        runs_dir: Path,
        *,
        poll_interval: float = 2.0,
        cancel_timeout: float = 30.0,
        max_running_jobs: int | None = None,
        policy: OperatorPolicy | None = None,
        excluded_inputs: Sequence[Path] = (),
    ) -> None:
        """``policy``: what submitted jobs may do beyond the defaults (the operator's flags;
        None = nothing more, inputs from anywhere: for embedding, not for a served gateway);
        ``excluded_inputs``: no input may come from these (the gateway's own files)."""
        if max_running_jobs is not None and max_running_jobs < 1:
            raise ValueError("max_running_jobs: at least 1 (or None for no limit)")
        self.max_running_jobs = max_running_jobs
        self.store = store
        self.launcher = launcher
        self.runs_dir = Path(runs_dir)
        self.policy = policy if policy is not None else OperatorPolicy(input_roots=(Path("/"),))
        self.excluded_inputs = [self.runs_dir, *excluded_inputs]
        self.poll_interval = poll_interval
        self.cancel_timeout = cancel_timeout
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------------------------

    def start(self) -> "JobManager":
        """Start the poller thread that keeps unfinished jobs' states and metric series fresh."""
        if self._poller is None:
            self._poller = threading.Thread(target=self._poll_loop, name="job-poller", daemon=True)
            self._poller.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout=10)

    def _poll_loop(self) -> None:
        while not self._stop.wait(self.poll_interval):
            try:
                self._admit()
                for state in (JobState.PENDING, JobState.RUNNING, JobState.PAUSED):
                    for row in self.store.list(state=state.value, limit=1000):
                        self._refresh(row)
            except Exception:  # keep polling through a database hiccup; it is logged
                log.exception("job poller: refresh failed")

    # -- queries ----------------------------------------------------------------------------------------------

    def get(self, job_id: str) -> JobRow:
        row = self.store.get(job_id)
        if row is None:
            raise JobNotFound(f"no job with id {job_id!r}")
        return self._refresh(row)

    def list(self, *, state: str | None = None, limit: int = 100, offset: int = 0) -> list[JobRow]:
        return [self._refresh(r) for r in self.store.list(state=state, limit=limit, offset=offset)]

    def metrics(self, job_id: str, *, since: float = 0.0, limit: int = 2000) -> dict[str, Any]:
        """The job's latest progress and its series of metric points after ``since``."""
        row = self.get(job_id)
        points = [{"ts": ts, **data} for ts, data in self.store.points(job_id, since=since, limit=limit)]
        return {"id": row.id, "name": row.name, "state": row.state, "progress": row.progress, "points": points}

    def events(self, job_id: str, *, since: float = 0.0, limit: int = 1000) -> dict[str, Any]:
        """The job's lifecycle events after ``since``, oldest first."""
        row = self.get(job_id)
        return {"id": row.id, "state": row.state, "events": self.store.events(job_id, since=since, limit=limit)}

    def run_dir(self, row: JobRow) -> Path:
        return Path(row.handle.get("run_dir") or (self.runs_dir / row.id))

    def log_services(self, job_id: str) -> list[str]:
        return joblogs.log_services(self.run_dir(self.get(job_id)))

    def logs(self, job_id: str, service: str = "job", *, tail: int = 200, follow: bool = False,
             max_seconds: float = 30.0) -> Iterator[bytes]:  # fmt: skip
        """The last ``tail`` lines of one service's log, then (``follow``) what it appends until
        the job finishes or ``max_seconds`` pass. Raises :class:`JobNotFound` and
        :class:`~gateway_svc.logs.UnknownLog` before yielding anything."""
        row = self.get(job_id)
        path = joblogs.log_path(self.run_dir(row), service)
        try:
            head, offset = joblogs.tail_bytes(path, tail)
        except OSError as exc:  # ELOOP: a symlink where a log was
            raise joblogs.UnknownLog(f"service: the log of {service!r} cannot be read ({exc.strerror})") from None

        def finished() -> bool:
            try:
                return self.get(job_id).state in _FINISHED
            except JobNotFound:
                return True

        def gen() -> Iterator[bytes]:  # every chunk with its secrets hidden (gateway_svc/redact.py)
            if head:
                yield _redact_bytes(head)
            if follow:
                for chunk in joblogs.follow(path, offset, finished, max_seconds):
                    yield _redact_bytes(chunk) if chunk else chunk

        return gen()

    # -- commands ---------------------------------------------------------------------------------------------

    def submit(self, spec: str | dict[str, Any], overrides: Sequence[str] = ()) -> JobRow:
        """Validate (raises :class:`~gateway_svc.spec_validation.SpecRejected`), store, launch."""
        valid = validate_spec(spec, overrides)
        if not JOB_NAME.fullmatch(valid.name):
            raise SpecRejected(f"name: {valid.name!r} is not a job name (lowercase letters, digits and '-', "
                               "at most 63 characters)")
        job_id = f"{valid.name}-{secrets.token_hex(4)}"
        # a tool config file's tools go into the spec (checked now, never read again by the job)
        raw = yaml.safe_load(valid.resolved_yaml)
        tool_file = (raw.get("rollout") or {}).get("multi_turn", {}).get("tool_config_path")
        raw, problems = inline_tool_config(raw, self.policy, self.excluded_inputs)
        if tool_file and not problems and raw["rollout"]["multi_turn"]["tool_config_path"] is None:
            valid = validate_spec(raw)  # what is stored and launched carries the file's tools
        # what the operator allows (capabilities, input roots) and outputs inside the run dir
        problems += policy_problems(raw, self.policy, self.runs_dir / job_id, excluded=self.excluded_inputs)
        if problems:
            raise SpecRejected("invalid job spec:\n" + "\n".join(f"  {p}" for p in problems))
        # Secrets (queues.password, a URL's password) are stored and shown as "***"; the real
        # values wait in the job's run dir (0600) for its launch (gateway_svc/redact.py).
        shown, hidden = redact.redact_spec(yaml.safe_load(valid.resolved_yaml))
        if hidden:
            redact.write_secrets(self.runs_dir / job_id / redact.SECRETS_FILE, hidden)
        shown_overrides = redact.redact_overrides(overrides)
        row = JobRow(
            id=job_id, name=valid.name, state=JobState.PENDING.value,
            spec_yaml=yaml.safe_dump(shown, sort_keys=False) if hidden else valid.resolved_yaml,
            overrides=shown_overrides, launcher=self.launcher.kind,
        )  # fmt: skip
        self.store.insert(row)
        self.store.add_event(job_id, "submitted", f"overrides: {' '.join(shown_overrides)}" if overrides else "")
        with self._lock:  # the poller admits under the same lock: "queued" is never written after "started"
            self._admit()
            now = self.store.get(job_id)
            if now is not None and now.state == JobState.PENDING.value and not now.handle:
                busy = self.store.count(_BUSY)
                detail = f"queued: {busy} job(s) running, max_running_jobs={self.max_running_jobs}"
                self.store.update(job_id, detail=detail)
                self.store.add_event(job_id, "queued", detail)
        return self.get(job_id)

    def _admit(self) -> None:
        """Launch queued jobs, oldest first, while fewer than ``max_running_jobs`` hold a slot."""
        with self._lock:
            queued = [r for r in self.store.oldest(JobState.PENDING.value, limit=1000) if not r.handle]
            if not queued:
                return
            busy = self.store.count(_BUSY) + self.store.count([JobState.PENDING.value]) - len(queued)
            for row in queued:
                if self.max_running_jobs is not None and busy >= self.max_running_jobs:
                    break
                self._launch(row)
                busy += 1

    def _launch(self, row: JobRow) -> None:
        secret_file = self.runs_dir / row.id / redact.SECRETS_FILE
        spec_yaml = row.spec_yaml
        if secret_file.exists():  # the spec the job runs with has the real values back
            spec_yaml = yaml.safe_dump(redact.restore(yaml.safe_load(spec_yaml), redact.read_secrets(secret_file)),
                                       sort_keys=False)
        try:
            handle = self.launcher.start(row.id, spec_yaml, self.runs_dir / row.id)
        except LaunchError as exc:
            self.store.update(row.id, state=JobState.FAILED.value, detail=f"launch failed: {exc}")
            self.store.add_event(row.id, "finished", f"failed: launch failed: {exc}")
        else:
            secret_file.unlink(missing_ok=True)  # the launcher's copy in the run dir (0600) is the one left
            self.store.update(row.id, state=JobState.RUNNING.value, handle=handle, detail="")
            self.store.add_event(row.id, "started", f"launcher {self.launcher.kind}")

    def pause(self, job_id: str) -> JobRow:
        return self._switch(job_id, JobState.RUNNING, JobState.PAUSED, self.launcher.pause, "paused")

    def resume(self, job_id: str) -> JobRow:
        return self._switch(job_id, JobState.PAUSED, JobState.RUNNING, self.launcher.resume, "resumed")

    def _switch(self, job_id: str, before: JobState, after: JobState, action, event: str) -> JobRow:
        """Move a job from ``before`` to ``after`` with the launcher's ``action`` (pause or
        resume); JobConflict from any other state."""
        with self._lock:
            row = self.get(job_id)
            if row.state != before.value:
                raise JobConflict(f"job {job_id} is {row.state}; only a {before.value} job can be {event}")
            self._control(row, action)
            self.store.update(job_id, state=after.value)
            self.store.add_event(job_id, event, "by request")
        return self._wait_state(job_id, after)

    def cancel(self, job_id: str) -> JobRow:
        """Mark the job cancelled at once; the launcher stops it in the background
        (terminate, then kill after ``cancel_timeout``)."""
        with self._lock:
            row = self.get(job_id)
            if row.state in _FINISHED:
                raise JobConflict(f"job {job_id} is already {row.state}")
            self.store.update(job_id, state=JobState.CANCELLED.value, detail="cancelled by request")
            self.store.add_event(job_id, "cancelled", "by request" if row.handle else "by request, before it started")
            self.store.add_event(job_id, "finished", "cancelled")
        # its secrets go at once: the file waiting for a launch, and (once stopped) the run dir's copies
        (self.runs_dir / job_id / redact.SECRETS_FILE).unlink(missing_ok=True)
        if row.handle:
            threading.Thread(
                target=self._cancel_quietly, args=(row.handle,), name=f"cancel-{job_id}", daemon=True
            ).start()
        self._admit()  # its slot is free: the next queued job may start
        return self.store.get(job_id)  # type: ignore[return-value]

    # -- internals --------------------------------------------------------------------------------------------

    def _cancel_quietly(self, handle: dict[str, Any]) -> None:
        try:
            self.launcher.cancel(handle, timeout=self.cancel_timeout)
        except Exception:
            log.exception("cancel failed")
            return
        run_dir = handle.get("run_dir")
        if run_dir:
            scrub_run_dir(Path(run_dir))

    def _control(self, row: JobRow, action: Any) -> None:
        try:
            action(row.handle)
        except LaunchError as exc:
            raise JobConflict(f"job {row.id}: {exc}") from None

    def _wait_state(self, job_id: str, want: JobState, timeout: float = 2.0) -> JobRow:
        """Signals land asynchronously; give the launcher a moment to see the new state."""
        row = self.get(job_id)
        waited = threading.Event()  # never set: a sleep that reads well
        for _ in range(int(timeout / 0.05)):
            if row.state == want.value or row.state in _FINISHED:
                break
            waited.wait(0.05)
            row = self.get(job_id)
        return row

    def _refresh(self, row: JobRow) -> JobRow:
        """Ask the launcher about an unfinished job; store what changed and a metric point."""
        if row.state in _FINISHED or not row.handle:
            return row
        try:
            status = self.launcher.status(row.handle)
        except Exception as exc:  # a launcher that cannot answer leaves the job as it was
            log.warning("status of %s failed: %s", row.id, exc)
            return row
        with self._lock:
            current = self.store.get(row.id)
            if current is None or current.state in _FINISHED:  # cancelled meanwhile
                return current or row
            changes: dict[str, Any] = {}
            state = status.state.value
            if state != current.state:
                changes["state"] = state
            if status.detail != current.detail:
                changes["detail"] = status.detail
            if status.exit_code != current.exit_code:
                changes["exit_code"] = status.exit_code
            # Two readers (the poller, an API call) may read the status in either order before
            # taking the lock: a reading older than the stored one (a lower step) is dropped, so
            # the series never runs backwards.
            older = _step(status.progress) < _step(current.progress)
            if status.progress and status.progress != current.progress and not older:
                changes["progress"] = status.progress
                # a point is the curves' data; the weight plane's state is the progress's alone
                self.store.add_point(row.id, {k: v for k, v in status.progress.items() if k != "weights"})
                for service, n in _restarts(status.progress, current.progress):
                    self.store.add_event(row.id, "restarted", f"{service} (restart {n})")
                for kind, detail in _weight_events(status.progress, current.progress):
                    self.store.add_event(row.id, kind, detail)
            if changes:
                self.store.update(row.id, **changes)
                if changes.get("state") in _FINISHED:
                    self.store.add_event(row.id, "finished", f"{state}: {status.detail}"[:2000])
                current = self.store.get(row.id) or current
            return current


def _redact_bytes(chunk: bytes) -> bytes:
    text = chunk.decode("utf-8", "surrogateescape")
    shown = redact.redact_text(text)
    return chunk if shown == text else shown.encode("utf-8", "surrogateescape")


def scrub_run_dir(run_dir: Path) -> None:
    """A stopped job's run dir without its secrets: secrets.json removed, the spec and the
    services' views it left rewritten with every secret as ``***``."""
    (run_dir / redact.SECRETS_FILE).unlink(missing_ok=True)
    for path in [run_dir / "spec.yaml", *sorted((run_dir / "views").glob("*.yaml"))]:
        try:
            if path.is_symlink() or not path.is_file():
                continue
            data = yaml.safe_load(path.read_text())
            shown, found = redact.redact_spec(data)
            if found:
                fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "w") as fh:
                    yaml.safe_dump(shown, fh, sort_keys=False)
        except (OSError, yaml.YAMLError) as exc:
            log.warning("could not scrub %s: %s", path, exc)


def _step(progress: dict[str, Any]) -> int:
    step = progress.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else -1


def _restarts(new: dict[str, Any], old: dict[str, Any]) -> list[tuple[str, int]]:
    """Services whose restart count (progress ``restarts``: {service: count}) went up."""
    now, before = new.get("restarts"), old.get("restarts")
    if not isinstance(now, dict):
        return []
    before = before if isinstance(before, dict) else {}
    out = []
    for service, n in now.items():
        prev = before.get(service, 0)
        if isinstance(n, int) and not isinstance(n, bool) and isinstance(prev, int) and n > prev:
            out.append((str(service)[:128], n))
    return out


#: The canary gate's decisions that become job events (kind in progress ``weights.events`` -> event kind).
WEIGHT_EVENT_KINDS = {"promoted": "version_promoted", "rejected": "version_rejected", "paused": "rollout_paused",
                      "resumed": "rollout_resumed"}


def _weight_events(new: dict[str, Any], old: dict[str, Any]) -> list[tuple[str, str]]:
    """The canary gate's decisions (progress ``weights.events``) newer than any ``old`` had,
    as job events: ``(kind, "v<N>: reason; measurements")``."""
    def events(p: dict[str, Any]) -> list[dict[str, Any]]:
        w = p.get("weights")
        return w.get("events", []) if isinstance(w, dict) else []

    seen = max((e["ts"] for e in events(old)), default=float("-inf"))
    out = []
    for e in events(new):
        if e["ts"] <= seen or e["kind"] not in WEIGHT_EVENT_KINDS:
            continue
        m = ", ".join(f"{k}={v:.4g}" for k, v in e["measurements"].items())
        detail = f"v{e['version']}" + (f": {e['reason']}" if e["reason"] else "") + (f" ({m})" if m else "")
        out.append((WEIGHT_EVENT_KINDS[e["kind"]], detail[:2000]))
    return out
