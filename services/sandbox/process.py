"""The parent side of one sandboxed process: start it, talk to it, kill it.

:class:`SandboxProcess` runs ``python -m <module>`` (a fresh interpreter, exec'd: never a
fork of a threaded service) in its own process group, with a scrubbed environment
(:func:`worker_env`), and speaks :mod:`services.sandbox.protocol` on its stdin/stdout. The
module is the child: it calls :func:`services.sandbox.child.start` first, which applies the
limits and answers the ``init`` message with ``{"op": "ready", ...}``.

Used by the reward service's pool of user reward functions
(``reward_svc.sandbox.pool``) and by the rollout replicas' tool sandboxes
(``rollout_svc.tools.sandbox``); what the workers run and how their replies are judged is
theirs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

from services.sandbox.confine import Confinement, SandboxUnavailable, bwrap_argv, sandbox_mode
from services.sandbox.protocol import ChannelClosed, ChannelError, ChannelTimeout, Reader, pack, write_all


class SandboxStartError(RuntimeError):
    """A worker could not start (bad function path, import error, start deadline, no bubblewrap)."""


#: Environment variables a worker inherits; everything else (credentials such as a Redis
#: password variable, tokens) stays in the service. ``MESHRL_REWARD_*`` is passed for users
#: (to reward functions and tools alike).
_ENV_KEEP = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONHASHSEED")


def worker_env(parent: Mapping[str, str]) -> dict[str, str]:
    """The scrubbed environment of a sandbox worker."""
    env = {k: v for k, v in parent.items() if k in _ENV_KEEP or k.startswith(("LC_", "MESHRL_REWARD_"))}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


class SandboxProcess:
    """One sandboxed worker process and its pipes: ``python -m <module>`` in its own process
    group, with the scrubbed environment; sends ``init`` and waits (``start_timeout_s``) for
    ``{"op": "ready"}``."""

    def __init__(self, module: str, init: dict[str, Any], *, max_reply_bytes: int, start_timeout_s: float,
                 what: str = "sandbox worker", loading: str = "its code",
                 confinement: Confinement | None = None) -> None:
        conf = confinement or Confinement()
        env = worker_env(os.environ)
        argv = [sys.executable, "-m", module]
        try:
            self.mode = sandbox_mode(conf.user_code)
        except SandboxUnavailable as exc:
            raise SandboxStartError(f"{what}: {exc}") from None
        if self.mode == "bwrap":
            argv = bwrap_argv(argv, conf, env)
        init = {**init, "sandbox": self.mode}
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
            env=env,
            close_fds=True,  # nothing inherited but the protocol pipes and stderr
            # no new session: the worker stays in the service's (the job's) process group,
            # so pausing the job (SIGSTOP to its group) stops the worker too
        )
        self.reader = Reader(self.proc.stdout.fileno(), max_reply_bytes)
        self.network = "?"
        try:
            self.send(init)
            msg = self.reader.read(time.monotonic() + start_timeout_s)
        except (ChannelClosed, ChannelTimeout, ChannelError, OSError) as exc:
            self.kill()
            raise SandboxStartError(f"{what} did not start: {type(exc).__name__}: {exc}") from None
        if msg.get("op") != "ready":
            self.kill()
            raise SandboxStartError(f"{what} failed to load {loading}: {msg.get('error', msg)}")
        self.ready = msg
        self.network = str(msg.get("network"))
        self.pid = self.proc.pid

    def exit_detail(self, code: int | None) -> str:
        """How the worker ended, in words (bubblewrap reports a signal ``N`` as exit code 128+N)."""
        if code is not None and code < 0:
            return f"killed by signal {-code}"
        if code is not None and code > 128 and self.mode == "bwrap":
            return f"killed by signal {code - 128}"
        return f"exit code {code}"

    def send(self, msg: dict[str, Any]) -> None:
        write_all(self.proc.stdin.fileno(), pack(msg))

    def signal_kill(self) -> None:
        """SIGKILL the worker now without waiting for it. Under bubblewrap the killed
        process is the sandbox's bwrap: its pid namespace ends, taking every process the
        user code started with it."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """Kill the worker (and, under bubblewrap, every process in its sandbox) and reap it."""
        self.signal_kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
