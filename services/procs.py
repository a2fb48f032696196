"""Child processes of a local job: start, wait until ready, watch, stop.

Each service runs as ``<python> -m <module> --config <view.yaml> --id <name>`` with its
output in ``<run_dir>/logs/<name>.log``. Readiness is the service's one ``MESHRL_READY``
line (:mod:`services.readiness`), read from that log with a deadline; a child that dies
while we wait fails at once with the tail of its log. Stopping is SIGTERM, then SIGKILL after a grace period; only the
processes started here are ever signalled.

:func:`proc_stat` is the one reader of ``/proc/<pid>/stat`` (state, parent, process group,
CPU times of any process on this machine), for the code here, the Ray guard and the tests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from services.net import terminate_then_kill
from services.readiness import NotReady, Ready, wait_for_ready_in_log


class ServiceFailed(RuntimeError):
    """A service exited (or never became ready); the message says which and why."""


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:])


def tail_text(path: Path, lines: int = 8, max_bytes: int = 4096) -> str:
    """The last ``lines`` lines within the last ``max_bytes`` of ``path`` ("" if unreadable):
    what an API shows of a log, without reading a large one whole."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - max_bytes))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


@dataclass(frozen=True)
class ProcStat:
    """What ``/proc/<pid>/stat`` says of one process (see proc(5)); times in clock ticks
    (``os.sysconf("SC_CLK_TCK")`` per second)."""

    pid: int
    comm: str  # the command name, as the kernel keeps it (at most 15 bytes; may hold spaces and parens)
    state: str  # R running, S sleeping, D disk wait, Z zombie, T stopped, t traced, X dead, ...
    ppid: int
    pgid: int
    session: int
    utime: int  # user CPU time
    stime: int  # system CPU time
    starttime: int  # since boot: with the pid, names one process across pid reuse

    @property
    def cpu_ticks(self) -> int:
        return self.utime + self.stime

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")


def parse_proc_stat(text: str) -> ProcStat:
    """Parse one ``/proc/<pid>/stat`` line. The command name sits between the first ``(``
    and the *last* ``)``: it may itself contain spaces and parentheses, so the fields are
    split only after that last ``)``. ValueError if the line is not a stat line."""
    head, close, tail = text.rpartition(")")
    pid, open_, comm = head.partition(" (")
    fields = tail.split()
    if not close or not open_ or len(fields) < 20:
        raise ValueError(f"not a /proc/<pid>/stat line: {text[:80]!r}")
    return ProcStat(pid=int(pid), comm=comm, state=fields[0], ppid=int(fields[1]), pgid=int(fields[2]),
                    session=int(fields[3]), utime=int(fields[11]), stime=int(fields[12]),
                    starttime=int(fields[19]))  # fmt: skip


def proc_stat(pid: int | str) -> ProcStat | None:
    """``/proc/<pid>/stat`` of ``pid``, parsed; None when there is no such process (gone,
    or never was) or it cannot be read."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            text = f.read()
    except (OSError, ValueError):
        return None
    try:
        return parse_proc_stat(text)
    except ValueError:
        return None


def all_proc_stats() -> list[ProcStat]:
    """Every process on this machine that can be read now (one that vanishes meanwhile is skipped)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := proc_stat(entry)) is not None:
            out.append(st)
    return out


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process: it exists and is not a zombie."""
    st = proc_stat(pid)
    return st is not None and not st.zombie


@dataclass
class ServiceProcess:
    """One child service; ``ready`` is its readiness announcement once :meth:`wait_ready` returned."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    kill_reason: str = ""  # why the supervisor killed it (stuck), shown with its exit
    ready: Ready | None = None
    log_offset: int = 0  # where this start's output begins in the (appended) log

    def start(self) -> "ServiceProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        self.ready = None
        with open(self.log_path, "ab") as log:
            self.log_offset = log.tell()
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        return self

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def failure(self) -> str:
        return f"{self.name} exited with code {self.returncode}; last lines of {self.log_path}:\n{log_tail(self.log_path)}"

    def wait_ready(self, timeout: float, should_stop=lambda: False) -> Ready | None:
        """Block until the child announces readiness (None if ``should_stop()`` first);
        ServiceFailed if it exits or the deadline passes. Only lines written since the
        latest :meth:`start` count (a restarted service announces again)."""
        try:
            self.ready = wait_for_ready_in_log(self.proc, self.log_path, timeout, offset=self.log_offset,
                                               should_stop=should_stop)
        except NotReady as exc:
            raise ServiceFailed(f"{self.name} {exc}") from None
        return self.ready

    def url(self, endpoint: str = "metrics") -> str:
        """``http://host:port`` of an announced endpoint (after :meth:`wait_ready`)."""
        if self.ready is None:
            raise RuntimeError(f"{self.name} has not announced readiness")
        return f"http://{self.ready.address(endpoint)}"

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def stop(self, grace: float = 20.0) -> int | None:
        """SIGTERM, wait ``grace`` seconds, then SIGKILL. Returns the exit code."""
        return terminate_then_kill(self.proc, grace=grace)


def python_module_argv(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def become_subreaper() -> bool:
    """Make this process adopt its orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``).

    Services start helpers of their own (vLLM's engine-core and worker processes); if a
    service dies, those would be re-parented to init and live on. As a subreaper, the
    controller inherits them instead and :func:`kill_adopted` ends them at shutdown."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def kill_adopted(exclude: set[int] = frozenset()) -> list[int]:
    """SIGKILL and reap every remaining child of this process not in ``exclude``."""
    me, killed = os.getpid(), []
    for st in all_proc_stats():
        if st.ppid == me and st.pid not in exclude:
            try:
                os.kill(st.pid, signal.SIGKILL)
                killed.append(st.pid)
            except ProcessLookupError:
                pass
    for pid in killed:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    return killed
