"""Small networking helpers shared by services and test fixtures."""

from __future__ import annotations

import random
import socket
import time

_LOWEST_PORT = 20000
"""free_port never picks below this: well-known and commonly configured services live
there, and so do ranges other systems take for themselves (Ray's worker ports are
10002-19999 by default and Ray refuses to start when another of its ports falls inside)."""


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for ``bind(0)`` and outgoing connections' source ports."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, for a server another process will start.

    Chosen at random *below* the kernel's ephemeral range. A port from ``bind(0)`` lies in
    that range, and the kernel also hands its ports out as the source port of every outgoing
    connection (gloo's mesh, gRPC, Redis clients...). Such a port could then be taken
    between this call and the server's bind. Below the range, only another ``free_port``
    caller could take it, and the random choice makes that unlikely. Falls back to
    ``bind(0)`` if no port there can be bound.
    """
    lo, _ = ephemeral_port_range()
    if lo - _LOWEST_PORT >= 1000:
        rng = random.SystemRandom()
        for _ in range(64):
            port = rng.randrange(_LOWEST_PORT, lo)
            if _bindable(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class PortReservations:
    """Ports picked here for servers other processes will start, kept from other pickers.

    ``free_port``'s answer holds only for a moment. Between the pick and the server's bind
    (seconds, for a service that imports torch first) another picker on the machine (a
    trainer choosing its ranks' rendezvous port, a second job) can choose the same port, and
    one of the two servers then fails with EADDRINUSE. A reservation is a socket bound to the
    port and never listening. ``free_port``'s probe, a bind without SO_REUSEADDR, fails on
    it, so no other picker takes the port. The server binds beside it, because it sets
    SO_REUSEADDR, as http.server, gRPC, c10d's TCPStore and redis-server all do on Linux.
    Hold the reservations for as long as a server may be restarted on its port.
    """

    def __init__(self) -> None:
        self._held: dict[tuple[str, int], socket.socket] = {}

    def take(self, host: str = "127.0.0.1") -> int:
        """A port free now, held for this object's owner until ``close``."""
        for _ in range(16):
            port = free_port(host)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((host, port))  # exclusive: fails if anyone took it since the probe
            except OSError:
                sock.close()
                continue
            # after the bind: later binds with SO_REUSEADDR (the real server's) may share it
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._held[(host, port)] = sock
            return port
        raise OSError(f"no port on {host} could be reserved")

    def __len__(self) -> int:
        return len(self._held)

    def close(self) -> None:
        for sock in self._held.values():
            sock.close()
        self._held.clear()


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when ``host:port`` accepts a TCP connection within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_port(host: str, port: int, timeout: float, proc=None) -> None:
    """Block until ``host:port`` accepts TCP connections.

    Raises ``TimeoutError`` after ``timeout`` seconds, or ``RuntimeError`` at once if
    ``proc`` (a ``subprocess.Popen``) exits first, so a crashed child fails fast.
    """
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode} before {host}:{port} opened")
        if port_open(host, port):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{host}:{port} did not open within {timeout:.1f}s")
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


def tcp_store(host: str, port: int, timeout_s: float, *, is_master: bool, world_size: int | None = None):
    """A ``torch.distributed.TCPStore`` whose server (``is_master``) listens on ``host`` only.

    torch's own TCPStore server listens on every address of the machine; here the master binds
    its socket to ``host`` itself (``0.0.0.0`` still means everywhere) and hands it over, so
    the rendezvous is reachable exactly where the job's services meet. Clients just connect.
    A TCPStore has no authentication at all: see docs/security.md for how to fence it."""
    import datetime

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    if not is_master:
        return dist.TCPStore(host, port, world_size, False, timeout=timeout, wait_for_workers=False)
    sock = socket.create_server((host, port), family=socket.AF_INET, backlog=1024)
    try:
        store = dist.TCPStore(host, sock.getsockname()[1], world_size, True, timeout=timeout,
                              wait_for_workers=False, master_listen_fd=sock.fileno())
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns the listening socket now
    return store


def local_address_towards(host: str, port: int = 9) -> str | None:
    """This machine's address on the route to ``host`` (no packet is sent), or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return s.getsockname()[0]
    except OSError:
        return None


def is_local_address(host: str) -> bool:
    """True if ``host`` (a name or an IPv4 address) resolves to an address this machine can bind."""
    try:
        addr = socket.gethostbyname(host)
    except OSError:
        return False
    return _bindable(addr, 0)
