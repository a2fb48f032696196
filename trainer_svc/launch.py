"""Start ``nproc`` trainer ranks as child processes (torchrun-style, no extra dependency).

The parent picks a free rendezvous port, starts one child per rank with ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set (``init_process_group``
then meets through a TCPStore on rank 0), forwards SIGTERM/SIGINT to them, and if any
rank fails it terminates the rest (then kills them after a grace period). Returns the
first non-zero exit code (``128 + N`` for a rank killed by signal N, as shells do), or 0. On
Linux a rank also gets SIGTERM if the launcher itself dies (``PR_SET_PDEATHSIG``), so no rank
outlives it: the rank asks for that itself as it starts (:func:`die_with_launcher`), because
running Python between fork and exec (``preexec_fn``) is unsafe in a process with threads --
a gRPC event engine in the launcher's process aborts the child.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from services.net import PortReservations
from services.placement import available_cpus


def rank_env(rank: int, world: int, port: int, threads: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of one rank."""
    env = dict(os.environ if base is None else base)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        MESHRL_LAUNCHER_PID=str(os.getpid()),
    )
    # The ranks share this machine: their data ports listen on loopback only.
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    return env


def spawn_ranks(
    argv: Sequence[str],
    nproc: int,
    *,
    threads: int = 0,
    env: dict[str, str] | None = None,
    grace_s: float = 10.0,
    timeout_s: float | None = None,
) -> int:
    """Run ``[sys.executable, *argv]`` as ``nproc`` ranks; wait for all of them.

    ``threads``: OMP threads per rank (0 = its CPUs // nproc). ``timeout_s``: kill everything
    and return 124 if the ranks have not all exited by then.
    """
    reserved = PortReservations()  # held while the ranks live: rank 0's store binds beside it
    port = reserved.take()
    per_rank = threads or max(1, len(available_cpus()) // nproc)
    procs = [
        subprocess.Popen([sys.executable, *argv], env=rank_env(r, nproc, port, per_rank, env))
        for r in range(nproc)
    ]

    def forward(signum, _frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    code = 0
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed and code == 0:
                code = failed[0] if failed[0] > 0 else 128 - failed[0]  # killed by signal N -> 128+N
                _stop(procs, grace_s)
            if all(c is not None for c in codes):
                break
            if deadline is not None and time.monotonic() > deadline:
                _stop(procs, grace_s)
                return 124
            time.sleep(0.1)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _stop(procs, grace_s)
        reserved.close()
    return code


def die_with_launcher() -> None:
    """In a rank, first thing (Linux): get SIGTERM when the launcher dies, even by SIGKILL, so
    ranks checkpoint and exit instead of training on as orphans; if it died already (before
    this call), SIGTERM now."""
    launcher = os.environ.get("MESHRL_LAUNCHER_PID")
    if not launcher:
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != int(launcher):
        os.kill(os.getpid(), signal.SIGTERM)


def _stop(procs: list[subprocess.Popen], grace_s: float) -> None:
    """Terminate the still-running children, then kill those that ignore it."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        p.terminate()
    end = time.monotonic() + grace_s
    for p in alive:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)
