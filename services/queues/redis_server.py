"""Run a private ``redis-server`` child process (for tests, benchmarks and local runs).

It binds 127.0.0.1 on its own port, keeps its files in its own directory, and can be
SIGKILLed and restarted on the same port and data (to test crash recovery). It only ever
signals the process it started.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

from services.net import free_port, terminate_then_kill, wait_for_port


class RedisServer:
    """A ``redis-server`` child: ``start()``, ``kill()`` (SIGKILL), ``restart()``, ``stop()``.

    ``aof``: append-only file with ``appendfsync always`` (every write on disk before the
    reply), so a SIGKILL loses nothing that was acknowledged.
    """

    def __init__(self, workdir: str | Path, *, port: int | None = None, aof: bool = False,
                 binary: str = "redis-server", maxmemory_mb: int = 0, password: str | None = None) -> None:
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.aof = aof
        self.maxmemory_mb = maxmemory_mb
        self.password = password
        exe = shutil.which(binary)
        if exe is None:
            raise FileNotFoundError(f"{binary} not found on PATH")
        self.binary = exe
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def unix_url(self) -> str:
        """The same server over its unix socket (``unix://...``)."""
        return f"unix://{self.dir / 'redis.sock'}?db=0"

    def _args(self) -> list[str]:
        args = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
            "--save", "", "--daemonize", "no", "--logfile", str(self.dir / "redis.log"),
            "--protected-mode", "yes", "--unixsocket", str(self.dir / "redis.sock"), "--unixsocketperm", "700", "--proto-max-bulk-len", "1gb", "--client-query-buffer-limit", "1gb",
        ]
        if self.aof:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        if self.maxmemory_mb:
            args += ["--maxmemory", f"{self.maxmemory_mb}mb"]
        return args

    def start(self, timeout: float = 20.0) -> "RedisServer":
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("redis-server already running")
        self.proc = subprocess.Popen(self._args(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_for_port("127.0.0.1", self.port, timeout, proc=self.proc)
            self._wait_loaded(timeout)
        except Exception:
            self.stop()
            raise
        return self

    def _wait_loaded(self, timeout: float) -> None:
        """Wait until PING answers PONG (not LOADING while the AOF is replayed)."""
        import socket

        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
                    auth = f"AUTH {self.password}\r\n".encode() if self.password else b""
                    s.sendall(auth + b"PING\r\n")
                    reply = b""
                    while b"\r\n" not in reply or (auth and reply.count(b"\r\n") < 2):
                        part = s.recv(256)
                        if not part:
                            break
                        reply += part
                    if b"+PONG" in reply:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"redis-server on {self.port} did not answer PING within {timeout}s")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL the server (a crash: no shutdown save)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def restart(self, timeout: float = 20.0) -> "RedisServer":
        """Start again on the same port and directory (replaying the AOF if enabled)."""
        self.kill()
        return self.start(timeout)

    def stop(self) -> None:
        """Terminate (then kill) the server; safe to call twice."""
        terminate_then_kill(self.proc, grace=5.0)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
