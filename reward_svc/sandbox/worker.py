"""The sandbox worker: one child process that runs a user reward function.

Started by :class:`reward_svc.sandbox.pool.SandboxPool` as
``python -m reward_svc.sandbox.worker`` (a fresh interpreter: exec'd, never a fork of the
threaded service). Protocol (see :mod:`.protocol`) over its stdin/stdout, which the worker
moves to private descriptors at once so user ``print`` output goes to stderr instead:

1. service → ``{"op": "init", "path", "name", "kwargs", "mode", "memory_limit_mb",
   "allow_network"}``; the worker sets ``RLIMIT_AS``, drops into an empty network
   namespace (``unshare(CLONE_NEWNET)``; if the kernel refuses, a ``sys.addaudithook``
   that rejects socket use), loads the function, and answers
   ``{"op": "ready", "pid", "network": "netns" | "audit-hook" | "allowed"}`` or
   ``{"op": "fatal", "error"}``.
2. service → ``{"op": "calls", "items": [kwargs, ...]}``; the worker answers one
   ``{"ok": true, "result": float | dict}`` or ``{"ok": false, "kind", "error"}`` per item,
   in order (so the service knows exactly which item is running when a deadline passes).
3. service → ``{"op": "batch", "args": {"data_sources": [...], ...}}``; one answer whose
   result is a list.

The worker exits when its input pipe closes, or when the service dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import math
import os
import resource
import signal
import sys
import traceback
from typing import Any, Callable, TypeVar

from reward_svc.sandbox.protocol import ChannelClosed, Reader, pack, write_all

_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_MAX_IN_BYTES = 1 << 30
_MAX_ERROR_CHARS = 2000

T = TypeVar("T")


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _limit_memory(mb: int) -> None:
    limit = int(mb) << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _block_network() -> str:
    """Cut the network; return the mechanism used."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET) == 0:
        return "netns"
    blocked = ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo")

    def hook(event: str, args: tuple) -> None:
        if event in blocked:
            raise PermissionError(f"network access is disabled for reward functions ({event})")

    sys.addaudithook(hook)
    return "audit-hook"


def _plain(value: Any) -> Any:
    """JSON fallback for numpy scalars/arrays (duck-typed: no numpy import needed)."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"result value of type {type(value).__name__} is not plain data")


def _error(exc: BaseException) -> dict[str, Any]:
    kind = "memory" if isinstance(exc, MemoryError) else "exception"
    tb = traceback.format_exception_only(type(exc), exc)
    text = "".join(tb).strip()[-_MAX_ERROR_CHARS:]
    return {"ok": False, "kind": kind, "error": text}


def _reply(fd: int, msg: dict[str, Any]) -> None:
    try:
        data = pack(msg)
    except (TypeError, ValueError):
        import json

        try:
            data = pack(json.loads(json.dumps(msg, default=_plain)))
        except (TypeError, ValueError, RecursionError) as exc:
            data = pack({"ok": False, "kind": "invalid", "error": f"result is not JSON-serialisable: {exc}"})
    write_all(fd, data)


def _call_one(fn: Any, kwargs: dict[str, Any], extra_kwargs: dict[str, Any]) -> dict[str, Any]:
    try:
        result = fn(**kwargs, **extra_kwargs)
    except BaseException as exc:  # noqa: BLE001 - anything the user code raises is reported
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            return {"ok": False, "kind": "exception", "error": f"{type(exc).__name__} raised by reward function"}
        return _error(exc)
    if isinstance(result, float) and not math.isfinite(result):
        return {"ok": False, "kind": "invalid", "error": f"score is not finite: {result}"}
    return {"ok": True, "result": result}


def take_protocol_fds() -> tuple[int, int]:
    """Move the protocol pipes (stdin/stdout) to private descriptors, point fd 1 at stderr
    (user ``print`` cannot corrupt the protocol) and fd 0 at /dev/null; arrange to die with
    the parent. Returns ``(fd_in, fd_out)``. Shared by every sandbox worker (also tools')."""
    proto_in = os.dup(0)
    proto_out = os.dup(1)
    os.dup2(2, 1)  # user print() goes to stderr, never into the protocol
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    _die_with_parent()
    return proto_in, proto_out


def harden(memory_limit_mb: int, allow_network: bool) -> str:
    """Apply the sandbox limits to this process: ``RLIMIT_AS``, no core dumps, and the
    network cut unless allowed. Returns the network mode (``allowed``/``netns``/``audit-hook``)."""
    _limit_memory(int(memory_limit_mb))
    return "allowed" if allow_network else _block_network()


def reply(fd: int, msg: dict[str, Any]) -> None:
    """Send one message to the service (numpy values made plain; unencodable -> ``invalid``)."""
    _reply(fd, msg)


def error_reply(exc: BaseException) -> dict[str, Any]:
    """The ``{"ok": false, "kind", "error"}`` answer for an exception raised by user code."""
    return _error(exc)


def start(max_in_bytes: int, setup: Callable[[dict[str, Any]], T]) -> tuple[Reader, int, str, T]:
    """A sandbox worker's start, shared by every kind (also tools'): take the protocol pipes,
    read the ``init`` message, apply the limits (:func:`harden`) and run ``setup(init)`` --
    the user code's import. Returns ``(reader, fd_out, network mode, setup's value)``; the
    caller sends its own ``ready``. Exits the process: 0 when the service closed the pipe
    before ``init``, 1 after replying ``{"op": "fatal", "error"}`` when setup raised."""
    fd_in, fd_out = take_protocol_fds()
    reader = Reader(fd_in, max_in_bytes)
    try:
        init = reader.read(None)
    except ChannelClosed:
        raise SystemExit(0) from None
    try:
        network = harden(int(init["memory_limit_mb"]), bool(init.get("allow_network")))
        value = setup(init)
    except BaseException as exc:  # noqa: BLE001 - anything the user's import raises is reported
        _reply(fd_out, {"op": "fatal", "error": f"{type(exc).__name__}: {exc}"[-_MAX_ERROR_CHARS:]})
        raise SystemExit(1) from None
    return reader, fd_out, network, value


def _load_reward_function(init: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    if init.get("path"):
        from reward_svc.loader import load_function

        fn = load_function(init["path"], init.get("name") or "compute_score")
    else:
        from reward_svc.scorers import default_compute_score as fn
    return fn, dict(init.get("kwargs") or {})


def main() -> int:
    reader, proto_out, network, (fn, extra_kwargs) = start(_MAX_IN_BYTES, _load_reward_function)
    _reply(proto_out, {"op": "ready", "pid": os.getpid(), "network": network})
    while True:
        try:
            msg = reader.read(None)
        except ChannelClosed:
            return 0
        op = msg.get("op")
        if op == "calls":
            for item in msg.get("items", []):
                _reply(proto_out, _call_one(fn, item, extra_kwargs))
        elif op == "batch":
            _reply(proto_out, _call_one(fn, msg.get("args", {}), extra_kwargs))
        else:
            _reply(proto_out, {"ok": False, "kind": "invalid", "error": f"unknown op {op!r}"})


if __name__ == "__main__":
    sys.exit(main())
