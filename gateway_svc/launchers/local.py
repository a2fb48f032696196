"""The local launcher: a job is one subprocess on this machine.

    launcher = LocalLauncher()
    handle = launcher.start("arith-1a2b", spec_yaml, Path("runs/arith-1a2b"))
    launcher.status(handle).state        # JobState.RUNNING ...

``start`` writes the spec to ``DIR/spec.yaml`` and runs
``<python> -m controller_svc DIR/spec.yaml --run-dir DIR`` (the job driver, which starts
the job's services as its own children) in a new session, so the driver and everything it
starts share one process group whose id is the driver's pid. Output goes to ``DIR/job.log``.

Control is by signals to that whole group:

* ``pause``  -> ``SIGSTOP`` to the group: every service of the job stops where it is (no new
  prompts, no steps). Network deadlines keep running in the peers outside the job (a shared
  Redis, say), so a long pause may make them drop the job's connections; the job's own
  services are all stopped together and see no time pass.
* ``resume`` -> ``SIGCONT`` to the group.
* ``cancel`` -> ``SIGTERM`` (plus ``SIGCONT``, so a paused job can act on it), then
  ``SIGKILL`` to whatever of the group is left after ``timeout`` seconds.

Status comes from the process (alive, stopped, return code) plus ``DIR/status.json``, which
the driver rewrites as it goes: ``state``, ``step``, ``total_steps``, ``reward_mean``,
``staleness``, ``tokens_per_s``, ``detail`` and optionally ``queues`` (stream -> depth).

The handle records the pid, the process group and the process's start time (from
``/proc``), so a restarted gateway can still find, pause and cancel a job it started
before; only the exit code of such a job is then unknown, and its state comes from the
last ``status.json``.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from services.procs import tail_text
from services.config.views import write_private
from gateway_svc.launchers.base import JobState, JobStatus, LaunchError, Launcher

STATUS_FILE = "status.json"
SPEC_FILE = "spec.yaml"
LOG_FILE = "job.log"


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of ``pid`` from /proc, or None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return fields[0], int(fields[19])


def read_status_file(run_dir: Path) -> dict[str, Any]:
    """The driver's last ``status.json`` ({} if absent or half-written)."""
    try:
        data = json.loads((Path(run_dir) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def clean_progress(info: dict[str, Any]) -> dict[str, Any]:
    """The progress fields of a status.json, with wrong types and non-finite numbers left out
    (the driver may write NaN before the first step; JSON APIs cannot carry it)."""
    out: dict[str, Any] = {}
    for key in ("step", "total_steps"):
        v = info.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62:
            out[key] = v
    for key in PROGRESS_FLOATS:
        v = info.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[key] = float(v)
    if isinstance(info.get("stalled"), bool):
        out["stalled"] = info["stalled"]
    for key in ("queues", "restarts", "ledger", "ledger_stages"):
        counts = info.get(key)
        if isinstance(counts, dict):
            kept = {str(k)[:128]: v for k, v in list(counts.items())[:64]
                    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62}  # fmt: skip
            if kept:
                out[key] = kept
    weights = clean_weights(info.get("weights"))
    if weights:
        out["weights"] = weights
    return out


#: Timeline entries of the weight plane kept in a job's progress (the newest).
WEIGHT_EVENTS_KEPT = 20
_ROLES = ("all", "canary", "promoted")
_WEIGHT_EVENT_KINDS = ("promoted", "rejected", "candidate", "held_back", "paused", "resumed")


def _version(v: Any) -> int | None:
    """A policy version from status.json (an int, or a scraped float such as 3.0); None otherwise."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v):
        return None
    return int(v) if 0 <= v < 2**62 else None


def clean_weights(w: Any) -> dict[str, Any]:
    """status.json ``weights`` (the weight plane: per replica the version it serves and its
    role, the promoted / candidate versions, the canary gate's timeline), typed and bounded."""
    if not isinstance(w, dict) or w.get("mode") not in ("all", "canary"):
        return {}
    out: dict[str, Any] = {"mode": w["mode"]}
    for key in ("promoted", "candidate"):
        if _version(w.get(key)) is not None:
            out[key] = _version(w.get(key))
    if isinstance(w.get("paused"), str) and w["paused"]:
        out["paused"] = w["paused"][:500]
    replicas = w.get("replicas")
    if isinstance(replicas, dict):
        out["replicas"] = {
            str(name)[:128]: {"role": r["role"], **({"served_version": _version(r.get("served_version"))}
                                                     if _version(r.get("served_version")) is not None else {})}
            for name, r in list(replicas.items())[:64] if isinstance(r, dict) and r.get("role") in _ROLES
        }  # fmt: skip
    events = w.get("events")
    if isinstance(events, list):
        kept = []
        for e in events[-WEIGHT_EVENTS_KEPT:]:
            if not isinstance(e, dict) or e.get("kind") not in _WEIGHT_EVENT_KINDS or _version(e.get("version")) is None:
                continue
            ts = e.get("ts")
            m = e.get("measurements") if isinstance(e.get("measurements"), dict) else {}
            kept.append({
                "ts": float(ts) if isinstance(ts, (int, float)) and not isinstance(ts, bool) and math.isfinite(ts) else 0.0,
                "version": _version(e.get("version")), "kind": e["kind"],
                "reason": e.get("reason")[:1000] if isinstance(e.get("reason"), str) else "",
                "measurements": {str(k)[:64]: float(v) for k, v in list(m.items())[:16]
                                 if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)},
            })  # fmt: skip
        out["events"] = kept
    return out


#: Float fields of a job's progress (status.json), drawn by the dashboard.
PROGRESS_FLOATS = ("reward_mean", "staleness", "tokens_per_s", "loss", "kl", "entropy", "grad_norm",
                   "val_score", "logprob_diff")  # fmt: skip


def _tail(path: Path, lines: int = 5) -> str:
    return tail_text(path, lines)


class LocalLauncher(Launcher):
    """Runs each job as one process group on this machine (see the module docstring)."""

    kind = "local"

    def __init__(self, command: list[str] | None = None, env: dict[str, str] | None = None) -> None:
        """``command``: the driver command before ``<spec> --run-dir DIR`` (default
        ``[sys.executable, "-m", "controller_svc"]``); ``env``: extra environment."""
        self.command = list(command) if command else [sys.executable, "-m", "controller_svc"]
        self.env = dict(env or {})
        self._children: dict[int, subprocess.Popen] = {}
        self._cancelled: set[int] = set()
        self._lock = threading.Lock()

    # -- helpers ----------------------------------------------------------------------------------------------

    def _alive(self, handle: dict[str, Any]) -> tuple[bool, str]:
        """(is the job's driver still running, its /proc state letter)."""
        pid = int(handle["pid"])
        child = self._children.get(pid)
        if child is not None and child.poll() is not None:
            return False, ""
        stat = _proc_stat(pid)
        if stat is None or stat[1] != handle.get("start_ticks") or stat[0] in ("Z", "X"):
            return False, ""
        return True, stat[0]

    def _signal_group(self, handle: dict[str, Any], sig: int) -> bool:
        """Send ``sig`` to the job's process group; False if the group is gone."""
        pgid = int(handle["pgid"])
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return False
        except PermissionError as exc:
            raise LaunchError(f"cannot signal job process group {pgid}: {exc}") from None
        return True

    # -- Launcher API -----------------------------------------------------------------------------------------

    def start(self, job_id: str, spec_yaml: str, run_dir: Path) -> dict[str, Any]:
        run_dir = Path(run_dir).resolve()
        run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(run_dir, 0o700)  # the job's credential, spec and checkpoints: its user only
        spec_path = run_dir / SPEC_FILE
        write_private(spec_path, spec_yaml)  # 0600: it may carry the queue's password
        (run_dir / STATUS_FILE).unlink(missing_ok=True)
        argv = [*self.command, str(spec_path), "--run-dir", str(run_dir)]
        env = {**os.environ, **self.env, "MESHRL_JOB_ID": job_id}
        try:
            log_fd = os.open(run_dir / LOG_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            with os.fdopen(log_fd, "ab") as log:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    cwd=run_dir, env=env, start_new_session=True,
                    umask=0o077,  # everything the job writes (checkpoints, broker.aof, logs) 0600/0700
                )  # fmt: skip
        except OSError as exc:
            raise LaunchError(f"cannot start {argv[0]!r}: {exc}") from None
        with self._lock:
            self._children[proc.pid] = proc
        stat = _proc_stat(proc.pid)
        return {
            "kind": self.kind,
            "pid": proc.pid,
            "pgid": proc.pid,
            "start_ticks": stat[1] if stat else None,
            "run_dir": str(run_dir),
            "argv": argv,
        }

    def status(self, handle: dict[str, Any]) -> JobStatus:
        run_dir = Path(handle["run_dir"])
        info = read_status_file(run_dir)
        progress = clean_progress(info)
        detail = str(info.get("detail", ""))[:4000]
        metrics_url = info.get("metrics_url") if isinstance(info.get("metrics_url"), str) else None
        alive, letter = self._alive(handle)
        if alive:
            state = JobState.PAUSED if letter in ("T", "t") else JobState.RUNNING
            return JobStatus(state, detail, None, metrics_url, progress)
        pid = int(handle["pid"])
        child = self._children.get(pid)
        rc = None
        if child is not None:
            # poll() answers None while another thread holds the child's wait lock (the
            # gateway polls from several threads): the driver has exited, so wait briefly.
            rc = child.poll()
            if rc is None:
                try:
                    rc = child.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    rc = None
        if pid in self._cancelled:
            return JobStatus(JobState.CANCELLED, detail or "cancelled", rc, None, progress)
        if rc == 0:
            return JobStatus(JobState.SUCCEEDED, detail, 0, None, progress)
        if rc is not None:
            why = f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}"
            tail = _tail(run_dir / LOG_FILE)
            text = f"job driver failed ({why})" + (f": {detail}" if detail else "") + (f"\n{tail}" if tail else "")
            return JobStatus(JobState.FAILED, text, rc, None, progress)
        # Not our child (started by an earlier gateway): trust the driver's last word.
        reported = str(info.get("state", ""))
        if reported in (JobState.SUCCEEDED.value, JobState.FAILED.value, JobState.CANCELLED.value):
            return JobStatus(JobState(reported), detail, None, None, progress)
        return JobStatus(
            JobState.FAILED, detail or "job driver exited without a final status (exit code unknown)", None, None, progress
        )

    def pause(self, handle: dict[str, Any]) -> None:
        if not self._alive(handle)[0] or not self._signal_group(handle, signal.SIGSTOP):
            raise LaunchError("job is not running")

    def resume(self, handle: dict[str, Any]) -> None:
        if not self._alive(handle)[0] or not self._signal_group(handle, signal.SIGCONT):
            raise LaunchError("job is not running")

    def cancel(self, handle: dict[str, Any], timeout: float = 30.0) -> None:
        pid, pgid = int(handle["pid"]), int(handle["pgid"])
        with self._lock:
            self._cancelled.add(pid)
        if self._alive(handle)[0]:
            for sig in (signal.SIGTERM, signal.SIGCONT):
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    break
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._group_exists(pid, pgid):
                return
            time.sleep(0.05)
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child = self._children.get(pid)
        if child is not None:
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def _group_exists(self, pid: int, pgid: int) -> bool:
        child = self._children.get(pid)
        if child is not None:
            child.poll()  # reap the leader so the group can empty
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        # Only zombies left (not our children)? Treat as gone.
        return any(
            (st := _proc_stat(int(p.name))) is not None and st[0] not in ("Z", "X")
            for p in Path("/proc").iterdir()
            if p.name.isdigit() and _pgid_of(int(p.name)) == pgid
        )


def _pgid_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None
