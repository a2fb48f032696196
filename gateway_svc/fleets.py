"""The gateway's fleets (docs/fleet.md, docs/gateway.md): warm rollout replicas that the
jobs it launches attach to with ``services.rollout.fleet: NAME``.

    fleets = FleetManager(Path("runs/fleets"), policy)
    fleets.start(spec_yaml_or_dict, ["replicas=2"])    # -> the fleet's public view, state "starting"
    fleets.list(); fleets.get("smol"); fleets.stop("smol", timeout=60)
    fleets.scale("smol", min_replicas=1, max_replicas=3)   # a running fleet's replica bounds
    fleets.events("smol", since=0.0)                       # its scaling decisions, oldest first

A fleet is ``python -m fleet_svc start SPEC --fleets-dir ROOT`` (``meshrl fleet start``), a
child of the gateway in a session of its own (so a signal to the gateway's group does not
reach it), with ``ROOT`` the gateway's fleets directory (``RUNS_DIR/fleets``, 0700), its
output in ``ROOT/<name>/fleet.log``. The fleet directory is its whole record: the fleet's
own ``fleet.json`` (state, replicas, pid), the replicas' reports on each attached job, and
the gateway's ``gateway.json`` (the process it started: pid, start time) and
``gateway-spec.yaml`` (the spec it was started with). No database row: a restarted gateway
reads the same directory and finds its fleets again, as the local launcher finds its jobs
(the fleet keeps running when the gateway stops, like a job).

Stopping is the fleet's own protocol (``FleetDir.request_stop``, what ``meshrl fleet stop``
does): each replica detaches its jobs, then the fleet says ``stopped``.

An elastic fleet (``scaling.max_replicas`` above ``scaling.min_replicas``) adds and drains
replicas on its jobs' backlog by itself; the view carries each replica's ``phase`` (``off``,
``starting``, ``serving``, ``draining``) and the ``scaling`` block of its ``fleet.json`` (bounds,
replicas desired, policy, signals, plus the bounds ``requested`` through :meth:`FleetManager.scale`
that it may not have taken yet); :meth:`FleetManager.events` reads its decisions
(``events.jsonl``). :meth:`FleetManager.scale` is ``meshrl fleet scale``: it writes the bounds
(``FleetDir.request_bounds``), which the fleet takes at its next reading.

States: ``starting`` (launched, replicas loading), ``ready``, ``stopping`` (asked to stop),
``stopped``, ``failed`` (a replica out of restarts, or the process gone without a final
word: the detail says why, with the end of its log).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gateway_svc.launchers.local import _proc_stat
from gateway_svc.policy import OperatorPolicy, policy_problems
from gateway_svc.redact import redact_text
from gateway_svc.spec_validation import SpecRejected, load_raw
from services.config.fleet import NAME_PATTERN, FleetSpec
from services.config.loader import ConfigError, dump_model, validate
from services.fleets import FLEETS_ENV, FleetDir, write_private_whole
from services.handoff import read_json
from services.procs import tail_text

FLEET_NAME = re.compile(NAME_PATTERN)
LAUNCH_FILE = "gateway.json"
SPEC_FILE = "gateway-spec.yaml"
LOG_FILE = "fleet.log"
RUNNING = ("starting", "ready", "stopping")
PHASES = ("off", "starting", "serving", "draining")
#: the bytes of ``events.jsonl`` read at most (its end): a fleet decides at most once per cool-down
MAX_EVENT_BYTES = 4 << 20
#: The fleet's process as the gateway starts it, before ``SPEC --fleets-dir ROOT``.
FLEET_COMMAND = (sys.executable, "-m", "fleet_svc", "start")


class FleetNotFound(LookupError):
    """No fleet of that name has run under this gateway."""


class FleetConflict(RuntimeError):
    """The fleet's state does not allow the request (starting one that runs, stopping one that does not)."""


class FleetLaunchError(RuntimeError):
    """The fleet's process could not be started (the gateway's machine, not the request)."""


class FleetBoundsRejected(SpecRejected):
    """Replica bounds outside 1 <= min <= max <= the spec's largest count (a 400 / INVALID_ARGUMENT)."""


class FleetStillStopping(RuntimeError):
    """Asked to stop, the fleet had not stopped by the deadline; ``view`` is its state then."""

    def __init__(self, message: str, view: dict[str, Any]) -> None:
        super().__init__(message)
        self.view = view


class FleetManager:
    """Start, list, inspect and stop the fleets under ``root`` (see the module doc)."""

    def __init__(self, root: Path, policy: OperatorPolicy | None = None, *, excluded_inputs: Sequence[Path] = (),
                 command: Sequence[str] | None = None, env: dict[str, str] | None = None) -> None:  # fmt: skip
        """``policy``: the operator's (inputs under its roots, its capabilities; None = inputs
        from anywhere: for embedding); ``excluded_inputs``: no input from these (the runs dir,
        the gateway's own files); ``command``: the fleet program before ``SPEC --fleets-dir
        ROOT`` (default ``python -m fleet_svc start``); ``env``: extra environment for it."""
        self.root = Path(root).resolve()
        self.policy = policy if policy is not None else OperatorPolicy(input_roots=(Path("/"),))
        self.excluded_inputs = list(excluded_inputs)
        self.command = list(command or FLEET_COMMAND)
        self.env = dict(env or {})
        self._children: dict[str, subprocess.Popen] = {}
        self._lock = threading.Lock()

    def ensure_root(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.root, 0o700)  # the jobs' views and credentials live in it
        return self.root

    # -- commands ---------------------------------------------------------------------------------------------

    def validate(self, spec: str | dict[str, Any], overrides: Sequence[str] = ()) -> FleetSpec:
        """The fleet spec, validated, within the operator's policy; :class:`SpecRejected`
        naming each bad field otherwise."""
        raw = load_raw(spec, overrides, blocks="name, model, rollout, replicas, ...", what="fleet spec")
        try:
            fleet = validate(FleetSpec, raw, list(overrides), what="fleet spec")
        except ConfigError as exc:
            raise SpecRejected(str(exc)) from None
        except (TypeError, ValueError, RecursionError) as exc:  # pathological input the spec code did not foresee
            raise SpecRejected(f"spec: {exc}") from None
        resolved = yaml.safe_load(dump_model(fleet))
        problems = policy_problems(resolved, self.policy, self.root / fleet.name, excluded=self.excluded_inputs)
        if fleet.model.lora_adapter_path:
            problems.append("model.lora_adapter_path: a fleet serves its jobs' adapters and starts from none (a job "
                            "brings its own with model.lora_adapter_path)")
        if problems:
            raise SpecRejected("invalid fleet spec:\n" + "\n".join(f"  {p}" for p in problems))
        return fleet

    def start(self, spec: str | dict[str, Any], overrides: Sequence[str] = ()) -> dict[str, Any]:
        """Validate, then start the fleet as a child process; its view (state ``starting``).
        :class:`FleetConflict` when a fleet of that name runs."""
        fleet = self.validate(spec, overrides)
        name = fleet.name
        with self._lock:
            current = self._view(name)
            if current is not None and current["state"] in RUNNING:
                raise FleetConflict(f"fleet {name!r} is {current['state']} (pid {current.get('pid')}); "
                                    f"stop it first (DELETE /v1/fleets/{name})")
            fdir = FleetDir(name, self.ensure_root())
            fdir.path.mkdir(exist_ok=True, mode=0o700)
            os.chmod(fdir.path, 0o700)
            fdir.stop_file.unlink(missing_ok=True)  # an earlier run's stop request (the fleet clears it too)
            spec_path = fdir.path / SPEC_FILE
            write_private_whole(spec_path, dump_model(fleet))
            argv = [*self.command, str(spec_path), "--fleets-dir", str(self.root)]
            env = {**os.environ, **self.env, FLEETS_ENV: str(self.root)}
            try:
                log_fd = os.open(fdir.path / LOG_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
                with os.fdopen(log_fd, "ab") as log:
                    log.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')} gateway starts fleet {name}\n".encode())
                    log.flush()
                    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            cwd=fdir.path, env=env, start_new_session=True, umask=0o077)
            except OSError as exc:
                raise FleetLaunchError(f"fleet {name!r}: cannot start {argv[0]!r}: {exc}") from None
            self._children[name] = proc
            # reaped the moment it exits: a zombie would still answer kill(pid, 0), and a
            # job's controller (FleetDir.running) would take the fleet for alive
            threading.Thread(target=proc.wait, name=f"fleet-{name}-reaper", daemon=True).start()
            stat = _proc_stat(proc.pid)
            launch = {"pid": proc.pid, "start_ticks": stat[1] if stat else None, "started": time.time(), "argv": argv}
            write_private_whole(fdir.path / LAUNCH_FILE, json.dumps(launch))
        view = self._view(name) or {}
        known = {"model": fleet.model.path, "max_jobs": fleet.max_jobs, "max_lora_rank": fleet.max_lora_rank}
        return {**view, **{k: v for k, v in known.items() if view.get(k) is None}}

    def stop(self, name: str, timeout: float = 60.0) -> dict[str, Any]:
        """Ask fleet ``name`` to stop (its replicas detach their jobs first) and wait up to
        ``timeout`` seconds; its view once stopped. :class:`FleetNotFound`,
        :class:`FleetConflict` (not running), :class:`FleetStillStopping` (deadline passed)."""
        view = self.get(name)
        if view["state"] not in RUNNING:
            raise FleetConflict(f"fleet {name!r} is {view['state']}; only a running fleet can be stopped")
        fdir = FleetDir(name, self.root)
        fdir.request_stop()
        launch = read_json(fdir.path / LAUNCH_FILE) or {}
        if (fdir.state() or {}).get("pid") != launch.get("pid"):
            # launched, but its state file is not this run's yet: the run's start would clear
            # the stop request, so the process gets SIGTERM (the fleet's handler stops it too)
            self._signal_launched(launch, signal.SIGTERM)
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            view = self.get(name)
            if view["state"] not in RUNNING:
                return view
            if time.monotonic() >= deadline:
                raise FleetStillStopping(f"fleet {name!r} asked to stop; still {view['state']} after {timeout:g}s",
                                         view)
            time.sleep(0.2)

    def scale(self, name: str, min_replicas: int | None = None, max_replicas: int | None = None) -> dict[str, Any]:
        """Run fleet ``name`` between ``min_replicas`` and ``max_replicas`` replicas from its
        next reading on (``meshrl fleet scale``; a bound not given stays as it is); its view,
        with the bounds asked for in ``scaling.requested``. :class:`FleetNotFound`,
        :class:`FleetConflict` (not running, or stopping), :class:`FleetBoundsRejected`
        (outside ``1 <= min <= max <=`` the spec's ``scaling.max_replicas``)."""
        view = self.get(name)
        if view["state"] not in ("starting", "ready") or not view.get("pid"):
            raise FleetConflict(f"fleet {name!r} is {view['state']}; only a running fleet can be scaled")
        fdir = FleetDir(name, self.root)
        launch = read_json(fdir.path / LAUNCH_FILE) or {}
        if launch.get("pid") is not None and (fdir.state() or {}).get("pid") != launch.get("pid"):
            # its start clears a bounds request (services/fleets.py, FleetDir.create): not yet
            raise FleetConflict(f"fleet {name!r} is still launching (no state of this run yet); scale it once "
                                f"it says starting or ready")
        spec = self._spec(fdir)
        if spec is None:
            raise FleetConflict(f"fleet {name!r}: its spec cannot be read from {fdir.path}")
        most = len(spec.replica_names())
        sc = view.get("scaling") or {}
        asked = fdir.requested_bounds()
        if asked is not None:
            lo0, hi0 = asked
        elif isinstance(sc.get("min"), int) and isinstance(sc.get("max"), int):
            lo0, hi0 = sc["min"], sc["max"]
        else:
            lo0, hi0 = spec.scaling.bounds(spec.replicas)
        lo = lo0 if min_replicas is None else min_replicas
        hi = hi0 if max_replicas is None else max_replicas
        problems = []
        if not isinstance(lo, int) or isinstance(lo, bool) or lo < 1:
            problems.append(f"min_replicas: {lo!r} is not a count of at least 1")
        if not isinstance(hi, int) or isinstance(hi, bool) or hi > most:
            problems.append(f"max_replicas: {hi!r} is above the fleet's largest count {most} (its spec's "
                            f"scaling.max_replicas; a fleet started with fewer cannot grow past it)")
        if not problems and lo > hi:
            given = [k for k, v in (("min_replicas", min_replicas), ("max_replicas", max_replicas)) if v is not None]
            problems.append(f"min_replicas ({lo}) is above max_replicas ({hi})"
                            + (" (the one not given is the fleet's current bound)" if len(given) == 1 else ""))
        if problems:
            raise FleetBoundsRejected(f"fleet {name!r}: need 1 <= min_replicas <= max_replicas <= {most}:\n"
                                      + "\n".join(f"  {p}" for p in problems))
        fdir.request_bounds(lo, hi)
        return self.get(name)

    def events(self, name: str, *, since: float = 0.0, limit: int = 1000) -> dict[str, Any]:
        """Fleet ``name``'s scaling decisions after ``since`` (unix seconds), oldest first, at
        most ``limit`` (the oldest ones: pass the last ``ts`` as ``since`` for the next ones):
        ``{"name", "state", "events": [{"ts", "action", "reason", "replicas", "from", "to",
        "signals"}]}``. :class:`FleetNotFound`."""
        view = self.get(name)
        out = []
        for e in _read_events(FleetDir(name, self.root).events_file):
            ev = _event(e)
            if ev is not None and ev["ts"] > since:
                out.append(ev)
                if len(out) >= limit:
                    break
        return {"name": name, "state": view["state"], "events": out}

    # -- queries ----------------------------------------------------------------------------------------------

    def names(self) -> list[str]:
        """Every fleet that has run (or was started) under the gateway's fleets directory."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir()
                      if FLEET_NAME.fullmatch(p.name) and p.is_dir() and not p.is_symlink()
                      and ((p / "fleet.json").exists() or (p / LAUNCH_FILE).exists()))  # fmt: skip

    def list(self) -> list[dict[str, Any]]:
        return [v for v in (self._view(n) for n in self.names()) if v is not None]

    def get(self, name: str, *, with_spec: bool = False) -> dict[str, Any]:
        if not FLEET_NAME.fullmatch(name):
            raise FleetNotFound(f"no fleet {name!r} (a fleet name matches {NAME_PATTERN})")
        view = self._view(name, with_spec=with_spec)
        if view is None:
            raise FleetNotFound(f"no fleet {name!r} on this gateway")
        return view

    # -- internals --------------------------------------------------------------------------------------------

    def _signal_launched(self, launch: dict[str, Any], sig: int) -> None:
        pid = launch.get("pid")
        if isinstance(pid, int) and _alive(pid, launch.get("start_ticks")):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _spec(self, fdir: FleetDir) -> FleetSpec | None:
        """The spec of the fleet's run: its own ``fleet.yaml``, else the one the gateway started it with."""
        from services.config.loader import load_model

        for path in (fdir.spec_file, fdir.path / SPEC_FILE):
            if path.is_file() and not path.is_symlink():
                try:
                    return load_model(FleetSpec, path, what="fleet spec")
                except (ConfigError, OSError, ValueError):
                    continue
        return None

    def _view(self, name: str, *, with_spec: bool = False) -> dict[str, Any] | None:
        """The public view of fleet ``name`` from its directory (None: it never ran here)."""
        fdir = FleetDir(name, self.root)
        if fdir.path.is_symlink():
            return None
        st = fdir.state()
        launch = read_json(fdir.path / LAUNCH_FILE)
        if st is None and launch is None:
            return None
        launch = launch or {}
        launched_pid = launch.get("pid") if isinstance(launch.get("pid"), int) else None
        st_pid = st.get("pid") if st is not None and isinstance(st.get("pid"), int) else None
        this_run = st is not None and (launched_pid is None or st_pid == launched_pid
                                       or _num(st.get("time")) >= _num(launch.get("started")))
        detail = ""
        if this_run:
            state = str(st.get("state"))
            detail = str(st.get("detail") or "")
            if state in ("starting", "ready"):
                if st_pid is None or not _alive(st_pid, launch.get("start_ticks") if st_pid == launched_pid else None):
                    state, detail = "failed", "the fleet's process exited without a final state"
                elif fdir.stop_requested():
                    state = "stopping"
            elif state not in ("stopped", "failed"):
                state, detail = "failed", f"unknown state {state!r} in fleet.json"
        elif launched_pid is not None and _alive(launched_pid, launch.get("start_ticks")):
            state = "stopping" if fdir.stop_requested() else "starting"
            detail = "launched; loading"
        elif fdir.stop_requested():  # stopped (SIGTERM) while it was launching
            state, detail = "stopped", "stopped before it started"
        else:
            state, detail = "failed", "the fleet's process exited before it started"
        if state == "failed":
            tail = _tail(fdir.path / LOG_FILE)
            detail = detail + (f"\n{tail}" if tail else "")
        members = st.get("members") if this_run and isinstance(st.get("members"), dict) else {}
        names = st.get("replicas") if this_run and isinstance(st.get("replicas"), list) else []
        replicas = {}
        for rep in [*[str(n) for n in names], *[str(n) for n in members if n not in names]][:1024]:
            m = members.get(rep) if isinstance(members.get(rep), dict) else {}
            replicas[rep[:128]] = {
                "alive": m.get("alive") is True and state in RUNNING, "ready": m.get("ready") is True,
                "restarts": _int(m.get("restarts")) or 0, "metrics": _str(m.get("metrics")), "pid": _int(m.get("pid")),
                "phase": _phase(m.get("phase"), state),
            }  # fmt: skip
        jobs = {}
        for job in fdir.attached()[:1024]:
            jobs[job] = {rep[:128]: _report(r) for rep, r in fdir.reports(job).items()}
        out: dict[str, Any] = {
            "name": name, "state": state, "detail": redact_text(detail)[:4000],
            "pid": st_pid if this_run else launched_pid,
            "model": _str(st.get("model")) if this_run else None,
            "max_jobs": _int(st.get("max_jobs")) if this_run else None,
            "max_lora_rank": _int(st.get("max_lora_rank")) if this_run else None,
            "replicas": replicas, "jobs": jobs,
            "scaling": _scaling(st.get("scaling") if this_run else None,
                                fdir.requested_bounds() if state in ("starting", "ready") else None),
            "metrics": _str(st.get("metrics")) if this_run and state in RUNNING else None,
            "started_at": _float(launch.get("started")),
            "updated_at": _float(st.get("time")) if this_run else _float(launch.get("started")),
        }  # fmt: skip
        if with_spec:
            try:
                out["spec"] = (fdir.path / SPEC_FILE).read_text()
            except OSError:
                out["spec"] = None
        return out


def fleets_dir(runs_dir: Path) -> Path:
    """The gateway's fleets directory (``$MESHRL_FLEETS_DIR`` of its fleets and jobs)."""
    return Path(runs_dir) / "fleets"


def _alive(pid: int, start_ticks: Any = None) -> bool:
    """Is ``pid`` a live (not zombie) process -- the one started at ``start_ticks`` when given?"""
    stat = _proc_stat(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return False
    return not isinstance(start_ticks, int) or stat[1] == start_ticks


def _phase(v: Any, state: str) -> str | None:
    """A replica's phase as the fleet wrote it (None: a fleet that writes none); ``off`` once the
    fleet is no longer running, whatever it last wrote."""
    if v not in PHASES:
        return None
    return v if state in RUNNING else "off"


def _signals(v: Any) -> dict[str, float]:
    """The fleet's scaling signals: the numbers only (not its monotonic clock ``now``), bounded."""
    if not isinstance(v, dict):
        return {}
    out = {}
    for k, x in list(v.items())[:64]:
        if isinstance(k, str) and k != "now" and (f := _float(x)) is not None:
            out[k[:64]] = f
    return out


def _scaling(sc: Any, requested: tuple[int, int] | None) -> dict[str, Any] | None:
    """The ``scaling`` block of fleet.json, typed (None: the fleet wrote none), with the bounds
    asked for through the gateway or ``meshrl fleet scale`` (``requested``)."""
    if not isinstance(sc, dict):
        return None
    return {"min": _int(sc.get("min")), "max": _int(sc.get("max")), "desired": _int(sc.get("desired")),
            "policy": (_str(sc.get("policy")) or "")[:64] or None, "signals": _signals(sc.get("signals")),
            "requested": {"min": requested[0], "max": requested[1]} if requested else None}  # fmt: skip


def _read_events(path: Path) -> list[dict[str, Any]]:
    """The fleet's ``events.jsonl``, its last :data:`MAX_EVENT_BYTES` at most (no symlink followed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return []
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return []
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - MAX_EVENT_BYTES))
        data = f.read(MAX_EVENT_BYTES)
    lines = data.split(b"\n")
    if size > MAX_EVENT_BYTES:
        lines = lines[1:]  # the first one is cut
    out = []
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict):
            out.append(e)
    return out


def _event(e: dict[str, Any]) -> dict[str, Any] | None:
    """One line of ``events.jsonl`` (fleet_svc/fleet.py) as the API shows it: ``time`` is ``ts``."""
    ts = _float(e.get("time"))
    if ts is None:
        return None
    reps = e.get("replicas")
    return {"ts": ts, "action": str(e.get("action") or "")[:32], "reason": str(e.get("reason") or "")[:64],
            "replicas": [str(r)[:128] for r in reps[:1024]] if isinstance(reps, list) else [],
            "from": _int(e.get("from")), "to": _int(e.get("to")), "signals": _signals(e.get("signals"))}  # fmt: skip


def _report(r: dict[str, Any]) -> dict[str, Any]:
    """One replica's report on one job (services/fleets.py), typed and bounded."""
    return {"state": str(r.get("state") or "")[:32], "detail": redact_text(str(r.get("detail") or ""))[:2000],
            "served_version": _int(r.get("served_version")), "metrics": _str(r.get("metrics")),
            "pid": _int(r.get("pid")), "time": _float(r.get("time"))}  # fmt: skip


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and -(2**62) < v < 2**62 else None


def _float(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _num(v: Any) -> float:
    return _float(v) or 0.0


def _str(v: Any) -> str | None:
    return v[:1000] if isinstance(v, str) else None


def _tail(path: Path, lines: int = 8) -> str:
    return tail_text(path, lines)


__all__ = ["FleetBoundsRejected", "FleetConflict", "FleetLaunchError", "FleetManager", "FleetNotFound",
           "FleetStillStopping", "fleets_dir"]
