"""The guard: kills a Ray service's process group once its actor's worker is gone.

:class:`~services.ray_launcher.actor.ServiceActor` starts one next to every service process it
runs, as ``python -m services.ray_launcher.guard PGID WORKER_PID``. A node's raylet dying kills
the actor's worker, not the processes the worker started; the guard, detached from the
worker, sees the worker go and SIGKILLs the service's process group (a replica's vLLM engine
processes included). It exits by itself once the group is empty.

This module runs as its own small process: it imports nothing heavy.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from services.procs import pid_alive

GUARD_POLL_S = 0.5
MODULE = "services.ray_launcher.guard"


def kill_group(pgid: int) -> None:
    """SIGKILL process group ``pgid``; nothing if it is gone already."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def guard_argv(pgid: int, watched: int) -> list[str]:
    """The command line that starts the guard of process group ``pgid``, watching ``watched``."""
    return [sys.executable, "-m", MODULE, str(pgid), str(watched)]


def guard_main(pgid: int, watched: int) -> int:
    """Kill process group ``pgid`` once process ``watched`` (the service's actor worker) is
    gone; exit by itself once the group is empty. Detaches first (double fork): the worker
    kills its direct children when it exits, which must not include its guard."""
    if os.fork():
        return 0
    while True:
        if not pid_alive(watched):
            kill_group(pgid)
            return 0
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return 0
        except PermissionError:
            pass
        time.sleep(GUARD_POLL_S)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not all(a.isdigit() for a in args):
        print(f"usage: python -m {MODULE} PGID WORKER_PID", file=sys.stderr)
        return 2
    return guard_main(int(args[0]), int(args[1]))


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)  # the detached guard and its parent both end here, without the interpreter's exit handlers
