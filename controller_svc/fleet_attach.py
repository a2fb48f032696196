"""A job's rollout replicas when they belong to a fleet (``services.rollout.fleet: NAME``).

The job does not start replicas: it hands the fleet its view of each one, and its
credential, through the fleet's directory (:mod:`services.fleets`), and each of the fleet's
replicas serves the job's adapter from the job's queues, following the job's weight channel,
with its metrics on the port the job's view names. :class:`AttachedReplica` stands for one
of them in the job's mesh with the face of a child service (start, ready, returncode, url,
stop), so the controller's supervision, scraping, ledger and feeder work unchanged:

- ``start`` writes the job's views (idempotent), ``wait_ready`` waits until the replica
  reports the job attached (a refusal is the replica's one-line reason, at once);
- ``returncode`` is None while the replica that reported is alive and still attached; once
  it died (the fleet restarts it) or dropped the job, 1: the job's supervisor then "restarts"
  it, which waits for the fleet's replica to come back and take the job again;
- ``signal`` never reaches the fleet's process: a job may not kill a replica others use;
  SIGKILL (the job found it stuck) only marks it exited here;
- ``stop`` of the job's last attached replica takes the job off the fleet.

A fleet that scales (docs/fleet.md, "Scaling") runs some of its replicas only part of the
time. The job hands over a view for every replica the fleet may run; one the fleet does not
serve with now (its phase in ``fleet.json`` is ``off``, ``starting`` or ``draining``) is
*parked* in the job: not ready, not exited, neither scraped nor expected to beat.
:meth:`AttachedReplica.follow` (the controller calls it every round, through
``ServiceMesh.follow_fleet``) parks a replica the fleet drains and takes back one that joined
and attached the job. The job also tells the fleet its load (:func:`write_load`), which is
what the fleet scales on.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal as _signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.fleets import FleetDir
from services.procs import ServiceFailed
from services.readiness import Ready

POLL_S = 0.2


def fleet_for(name: str) -> FleetDir:
    """The running fleet ``name`` (ValueError naming the key when it is not running here)."""
    fdir = FleetDir(name)
    if not fdir.running():
        st = fdir.state()
        how = "has never run here" if st is None else f"is {st.get('state', 'not running')}"
        raise ValueError(f"services.rollout.fleet: fleet {name!r} {how} ({fdir.path}); start it with "
                         f"`meshrl fleet start FLEET.yaml`")
    return fdir


class FleetAttachment:
    """One job on one fleet: the views and credential handed over, and taken back."""

    def __init__(self, fdir: FleetDir, job_id: str, views: dict[str, Path], credential_file: Path) -> None:
        self.fdir, self.job_id = fdir, job_id
        self.views = views
        self.credential_file = credential_file
        self.attached = False

    def attach(self) -> None:
        self.fdir.attach(self.job_id, {name: p.read_text() for name, p in self.views.items()},
                         Path(self.credential_file).read_text())
        self.attached = True

    def detach(self) -> None:
        if self.attached:
            self.fdir.detach(self.job_id)
            self.attached = False

    def replica(self, name: str, log_path: Path) -> "AttachedReplica":
        return AttachedReplica(name, self, log_path)


async def feed_early(mesh: Any, spec: Any, tracking: asyncio.Task, stopped: Callable[[], bool],
                     log: Callable[[str], None]) -> None:
    """A job on a fleet's warm replicas (async mode) lets its feeder go as soon as the
    replicas took the job and the step-0 validation round is queued (``tracking`` done):
    generation starts while the trainer still loads, its samples of version 0, the
    trainer's first. Otherwise (or past the replicas' start deadline) the controller lets the
    feeder go once every service is ready, as for any job."""
    if mesh.attachment is None or spec.async_.mode != "async":
        return
    await asyncio.shield(tracking)
    deadline = time.monotonic() + spec.rollout.engine_startup_timeout_s
    while not stopped() and time.monotonic() < deadline and mesh.hold_file.exists():
        rollout = [p for p in mesh.procs if p.name.startswith("rollout") and not p.parked]
        if any(p.name == "feeder" for p in mesh.procs) and rollout and all(p.ready for p in rollout):
            mesh.hold_file.unlink(missing_ok=True)
            log("meshrl run: the fleet's replicas took the job; feeding before the trainer is ready")
            return
        await asyncio.sleep(0.1)


def write_load(mesh: Any, scrapes: dict[str, dict[str, float]], depths: dict[str, int],
               trainer_wait_s: float | None, dropped_stale: float) -> None:
    """Tell the fleet this job's load (``jobs/<job>/load.json``: what it scales on); nothing
    once the job left the fleet."""
    att = mesh.attachment
    if att is None or not att.attached:
        return
    rollout = [s for n, s in scrapes.items() if n.startswith("rollout")]
    trainer = scrapes.get("trainer", {})
    att.fdir.write_load(att.job_id, {
        "prompts": depths.get("prompts", 0),
        "leased": sum(s.get("meshrl_rollout_groups_in_flight", 0.0) for s in rollout),
        "tokens_per_s": sum(s.get("meshrl_rollout_tokens_per_second", 0.0) for s in rollout),
        "trainer_wait_s": trainer_wait_s or 0.0,
        "dropped_stale": dropped_stale,
        "version": int(trainer.get("meshrl_trainer_policy_version", 0) or 0),
    })


def trainer_wait_s(body: bytes) -> float | None:
    """The trainer's ``meshrl_trainer_phase_seconds_total{phase="wait"}`` in a ``/metrics`` body."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        for fam in text_string_to_metric_families(body.decode("utf-8", "replace")):
            for s in fam.samples:
                if s.name == "meshrl_trainer_phase_seconds_total" and s.labels.get("phase") == "wait":
                    return float(s.value)
    except ValueError:
        return None
    return None


def job_id_of(run_dir: Path) -> str:
    """The job's id on a fleet: its run directory's name, in the characters a fleet takes."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", Path(run_dir).resolve().name).lstrip("._-")[:128] or "job"


class AttachedReplica:
    """One fleet replica in a job's mesh (see module doc)."""

    def __init__(self, name: str, attachment: FleetAttachment, log_path: Path) -> None:
        self.name = name
        self.att = attachment
        self.log_path = log_path
        self.proc = None  # not this job's process
        self.kill_reason = ""
        self.ready: Ready | None = None
        self.parked = False  # the fleet runs it not now (see module doc)
        self._since = 0.0
        self._killed: int | None = None
        self.node = None

    def _phase(self) -> str:
        """The replica's phase in the fleet: off | starting | serving | draining ("serving" for
        a fleet that does not say: it never scales). The replica's own heartbeat overrides a
        "serving" when it says it is leaving: it was asked to stop by someone other than the
        fleet (an orchestrator scaling in), which the fleet learns only later."""
        member = ((self.att.fdir.state() or {}).get("members") or {}).get(self.name) or {}
        phase = member.get("phase", "serving")
        if phase == "serving":
            beat = self.att.fdir.heartbeats().get(self.name) or {}
            if beat.get("phase") == "draining" or (beat.get("phase") == "off" and _alive(beat.get("pid"))):
                phase = beat["phase"]
        return phase

    def _attached(self) -> Ready | None:
        r = self._report()
        if r and r.get("state") == "attached" and _alive(r.get("pid")):
            return Ready("rollout", self.name, int(r["pid"]), {"metrics": r["metrics"]})
        return None

    def follow(self) -> str | None:
        """Follow the fleet's scaling: ``"left"`` when the fleet drains this replica (parked
        now), ``"joined"`` when a parked replica serves the job again, else None."""
        if self._killed is not None:
            return None
        phase = self._phase()
        if self.ready is not None and phase != "serving":
            self.ready, self.parked = None, True
            self._note(f"the fleet is draining it ({phase}); parked")
            return "left"
        if self.ready is None and self.parked and phase == "serving":
            ready = self._attached()
            if ready is not None:
                self.ready, self.parked = ready, False
                self._note(f"joined: attached (replica pid {ready.pid}, metrics {ready.address('metrics')})")
                return "joined"
        return None

    @property
    def pid(self) -> int | None:
        return self.ready.pid if self.ready is not None else None

    def _report(self) -> dict[str, Any] | None:
        return self.att.fdir.reports(self.att.job_id).get(self.name)

    def start(self) -> "AttachedReplica":
        self._since = time.time()
        self._killed = None
        self.ready, self.parked = None, False
        self.att.attach()
        self._note(f"handed to fleet {self.att.fdir.name!r}; waiting for its replica {self.name} to take it")
        return self

    def wait_ready(self, timeout: float, should_stop=lambda: False) -> Ready | None:
        """Until the replica took the job; at once (None, parked) when the fleet does not run
        it now (:meth:`follow` takes it when it joins)."""
        deadline = time.monotonic() + timeout
        while not should_stop():
            if not self.att.fdir.running():
                raise ServiceFailed(f"{self.name}: fleet {self.att.fdir.name!r} stopped")
            if self._phase() != "serving":
                self.parked = True
                self._note("the fleet does not run it now; parked until it joins")
                return None
            r = self._report()
            # (a replica the fleet restarted may have taken the job again before this start)
            ready = self._attached()
            if ready is not None:
                self.ready, self.parked = ready, False
                self._note(f"attached (replica pid {ready.pid}, metrics {ready.address('metrics')})")
                return self.ready
            if r and r.get("state") == "refused" and r.get("time", 0) >= self._since - 1.0:
                raise ServiceFailed(f"{self.name} of fleet {self.att.fdir.name!r} refused the job: {r.get('detail')}")
            if time.monotonic() > deadline:
                raise ServiceFailed(f"{self.name}: fleet {self.att.fdir.name!r} did not take the job within "
                                    f"{timeout:g}s (its replica's log: {self.att.fdir.log_file(self.name)})")
            time.sleep(POLL_S)
        return None

    @property
    def returncode(self) -> int | None:
        if self._killed is not None:
            return self._killed
        if self.ready is None:
            # parked: fine while the fleet runs; once it stopped, an exit (the supervisor's
            # restart then fails on "fleet stopped", and the job with it)
            return 1 if self.parked and not self.att.fdir.running() else None
        r = self._report()
        if r is None or r.get("state") != "attached" or not _alive(r.get("pid")) or int(r["pid"]) != self.ready.pid:
            # a replica the fleet drains is leaving, not failing: follow() parks it
            return None if self._phase() != "serving" else 1
        return None

    def url(self, endpoint: str = "metrics") -> str:
        if self.ready is None:
            raise RuntimeError(f"{self.name} is not attached")
        return f"http://{self.ready.address(endpoint)}"

    def signal(self, sig: int) -> None:
        if sig == _signal.SIGKILL:
            self._killed = -9

    def stop(self, grace: float = 20.0) -> int | None:
        """Take the job off the fleet (once, for all its replicas) and wait until this replica
        let it go (it returns or delivers what it held of the job)."""
        self.att.detach()
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            r = self._report()
            if r is None or r.get("state") != "attached" or not _alive(r.get("pid")):
                break
            time.sleep(POLL_S)
        self._killed = 0 if self._killed is None else self._killed
        return self._killed

    def wait_exit(self, timeout: float = 60.0) -> None:
        return None

    def tail(self) -> str:
        try:
            return self.att.fdir.log_file(self.name).read_text()[-2000:]
        except OSError:
            return ""

    def _note(self, line: str) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {self.name}: {line}\n")


def _alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, TypeError, ValueError):
        return False
    return True
