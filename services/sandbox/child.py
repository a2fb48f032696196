"""The child side of one sandboxed process: take the pipes, apply the limits, load the code.

A sandbox worker module (``python -m <module>``, started by
:class:`services.sandbox.process.SandboxProcess`) calls :func:`start` first. It

* moves the protocol pipes (stdin/stdout) to private descriptors and points fd 1 at
  stderr, so the user code's ``print`` output cannot corrupt the protocol;
* arranges to die with its parent (``PR_SET_PDEATHSIG``);
* reads the ``init`` message and sets its resource limits, soft = hard so the user code
  cannot raise them: ``RLIMIT_AS`` = ``memory_limit_mb``, no core dumps, ``RLIMIT_CPU``
  (``cpu_time_s``, CPU seconds over the worker's life: one that reaches it is killed and
  replaced), ``RLIMIT_NPROC`` (``max_processes``, threads included), ``RLIMIT_FSIZE``
  (``max_file_mb``), ``RLIMIT_NOFILE`` (``max_open_files``); then, unless
  ``allow_network``, cuts the network: under bubblewrap (``"sandbox": "bwrap"``) its
  network namespace is already empty; otherwise it unshares one itself
  (``unshare(CLONE_NEWNET)``; if the kernel refuses, a ``sys.addaudithook`` that rejects
  socket use);
* runs the worker's own ``setup`` (the user code's import) and reports what it raised as
  ``{"op": "fatal", "error"}``.

:func:`reply` and :func:`error_reply` then serve the worker's call loop. Workers:
``reward_svc.sandbox.worker`` (user reward functions), ``rollout_svc.tools.worker`` (tools).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
import traceback
from typing import Any, Callable, TypeVar

from services.sandbox.protocol import ChannelClosed, Reader, pack, write_all

_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_MAX_ERROR_CHARS = 2000

T = TypeVar("T")


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


#: Defaults of the limits an ``init`` message may set (``cpu_time_s``, ``max_processes``,
#: ``max_file_mb``, ``max_open_files``).
DEFAULT_LIMITS = {"cpu_time_s": 3600, "max_processes": 512, "max_file_mb": 1024, "max_open_files": 1024}


def _cap(which: int, value: int) -> None:
    """Set soft = hard = ``value``, never above a hard limit already lower."""
    _, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value))


def _limit_memory(mb: int) -> None:
    limit = int(mb) << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _limit_resources(init: dict[str, Any]) -> None:
    limits = {k: int(init.get(k) or v) for k, v in DEFAULT_LIMITS.items()}
    _cap(resource.RLIMIT_CPU, limits["cpu_time_s"])
    _cap(resource.RLIMIT_FSIZE, limits["max_file_mb"] << 20)
    _cap(resource.RLIMIT_NOFILE, limits["max_open_files"])
    if os.geteuid() != 0:  # RLIMIT_NPROC does not bind root (the weaker mode as root)
        _cap(resource.RLIMIT_NPROC, limits["max_processes"])


def _block_network() -> str:
    """Cut the network; return the mechanism used."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET) == 0:
        return "netns"
    blocked = ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo")

    def hook(event: str, args: tuple) -> None:
        if event in blocked:
            raise PermissionError(f"network access is disabled in the sandbox ({event})")

    sys.addaudithook(hook)
    return "audit-hook"


def _plain(value: Any) -> Any:
    """JSON fallback for numpy scalars/arrays (duck-typed: no numpy import needed)."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"result value of type {type(value).__name__} is not plain data")


def error_reply(exc: BaseException) -> dict[str, Any]:
    """The ``{"ok": false, "kind", "error"}`` answer for an exception raised by user code."""
    kind = "memory" if isinstance(exc, MemoryError) else "exception"
    tb = traceback.format_exception_only(type(exc), exc)
    text = "".join(tb).strip()[-_MAX_ERROR_CHARS:]
    return {"ok": False, "kind": kind, "error": text}


def reply(fd: int, msg: dict[str, Any]) -> None:
    """Send one message to the service (numpy values made plain; unencodable -> ``invalid``)."""
    try:
        data = pack(msg)
    except (TypeError, ValueError):
        try:
            data = pack(json.loads(json.dumps(msg, default=_plain)))
        except (TypeError, ValueError, RecursionError) as exc:
            data = pack({"ok": False, "kind": "invalid", "error": f"result is not JSON-serialisable: {exc}"})
    write_all(fd, data)


def take_protocol_fds() -> tuple[int, int]:
    """Move the protocol pipes (stdin/stdout) to private descriptors, point fd 1 at stderr
    (user ``print`` cannot corrupt the protocol) and fd 0 at /dev/null; arrange to die with
    the parent. Returns ``(fd_in, fd_out)``."""
    proto_in = os.dup(0)
    proto_out = os.dup(1)
    os.dup2(2, 1)  # user print() goes to stderr, never into the protocol
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    _die_with_parent()
    return proto_in, proto_out


def harden(memory_limit_mb: int, allow_network: bool, init: dict[str, Any] | None = None) -> str:
    """Apply the sandbox limits to this process: ``RLIMIT_AS``, no core dumps, CPU time,
    processes, file size, descriptors, and the network cut unless allowed. Returns the
    network mode (``allowed``/``netns``/``audit-hook``)."""
    init = init or {}
    _limit_memory(int(memory_limit_mb))
    _limit_resources(init)
    if allow_network:
        return "allowed"
    if init.get("sandbox") == "bwrap":
        return "netns"  # bubblewrap's --unshare-net: no interface but a down loopback
    return _block_network()


def start(max_in_bytes: int, setup: Callable[[dict[str, Any]], T]) -> tuple[Reader, int, str, T]:
    """A sandbox worker's start: take the protocol pipes, read the ``init`` message, apply
    the limits (:func:`harden`) and run ``setup(init)`` -- the user code's import. Returns
    ``(reader, fd_out, network mode, setup's value)``; the caller sends its own ``ready``.
    Exits the process: 0 when the service closed the pipe before ``init``, 1 after
    replying ``{"op": "fatal", "error"}`` when setup raised."""
    fd_in, fd_out = take_protocol_fds()
    reader = Reader(fd_in, max_in_bytes)
    try:
        init = reader.read(None)
    except ChannelClosed:
        raise SystemExit(0) from None
    try:
        network = harden(int(init["memory_limit_mb"]), bool(init.get("allow_network")), init)
        value = setup(init)
    except BaseException as exc:  # noqa: BLE001 - anything the user's import raises is reported
        reply(fd_out, {"op": "fatal", "error": f"{type(exc).__name__}: {exc}"[-_MAX_ERROR_CHARS:]})
        raise SystemExit(1) from None
    return reader, fd_out, network, value
