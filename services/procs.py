"""Child processes of a local job: start, wait until ready, watch, stop.

Each service runs as ``<python> -m <module> --config <view.yaml> --id <name>`` with its
output in ``<run_dir>/logs/<name>.log``. Readiness is the service's one ``MESHRL_READY``
line (:mod:`services.readiness`), read from that log with a deadline; a child that dies
while we wait fails at once with the tail of its log. Stopping is SIGTERM, then SIGKILL after a grace period; only the
processes started here are ever signalled.
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
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == me:
            try:
                os.kill(int(entry), signal.SIGKILL)
                killed.append(int(entry))
            except ProcessLookupError:
                pass
    for pid in killed:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    return killed
