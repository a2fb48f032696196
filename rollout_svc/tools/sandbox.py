"""The service side of one tool: a pool of sandboxed worker processes, called from asyncio.

    box = ToolSandbox(spec)            # services.config.agent.ToolSpec
    await box.start()                  # spawns spec.num_workers workers (SandboxStartError on a bad class)
    reply = await box.call("execute", iid, args={"expr": "2+3"}, kwargs={})
    await box.release(iid); await box.close()

Worker processes are :class:`reward_svc.sandbox.pool.SandboxProcess` running
:mod:`rollout_svc.tools.worker` (same isolation as user reward functions). A tool instance
(one per trajectory) lives in one worker, chosen at its creation (fewest instances); calls to
one worker are serialised. Every call has ``spec.timeout_s``: a call that passes it, a worker
that dies, or a reply over ``spec.max_result_bytes`` gets an error :class:`ToolReply`, the
worker's process group is killed and a fresh worker takes its slot. Instances that lived in
the old worker are re-created on their next call (their state is gone; a tool that must
survive this keeps its state outside the process). Nothing here raises for a call: every
failure is a reply with ``ok=False`` and a ``kind`` (exception, memory, timeout, crash,
too_large, invalid, lost).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from reward_svc.sandbox.pool import SandboxProcess, SandboxStartError
from reward_svc.sandbox.protocol import ChannelClosed, ChannelError, ChannelTimeout
from services.config.agent import ToolSpec

log = logging.getLogger(__name__)

WORKER_MODULE = "rollout_svc.tools.worker"


@dataclass
class ToolReply:
    """The outcome of one call. ``result`` is the op's result when ``ok``."""

    ok: bool
    result: Any = None
    error: str = ""
    kind: str = ""
    latency_s: float = 0.0


@dataclass
class _Slot:
    proc: SandboxProcess | None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    gen: int = 0  # bumped each time the process is replaced
    instances: int = 0


@dataclass
class _Instance:
    slot: int
    gen: int = -1  # slot generation the instance was created in (-1: not created yet)
    create_kwargs: dict[str, Any] = field(default_factory=dict)


class ToolSandbox:
    """One tool's sandboxed workers (see the module docstring)."""

    def __init__(self, spec: ToolSpec) -> None:
        self.spec = spec
        self.name = ""
        self.schema: dict[str, Any] = {}
        self.network = "?"
        self.restarts = 0
        self._slots: list[_Slot] = []
        self._instances: dict[str, _Instance] = {}
        self._exec = ThreadPoolExecutor(max_workers=spec.num_workers + 1, thread_name_prefix="tool-sandbox")
        self._closed = False

    def _init_msg(self) -> dict[str, Any]:
        s = self.spec
        return {"op": "init", "class_name": s.class_name, "config": s.config, "tool_schema": s.tool_schema,
                "memory_limit_mb": s.memory_limit_mb, "allow_network": s.allow_network}

    def _spawn(self) -> SandboxProcess:
        return SandboxProcess(WORKER_MODULE, self._init_msg(), max_reply_bytes=self.spec.max_result_bytes,
                              start_timeout_s=self.spec.start_timeout_s, what=f"tool {self.spec.class_name}",
                              loading="the tool class")

    async def start(self) -> "ToolSandbox":
        """Start every worker; raises :class:`SandboxStartError` naming the problem."""
        loop = asyncio.get_running_loop()
        results = await asyncio.gather(
            *(loop.run_in_executor(self._exec, self._spawn) for _ in range(self.spec.num_workers)),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        procs = [r for r in results if not isinstance(r, BaseException)]
        if errors:
            for p in procs:
                p.kill()
            err = errors[0]
            raise err if isinstance(err, SandboxStartError) else SandboxStartError(str(err))
        self._slots = [_Slot(proc=p) for p in procs]
        ready = procs[0].ready
        self.name = str(ready.get("name") or "")
        self.schema = ready.get("schema") if isinstance(ready.get("schema"), dict) else {}
        self.network = procs[0].network
        return self

    # -- calls -----------------------------------------------------------------------------

    def _roundtrip(self, proc: SandboxProcess, msg: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        proc.send(msg)
        return proc.reader.read(time.monotonic() + timeout_s)

    def _replace(self, slot: _Slot) -> None:
        """Kill the slot's worker and start a new one (runs in a worker thread)."""
        if slot.proc is not None:
            slot.proc.kill()
        slot.proc = None
        slot.gen += 1
        self.restarts += 1
        if self._closed:
            return
        try:
            slot.proc = self._spawn()
        except SandboxStartError as exc:
            log.error("tool %s: replacing a worker failed: %s", self.spec.class_name, exc)

    def _failure(self, exc: BaseException, op: str, proc: SandboxProcess | None) -> ToolReply:
        if isinstance(exc, ChannelTimeout):
            return ToolReply(False, error=f"tool call ({op}) exceeded its {self.spec.timeout_s:g}s deadline", kind="timeout")
        if isinstance(exc, ChannelError):
            if "exceeds the limit" in str(exc):
                return ToolReply(False, error=f"tool reply is larger than {self.spec.max_result_bytes} bytes", kind="too_large")
            return ToolReply(False, error=f"bad reply from the tool: {exc}", kind="invalid")
        code = proc.proc.poll() if proc is not None else None
        detail = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return ToolReply(False, error=f"tool worker died during {op} ({detail})", kind="crash")

    async def _send(self, slot: _Slot, msg: dict[str, Any]) -> ToolReply:
        """One round trip on ``slot`` (its lock held by the caller)."""
        loop = asyncio.get_running_loop()
        proc = slot.proc
        if proc is None or proc.proc.poll() is not None:
            await loop.run_in_executor(self._exec, self._replace, slot)
            proc = slot.proc
            if proc is None:
                return ToolReply(False, error="tool worker could not be (re)started", kind="crash")
        t0 = time.perf_counter()
        try:
            reply = await loop.run_in_executor(self._exec, self._roundtrip, proc, msg, self.spec.timeout_s)
        except asyncio.CancelledError:
            proc.kill()  # the thread's read ends at once; the slot is replaced on its next use
            raise
        except (ChannelTimeout, ChannelClosed, ChannelError, OSError, ValueError, TypeError) as exc:
            if isinstance(exc, (TypeError, ValueError)) and not isinstance(exc, ChannelError):
                return ToolReply(False, error=f"arguments are not JSON: {exc}", kind="invalid",
                                 latency_s=time.perf_counter() - t0)
            out = self._failure(exc, str(msg.get("op")), proc)
            await loop.run_in_executor(self._exec, self._replace, slot)
            out.latency_s = time.perf_counter() - t0
            return out
        dt = time.perf_counter() - t0
        if reply.get("ok") is True:
            return ToolReply(True, result=reply.get("result"), latency_s=dt)
        kind = str(reply.get("kind") or "exception")
        out = ToolReply(False, error=str(reply.get("error", "unknown error"))[:2000], kind=kind, latency_s=dt)
        if kind == "memory":
            await loop.run_in_executor(self._exec, self._replace, slot)
        return out

    def open(self, iid: str, create_kwargs: dict[str, Any] | None = None) -> None:
        """Register a trajectory's instance (created in its worker on first use)."""
        if iid in self._instances:
            return
        idx = min(range(len(self._slots)), key=lambda i: self._slots[i].instances)
        self._slots[idx].instances += 1
        self._instances[iid] = _Instance(slot=idx, create_kwargs=dict(create_kwargs or {}))

    async def call(self, op: str, iid: str, *, args: Any = None, kwargs: dict[str, Any] | None = None) -> ToolReply:
        """``op`` in execute / reward for instance ``iid`` (opened before); creates it first if needed."""
        if self._closed:
            return ToolReply(False, error="tool sandbox is closed", kind="crash")
        inst = self._instances.get(iid)
        if inst is None:
            self.open(iid)
            inst = self._instances[iid]
        slot = self._slots[inst.slot]
        async with slot.lock:
            for _attempt in range(2):
                if inst.gen != slot.gen:
                    if inst.gen != -1 and op == "reward":
                        return ToolReply(False, error="tool state was lost (its worker was replaced)", kind="lost")
                    created = await self._send(slot, {"op": "create", "iid": iid, "kwargs": inst.create_kwargs})
                    if not created.ok:
                        return created
                    inst.gen = slot.gen
                got = await self._send(slot, {"op": op, "iid": iid, "args": args, "kwargs": kwargs or {}})
                if got.ok or got.kind != "lost":
                    return got
                inst.gen = -1  # the worker does not hold it: create again, once
            return got

    async def release(self, iid: str, kwargs: dict[str, Any] | None = None) -> ToolReply:
        """Release ``iid`` in its worker (if it was created there) and forget it."""
        inst = self._instances.pop(iid, None)
        if inst is None:
            return ToolReply(True)
        slot = self._slots[inst.slot]
        slot.instances -= 1
        if inst.gen != slot.gen or self._closed:
            return ToolReply(True)
        async with slot.lock:
            if inst.gen != slot.gen:
                return ToolReply(True)
            return await self._send(slot, {"op": "release", "iid": iid, "kwargs": kwargs or {}})

    async def close(self) -> None:
        self._closed = True
        for slot in self._slots:
            if slot.proc is not None:
                slot.proc.kill()
                slot.proc = None
        self._exec.shutdown(wait=False, cancel_futures=True)
