"""Small networking helpers shared by services and test fixtures."""

from __future__ import annotations

import socket
import time


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_for_port(host: str, port: int, timeout: float, proc=None) -> None:
    """Block until ``host:port`` accepts TCP connections.

    Raises ``TimeoutError`` after ``timeout`` seconds, or ``RuntimeError`` at once if
    ``proc`` (a ``subprocess.Popen``) exits first, so a crashed child fails fast.
    """
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode} before {host}:{port} opened")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{host}:{port} did not open within {timeout:.1f}s") from None
            time.sleep(0.05)


def terminate_then_kill(proc, grace: float = 5.0) -> int | None:
    """Stop a ``subprocess.Popen``: SIGTERM, wait ``grace`` seconds, then SIGKILL.

    Safe to call on a process that already exited (or was never started: ``None``);
    returns the exit code."""
    import subprocess

    if proc is None:
        return None
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return proc.returncode
