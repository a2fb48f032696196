"""The sandbox worker: one child process that runs a user reward function.

Started by :class:`reward_svc.sandbox.pool.SandboxPool` as
``python -m reward_svc.sandbox.worker`` (a fresh interpreter: exec'd, never a fork of the
threaded service). Protocol (:mod:`services.sandbox.protocol`) over its stdin/stdout,
which the worker moves to private descriptors at once so user ``print`` output goes to
stderr instead (:func:`services.sandbox.child.start`, shared with the tools' workers):

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

import math
import os
import sys
from typing import Any

from services.sandbox.child import error_reply, reply, start
from services.sandbox.protocol import ChannelClosed

_MAX_IN_BYTES = 1 << 30


def _call_one(fn: Any, kwargs: dict[str, Any], extra_kwargs: dict[str, Any]) -> dict[str, Any]:
    try:
        result = fn(**kwargs, **extra_kwargs)
    except BaseException as exc:  # noqa: BLE001 - anything the user code raises is reported
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            return {"ok": False, "kind": "exception", "error": f"{type(exc).__name__} raised by reward function"}
        return error_reply(exc)
    if isinstance(result, float) and not math.isfinite(result):
        return {"ok": False, "kind": "invalid", "error": f"score is not finite: {result}"}
    return {"ok": True, "result": result}


def _load_reward_function(init: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    if init.get("path"):
        from reward_svc.loader import load_function

        fn = load_function(init["path"], init.get("name") or "compute_score")
    else:
        from reward_svc.scorers import default_compute_score as fn
    return fn, dict(init.get("kwargs") or {})


def main() -> int:
    reader, proto_out, network, (fn, extra_kwargs) = start(_MAX_IN_BYTES, _load_reward_function)
    reply(proto_out, {"op": "ready", "pid": os.getpid(), "network": network})
    while True:
        try:
            msg = reader.read(None)
        except ChannelClosed:
            return 0
        op = msg.get("op")
        if op == "calls":
            for item in msg.get("items", []):
                reply(proto_out, _call_one(fn, item, extra_kwargs))
        elif op == "batch":
            reply(proto_out, _call_one(fn, msg.get("args", {}), extra_kwargs))
        else:
            reply(proto_out, {"ok": False, "kind": "invalid", "error": f"unknown op {op!r}"})


if __name__ == "__main__":
    sys.exit(main())
