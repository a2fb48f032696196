"""Run the embedded broker as a child process (``python -m services.queues``).

For tests and benchmarks that must SIGKILL and restart the broker's host. It only ever
signals the process it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from services.net import free_port, terminate_then_kill, wait_for_port


class BrokerProcess:
    """``start()``, ``kill()`` (SIGKILL), ``restart()`` (same port and append-only file), ``stop()``."""

    def __init__(self, *, port: int | None = None, aof_path: str | Path | None = None, fsync: bool = False,
                 log_path: str | Path | None = None) -> None:
        self.port = port or free_port()
        self.aof_path = aof_path
        self.fsync = fsync
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> "BrokerProcess":
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("broker already running")
        cmd = [sys.executable, "-m", "services.queues", "--port", str(self.port), "--log-level", "WARNING"]
        if self.aof_path is not None:
            cmd += ["--aof", str(self.aof_path)]
        if self.fsync:
            cmd.append("--fsync")
        env = dict(os.environ, OMP_NUM_THREADS="1", GRPC_VERBOSITY="ERROR")
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=out if self.log_path else None, env=env)
        finally:
            if self.log_path:
                out.close()
        try:
            wait_for_port("127.0.0.1", self.port, timeout, proc=self.proc)
        except Exception:
            self.stop()
            raise
        return self

    def kill(self) -> None:
        """SIGKILL the broker (a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def restart(self, timeout: float = 30.0) -> "BrokerProcess":
        self.kill()
        return self.start(timeout)

    def stop(self) -> None:
        terminate_then_kill(self.proc, grace=5.0)

    def __enter__(self) -> "BrokerProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
