"""What runs inside each service instance's Ray actor, on the node Ray placed it on.

The controller's :class:`~services.ray_launcher.placement.RayServiceProcess` creates one
:class:`ServiceActor` per service instance (``ray.remote`` is applied there, so this module
does not import Ray at import time). The actor reports its node (IP, node id, free ports),
then writes the service's view and starts ``python -m <service> --config <view> --id <name>``
in a process group of its own at the node's niceness, with a guard
(:mod:`services.ray_launcher.guard`) that kills that group once the actor's worker is gone.

Only plain strings, numbers, lists and dicts cross its calls.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from services.ray_launcher.guard import guard_argv, kill_group
from services.procs import log_tail
from services.readiness import NotReady, wait_for_ready_in_log


class ServiceActor:
    """The body of one service instance's actor (Ray makes it remote; ``max_concurrency``
    > 1 so ``wait_exit`` can block while the other calls are answered)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.proc: subprocess.Popen | None = None
        self.guard: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self.offset = 0
        self._lock = threading.Lock()

    def node(self, ports: int = 0) -> dict[str, Any]:
        """Where this actor runs: the node's IP (as Ray knows it), node id, host name, and
        ``ports`` ports free on that IP right now (for the servers of the service's view)."""
        import ray

        from services.net import free_port

        node_id = ray.get_runtime_context().get_node_id()
        # the address the node was started with (`ray start --node-ip-address`), as the cluster knows it
        ip = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id),
                  None) or ray.util.get_node_ip_address()
        return {"ip": ip, "node_id": node_id, "hostname": socket.gethostname(),
                "actor_pid": os.getpid(), "ports": [free_port(ip) for _ in range(int(ports))]}

    def start(self, module: str, view_yaml: str, view_path: str, log_path: str, env: dict[str, str],
              args: list[str] | None = None) -> dict[str, Any]:
        """Write the view and start ``python -m module --config view_path --id name [args...]``
        here, output appended to ``log_path`` (both on this node; the same path on shared
        storage). ``args``: more arguments (a fleet replica's ``--fleet-dir DIR --adapter-slots K``)."""
        with self._lock:
            if self.proc is not None and self.proc.poll() is None:
                raise RuntimeError(f"{self.name} is already running (pid {self.proc.pid})")
            view, log = Path(view_path), Path(log_path)
            view.parent.mkdir(parents=True, exist_ok=True)
            view.write_text(view_yaml)
            log.parent.mkdir(parents=True, exist_ok=True)
            self.log_path = log
            with open(log, "ab") as out:
                self.offset = out.tell()
                with _at_niceness(node_niceness()) as nice:
                    if nice.denied is not None:
                        out.write(f"meshrl: this service runs at niceness {nice.denied}, its Ray worker's, not at its "
                                  f"node's {nice.target} (raising a process's priority is not permitted here); start "
                                  "the node with RAY_worker_niceness=0 in the environment of `ray start` to give the "
                                  "services their share of the CPU\n".encode())
                        out.flush()
                    # its own process group (stopped and guarded as one), but the node's session: on a
                    # kernel that shares the CPU between sessions first (autogroup) the service competes
                    # as a process started on the node by hand would, not as a session of its own
                    self.proc = subprocess.Popen(
                        [sys.executable, "-m", module, "--config", str(view), "--id", self.name, *(args or ())],
                        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        env=dict(os.environ, PYTHONUNBUFFERED="1", **env), process_group=0,
                    )  # fmt: skip
            # the guard: kills the service's process group once this actor's worker is gone
            # (it detaches itself: a worker that exits kills its own children, and the guard must
            # outlive this worker to do its job)
            self.guard = subprocess.Popen(guard_argv(self.proc.pid, os.getpid()), stdin=subprocess.DEVNULL,
                                          start_new_session=True)
            return {"pid": self.proc.pid}

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        """The service's readiness line as a dict (``ok``), or why it never came (``error``)."""
        if self.proc is None or self.log_path is None:
            return {"ok": False, "error": "not started"}
        try:
            r = wait_for_ready_in_log(self.proc, self.log_path, timeout, offset=self.offset)
        except NotReady as exc:
            return {"ok": False, "error": str(exc)}
        return {"ok": True, "service": r.service, "id": r.id, "pid": r.pid, "addresses": r.addresses, "info": r.info}

    def wait_exit(self) -> int:
        """Block until the service process exits; its exit code."""
        while self.proc is None:
            time.sleep(0.2)
        return int(self.proc.wait())

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.send_signal(int(sig))
            except ProcessLookupError:
                pass

    def stop(self, grace: float) -> int | None:
        """SIGTERM, SIGKILL after ``grace`` seconds; then SIGKILL whatever of its process
        group is left (a replica's vLLM engine processes). The exit code."""
        from services.net import terminate_then_kill

        if self.proc is None:
            return None
        self.signal(signal.SIGCONT)
        code = terminate_then_kill(self.proc, grace=grace)
        kill_group(self.proc.pid)
        if self.guard is not None:
            self.guard.wait(timeout=10)  # the detaching parent: exits at once; the guard ends with the group
        return code

    def tail(self, lines: int = 25) -> str:
        return log_tail(self.log_path, lines) if self.log_path is not None else "(not started)"


def node_niceness() -> int | None:
    """The niceness of this node's raylet: what a process started on the node by hand runs
    at. Ray starts its workers at ``worker_niceness`` (15 by default: they yield to Ray's own
    daemons); a service is the node's workload, not background work, and runs at this one."""
    try:
        return os.getpriority(os.PRIO_PROCESS, int(os.environ["RAY_RAYLET_PID"]))
    except (KeyError, ValueError, OSError):
        return None


class _at_niceness:
    """Run the block with this thread at niceness ``target`` (Linux keeps a niceness per
    thread, and a process started from the thread inherits it), then go back. Lowering the
    niceness needs privilege: without it the block runs unchanged and ``denied`` is the
    niceness it keeps."""

    def __init__(self, target: int | None) -> None:
        self.target, self.before, self.denied = target, None, None

    def __enter__(self) -> "_at_niceness":
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        if self.target is None or self.target == mine:
            return self
        try:
            os.setpriority(os.PRIO_PROCESS, 0, self.target)
            self.before = mine
        except PermissionError:
            self.denied = mine
        return self

    def __exit__(self, *exc: object) -> None:
        if self.before is not None:
            try:
                os.setpriority(os.PRIO_PROCESS, 0, self.before)  # back up: always permitted; back down may not be
            except PermissionError:
                pass
