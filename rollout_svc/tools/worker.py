"""The tool sandbox worker: one child process hosting one user tool class.

Started by :class:`rollout_svc.tools.sandbox.ToolSandbox` as ``python -m
rollout_svc.tools.worker`` (a fresh interpreter, never a fork of the service), with the
isolation user reward functions get (:mod:`services.sandbox.child`: private protocol pipes,
``RLIMIT_AS``, an empty network namespace unless allowed, dies with its parent, scrubbed
environment). Length-prefixed JSON both ways (:mod:`services.sandbox.protocol`):

1. ``{"op": "init", "class_name", "config", "tool_schema", "memory_limit_mb",
   "allow_network"}`` -> ``{"op": "ready", "pid", "network", "name", "schema", "hooks"}``
   or ``{"op": "fatal", "error"}``; ``hooks`` lists which of ``create`` / ``reward`` /
   ``release`` the class overrides (the service does not send the others);
2. ``{"op": "create"|"execute"|"reward"|"release", "iid", "args", "kwargs"}`` -> one
   ``{"ok": true, "result": ...}`` or ``{"ok": false, "kind", "error"}``, in the order
   the calls came (the service may send several before reading the answers); an
   ``execute`` or ``reward`` for an instance this process does not hold answers
   ``kind: "lost"`` (its worker was replaced: the service re-creates it). A class without
   its own ``create`` holds every instance it is asked about.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import sys
from typing import Any

from services.sandbox.child import error_reply, reply, start
from services.sandbox.protocol import ChannelClosed

_MAX_IN_BYTES = 1 << 26


def load_tool_class(class_name: str):
    """Import ``pkg.mod.Class`` and check it is a :class:`rollout_svc.tools.Tool` subclass."""
    from rollout_svc.tools.base import Tool

    mod_name, _, cls_name = class_name.rpartition(".")
    if not mod_name:
        raise ValueError(f"tool class_name {class_name!r} is not a dotted path (pkg.module.Class)")
    cls = getattr(importlib.import_module(mod_name), cls_name, None)
    if cls is None:
        raise ValueError(f"{cls_name!r} not found in module {mod_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Tool)):
        raise ValueError(f"{class_name!r} is not a subclass of rollout_svc.tools.Tool")
    return cls


def _run(value: Any) -> Any:
    return asyncio.run(value) if inspect.isawaitable(value) else value


def _normalise_execute(result: Any) -> dict[str, Any]:
    if isinstance(result, dict):
        text = result.get("text", "")
        out = {"text": text if isinstance(text, str) else str(text)}
        reward = result.get("reward")
        if reward is not None:
            out["reward"] = float(reward)
        if isinstance(result.get("metrics"), dict):
            out["metrics"] = result["metrics"]
        return out
    if result is None:
        return {"text": ""}
    return {"text": result if isinstance(result, str) else str(result)}


def overridden_hooks(cls: type) -> list[str]:
    """Which optional lifecycle methods ``cls`` defines itself (not the base no-ops)."""
    from rollout_svc.tools.base import Tool

    return [h for h in ("create", "reward", "release") if getattr(cls, h, None) is not getattr(Tool, h)]


def _make_tool(init: dict[str, Any]) -> Any:
    cls = load_tool_class(str(init["class_name"]))
    return cls(config=init.get("config") or {}, schema=init.get("tool_schema") or None)


def main() -> int:
    reader, fd_out, network, tool = start(_MAX_IN_BYTES, _make_tool)
    schema = tool.schema if isinstance(tool.schema, dict) else {}
    name = tool.name
    hooks = overridden_hooks(type(tool))
    tracked = "create" in hooks  # without a create there is no per-instance setup to lose
    reply(fd_out, {"op": "ready", "network": network, "name": name, "schema": schema, "hooks": hooks})
    live: set[str] = set()
    while True:
        try:
            msg = reader.read(None)
        except ChannelClosed:
            return 0
        op, iid = msg.get("op"), str(msg.get("iid", ""))
        kwargs = msg.get("kwargs") or {}
        try:
            if op == "create":
                _run(tool.create(iid, **kwargs))
                live.add(iid)
                out: dict[str, Any] = {"ok": True, "result": None}
            elif op in ("execute", "reward") and tracked and iid not in live:
                out = {"ok": False, "kind": "lost", "error": f"instance {iid} is not held by this worker"}
            elif op == "execute":
                args = msg.get("args")
                out = {"ok": True, "result": _normalise_execute(_run(tool.execute(iid, args, **kwargs)))}
            elif op == "reward":
                value = _run(tool.reward(iid, **kwargs))
                out = {"ok": True, "result": None if value is None else float(value)}
            elif op == "release":
                if iid in live or not tracked:
                    live.discard(iid)
                    _run(tool.release(iid, **kwargs))
                out = {"ok": True, "result": None}
            else:
                out = {"ok": False, "kind": "invalid", "error": f"unknown op {op!r}"}
        except BaseException as exc:  # noqa: BLE001 - user code errors go back as data
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                out = {"ok": False, "kind": "exception", "error": f"{type(exc).__name__} raised by the tool"}
            else:
                out = error_reply(exc)
        reply(fd_out, out)


if __name__ == "__main__":
    sys.exit(main())
