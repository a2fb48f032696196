"""The files through which a fleet and the jobs attached to it meet (docs/fleet.md).

A fleet (``fleet_svc``) runs warm rollout replicas; a job's controller never starts or
signals them. The two meet only in the fleet's directory, ``FLEETS_DIR/<name>/``, which
belongs to the user running the fleet (0700):

    fleet.yaml                     the fleet's spec, resolved
    fleet.json                     {"name", "state", "pid", "replicas": [names], "started"}  (the fleet)
    stop                           exists: the fleet is asked to stop (``meshrl fleet stop``)
    jobs/<job_id>/<replica>.yaml   the job's rollout view for that replica (its queues, weight
                                   channel, sampling, the metrics port the job expects it on;
                                   0600: it may carry the job's queue password)
    jobs/<job_id>/job.credential   the job's credential (0600): what its broker and publisher ask
                                   for; the directory removed = the job leaves
    jobs/<job_id>/load.json        the job's load, written by its controller at each observation
                                   (prompts queued and leased, trainer's wait, stale drops,
                                   tokens/s, current version): the fleet's scaling signals
    members/<replica>/<job_id>.json  one replica's state for one job (the replica):
                                   {"state": attached|refused|detached, "detail", "metrics",
                                    "served_version", "pid", "time"}
    members/<replica>/_replica.json  the replica's own heartbeat: {"phase": serving|draining|off,
                                   "pid", "time", "jobs"}, every few seconds; "draining" as soon as
                                   it is asked to stop (whoever asked: the fleet, or an orchestrator)
    events.jsonl                   the fleet's scaling decisions, one JSON object per line
    bounds.json                    {"min", "max"}: the operator's replica bounds for a running fleet
                                   (``meshrl fleet scale``), within the spec's
    logs/<replica>.log             the replica's output

JSON files are replaced whole (write, then rename): a reader sees the old or the new
content, never half. The jobs' views are written the same way, so a replica never reads
half a view. ``FLEETS_DIR`` is ``$MESHRL_FLEETS_DIR``, else ``~/.meshrl/fleets``.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.handoff import read_json, write_json
from services.procs import proc_stat

FLEETS_ENV = "MESHRL_FLEETS_DIR"
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def fleets_root(root: str | os.PathLike | None = None) -> Path:
    """Where fleets keep their directories: ``root``, ``$MESHRL_FLEETS_DIR``, or ``~/.meshrl/fleets``."""
    if root:
        return Path(root)
    env = os.environ.get(FLEETS_ENV)
    return Path(env) if env else Path.home() / ".meshrl" / "fleets"


class ScalingFiles:
    """The files of a fleet's scaling (part of :class:`FleetDir`): the jobs' loads, the
    fleet's decisions, the operator's bounds, the replicas' own heartbeats."""

    path: Path  # (and FleetDir's job_dir, attached)

    def load_file(self, job_id: str) -> Path:
        return self.job_dir(job_id) / "load.json"

    @property
    def events_file(self) -> Path:
        return self.path / "events.jsonl"

    def write_load(self, job_id: str, load: dict[str, Any]) -> bool:
        """The job's controller: its load now (``jobs/<job_id>/load.json``); False (nothing
        written) once the job is no longer attached (its directory is never made again here)."""
        if not self.job_dir(job_id).is_dir():
            return False
        try:
            write_private_whole(self.load_file(job_id), json.dumps({**load, "time": time.time()}))
        except FileNotFoundError:  # detached meanwhile
            return False
        return True

    def loads(self) -> dict[str, dict[str, Any] | None]:
        """Every attached job's last load (None: not written yet, or unreadable)."""
        return {job: read_json(self.load_file(job)) for job in self.attached()}

    @property
    def bounds_file(self) -> Path:
        return self.path / "bounds.json"

    def request_bounds(self, lo: int, hi: int) -> None:
        """The operator: run between ``lo`` and ``hi`` replicas from now on."""
        write_private_whole(self.bounds_file, json.dumps({"min": int(lo), "max": int(hi), "time": time.time()}))

    def requested_bounds(self) -> tuple[int, int] | None:
        data = read_json(self.bounds_file)
        try:
            return (int(data["min"]), int(data["max"])) if data else None
        except (KeyError, TypeError, ValueError):
            return None

    def add_event(self, event: dict[str, Any]) -> None:
        """Append one scaling event (``events.jsonl``, 0600)."""
        fd = os.open(self.events_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(json.dumps({"time": time.time(), **event}) + "\n")

    def events(self, limit: int = 200) -> list[dict[str, Any]]:
        """The fleet's last ``limit`` scaling events, oldest first."""
        try:
            lines = self.events_file.read_text().splitlines()[-limit:]
        except OSError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def heartbeat(self, replica: str, phase: str, **extra: Any) -> None:
        """A replica: it is alive, in ``phase`` (``members/<replica>/_replica.json``)."""
        write_json(self.path / "members" / replica / "_replica.json",
                   {"phase": phase, "pid": os.getpid(), "time": time.time(), **extra})

    def heartbeats(self) -> dict[str, dict[str, Any]]:
        """Every replica's last heartbeat: ``{replica: {"phase", "pid", "time", ...}}``."""
        out = {}
        for f in sorted((self.path / "members").glob("*/_replica.json")):
            data = read_json(f)
            if data is not None:
                out[f.parent.name] = data
        return out


class FleetDir(ScalingFiles):
    """The directory of fleet ``name`` under ``root`` (see module doc)."""

    def __init__(self, name: str, root: str | os.PathLike | None = None) -> None:
        self.name = name
        self.path = fleets_root(root) / name

    # -- paths
    @property
    def spec_file(self) -> Path:
        return self.path / "fleet.yaml"

    @property
    def state_file(self) -> Path:
        return self.path / "fleet.json"

    @property
    def stop_file(self) -> Path:
        return self.path / "stop"

    @property
    def jobs_dir(self) -> Path:
        return self.path / "jobs"

    def job_dir(self, job_id: str) -> Path:
        if not JOB_ID.fullmatch(job_id):
            raise ValueError(f"job id {job_id!r} is not a fleet job id ({JOB_ID.pattern})")
        return self.jobs_dir / job_id

    def job_view(self, job_id: str, replica: str) -> Path:
        return self.job_dir(job_id) / f"{replica}.yaml"

    def job_credential(self, job_id: str) -> Path:
        return self.job_dir(job_id) / "job.credential"

    def member_file(self, replica: str, job_id: str) -> Path:
        return self.path / "members" / replica / f"{job_id}.json"

    def log_file(self, replica: str) -> Path:
        return self.path / "logs" / f"{replica}.log"

    # -- the fleet's side
    def create(self, spec_text: str) -> None:
        """Make the directory (0700) for a fleet starting now: the spec written, a stale
        stop request and the members' old reports cleared; attached jobs' views are kept
        (jobs that attached to the fleet before a restart are served again)."""
        for d in (self.path, self.jobs_dir, self.path / "members", self.path / "logs"):
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o700)
        self.stop_file.unlink(missing_ok=True)
        self.bounds_file.unlink(missing_ok=True)  # a new run starts from its spec's bounds
        for f in (self.path / "members").glob("*/*.json"):
            f.unlink(missing_ok=True)
        write_private_whole(self.spec_file, spec_text)

    def write_state(self, state: str, replicas: list[str], **extra: Any) -> None:
        me = proc_stat(os.getpid())
        write_json(self.state_file, {"name": self.name, "state": state, "pid": os.getpid(),
                                     "pid_start": me.starttime if me else None, "replicas": replicas,
                                     "time": time.time(), **extra})

    def state(self) -> dict[str, Any] | None:
        """The fleet's last state; None if it never ran here."""
        return read_json(self.state_file)

    def running(self) -> bool:
        """The fleet's process is alive (the same process: its pid with its start time, so a
        reused pid or a zombie is not taken for it) and says it is ready or starting."""
        st = self.state()
        if not st or st.get("state") not in ("starting", "ready"):
            return False
        try:
            proc = proc_stat(int(st["pid"]))
        except (KeyError, TypeError, ValueError):
            return False
        if proc is None or proc.zombie:
            return False
        return st.get("pid_start") is None or proc.starttime == st["pid_start"]

    def request_stop(self) -> None:
        self.stop_file.touch()

    def stop_requested(self) -> bool:
        return self.stop_file.exists()

    # -- the jobs' side
    def attach(self, job_id: str, views: dict[str, str], credential_text: str) -> Path:
        """Hand the fleet job ``job_id``: its view for each replica (``{replica: YAML}``) and
        its credential, each file 0600 and written whole, the credential first (a replica
        takes a job once its view is there)."""
        d = self.job_dir(job_id)
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
        write_private_whole(self.job_credential(job_id), credential_text)
        for replica, text in views.items():
            write_private_whole(self.job_view(job_id, replica), text)
        return d

    def detach(self, job_id: str) -> None:
        """Take job ``job_id`` off the fleet (its replicas stop serving it within a poll)."""
        d = self.job_dir(job_id)
        for f in d.glob("*"):
            f.unlink(missing_ok=True)
        try:
            d.rmdir()
        except OSError:
            pass

    def attached(self) -> list[str]:
        """The ids of the jobs attached now."""
        if not self.jobs_dir.is_dir():
            return []
        return sorted(p.name for p in self.jobs_dir.iterdir() if p.is_dir() and JOB_ID.fullmatch(p.name))

    # -- the replicas' reports
    def report(self, replica: str, job_id: str, state: str, **extra: Any) -> None:
        write_json(self.member_file(replica, job_id), {"state": state, "pid": os.getpid(), "time": time.time(),
                                                         **extra})

    def reports(self, job_id: str) -> dict[str, dict[str, Any]]:
        """Every replica's last report on job ``job_id``: ``{replica: report}``."""
        out = {}
        for f in sorted((self.path / "members").glob(f"*/{job_id}.json")):
            data = read_json(f)
            if data is not None:
                out[f.parent.name] = data
        return out


@dataclass
class JobLoad:
    """One job's reading, from its ``load.json`` (see :func:`job_load`)."""

    time: float
    prompts: float = 0.0  # prompts queue depth: queued plus leased
    leased: float = 0.0  # groups the replicas hold for the job
    trainer_wait_s: float = 0.0  # the trainer's total seconds waiting for samples
    dropped_stale: float = 0.0  # samples dropped as stale, in total
    tokens_per_s: float = 0.0
    version: int = 0  # the trainer's current version (a joining replica loads it before it leases)

    @property
    def backlog(self) -> float:
        """Prompt groups not generated yet. A replica leases up to ``max_groups_in_flight``
        groups at once, usually the whole admission window, so what waits for generation
        sits in the replicas as often as in the queue: the depth counts both. A job whose
        trainer is the bottleneck keeps it low (its groups wait as samples, not prompts)."""
        return self.prompts


def job_load(data: dict[str, Any] | None) -> JobLoad | None:
    """A job's ``load.json`` content as a :class:`JobLoad`; None when unreadable."""
    if not isinstance(data, dict):
        return None
    try:
        return JobLoad(**{k: (int(v) if k == "version" else float(v)) for k, v in data.items()
                          if k in JobLoad.__dataclass_fields__})
    except (TypeError, ValueError):
        return None



def write_private_whole(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` at once (a reader sees the old or the new file, never
    half), readable by this user only; a symlink planted at the temporary name is not followed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
