"""The service side of one tool: a pool of sandboxed worker processes, called from asyncio.

    box = ToolSandbox(spec)            # services.config.agent.ToolSpec
    await box.start()                  # spawns spec.num_workers workers (SandboxStartError on a bad class)
    reply = await box.call("execute", iid, args={"expr": "2+3"}, kwargs={})
    await box.release(iid); await box.close()

Worker processes are :class:`services.sandbox.process.SandboxProcess` running
:mod:`rollout_svc.tools.worker` (same isolation as user reward functions). A tool instance
(one per trajectory) lives in one worker, chosen at its creation (fewest instances).

The pipes are driven by the event loop itself (a reader callback on the worker's output, no
thread per call). Calls to one worker are pipelined: each is written as soon as it is made,
the worker runs them one after the other and answers in order, so a burst of calls (every
trajectory of a batch reaching its tool at the same step) costs one wake-up of the worker
rather than one round trip each. Calls of one instance stay in order. The call at the head
of a worker's queue has ``spec.timeout_s`` from the moment it reached the head.

A call that passes its deadline, a worker that dies, or a reply over
``spec.max_result_bytes`` gets an error :class:`ToolReply`, the worker's process group is
killed and a fresh worker takes its slot; the calls queued behind it are sent again to the
new worker. Instances that lived in the old worker are re-created on their next call (their
state is gone; a tool that must survive this keeps its state outside the process). Nothing
here raises for a call: every failure is a reply with ``ok=False`` and a ``kind``
(exception, memory, timeout, crash, too_large, invalid, lost).

Lifecycle calls a tool class does not override (``create`` / ``reward`` / ``release`` of
:class:`rollout_svc.tools.Tool` do nothing) are not sent: the worker reports which of them
the class defines when it starts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from services.config.agent import ToolSpec
from services.sandbox.confine import Confinement
from services.sandbox.process import SandboxProcess, SandboxStartError
from services.sandbox.protocol import ChannelClosed, ChannelError, ChannelTimeout, Reader, pack

log = logging.getLogger(__name__)

WORKER_MODULE = "rollout_svc.tools.worker"

#: Lifecycle ops a tool class may leave to the base class (then they are not sent).
OPTIONAL_HOOKS = ("create", "reward", "release")


@dataclass
class ToolReply:
    """The outcome of one call. ``result`` is the op's result when ``ok``."""

    ok: bool
    result: Any = None
    error: str = ""
    kind: str = ""
    latency_s: float = 0.0



def tool_confinement(spec: ToolSpec) -> Confinement:
    """What a tool's workers see: the meshrl core and ``rollout_svc`` (the tool base class),
    the tool's own top-level package, read-only, and the job's inputs. The built-in tools
    (``rollout_svc.tools.*``) are trusted code; any other class is user code."""
    top = spec.class_name.split(".", 1)[0]
    builtin = spec.class_name.startswith("rollout_svc.tools.")
    return Confinement(packages=("services", "rollout_svc", top), allow_network=spec.allow_network,
                       user_code=not builtin)


class _Retry:
    """A queued call the worker never answered because it died first: send it again."""


_RETRY = _Retry()


@dataclass
class _Fail:
    """Why the call at the head of a worker's queue got no answer."""

    exc: BaseException


class _Channel:
    """The event-loop side of one worker's pipes (see the module docstring).

    Holds its own duplicates of the pipe ends, non-blocking, so the worker's death shows up
    as end-of-file on the reader callback whoever closed the process's file objects.
    """

    def __init__(self, proc: SandboxProcess, gen: int, timeout_s: float, max_reply_bytes: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.proc = proc
        self.gen = gen
        self.timeout_s = timeout_s
        self.fd_w = os.dup(proc.proc.stdin.fileno())
        self.fd_r = os.dup(proc.proc.stdout.fileno())
        os.set_blocking(self.fd_w, False)
        os.set_blocking(self.fd_r, False)
        self.reader = Reader(self.fd_r, max_reply_bytes)
        self.pending: deque[asyncio.Future] = deque()
        self.wbuf = bytearray()
        self.timer: asyncio.TimerHandle | None = None
        self.dead = False
        self.loop.add_reader(self.fd_r, self._readable)

    def submit(self, data: bytes) -> asyncio.Future:
        """Queue one packed call; the future gets the reply dict, a :class:`_Fail`, or ``_RETRY``."""
        fut = self.loop.create_future()
        if self.dead:
            fut.set_result(_RETRY)
            return fut
        self.pending.append(fut)
        if len(self.pending) == 1:
            self._arm()
        if self.wbuf:
            self.wbuf += data
            return fut
        try:
            n = os.write(self.fd_w, data)
        except BlockingIOError:
            n = 0
        except OSError as exc:  # EPIPE: the worker is gone; this call never reached it
            self.pending.pop()
            fut.set_result(_RETRY)
            self.die(ChannelClosed(f"pipe closed ({exc})"), kill=False)
            return fut
        if n < len(data):
            self.wbuf += data[n:]
            self.loop.add_writer(self.fd_w, self._writable)
        return fut

    def _writable(self) -> None:
        try:
            n = os.write(self.fd_w, self.wbuf)
        except BlockingIOError:
            return
        except OSError as exc:
            self.die(ChannelClosed(f"pipe closed ({exc})"), kill=False)
            return
        del self.wbuf[:n]
        if not self.wbuf:
            self.loop.remove_writer(self.fd_w)

    def _readable(self) -> None:
        try:
            chunk = os.read(self.fd_r, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.die(ChannelClosed("pipe closed"), kill=False)
            return
        msgs, err = self.reader.feed(chunk)
        for msg in msgs:
            if not self.pending:
                self.die(ChannelError("the worker sent a reply nobody asked for"))
                return
            fut = self.pending.popleft()
            if not fut.done():  # a cancelled caller: its answer is dropped
                fut.set_result(msg)
        if err is not None:
            self.die(err)
        elif msgs:
            self._arm()

    def _arm(self) -> None:
        """Give the call now at the head of the queue its deadline."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.pending:
            self.timer = self.loop.call_later(self.timeout_s, self._expired)

    def _expired(self) -> None:
        self.timer = None
        self.die(ChannelTimeout("no reply before the deadline"))

    def die(self, exc: BaseException, *, kill: bool = True, retry_all: bool = False) -> None:
        """Stop using this worker: the head call fails with ``exc`` (unless ``retry_all``:
        the worker goes for another reason), the others are sent again. ``kill``: SIGKILL its
        process group now (a worker that died by itself is left to be reaped, so its exit
        status is its own)."""
        if self.dead:
            return
        self.dead = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.loop.remove_reader(self.fd_r)
        if self.wbuf:
            self.loop.remove_writer(self.fd_w)
        for fd in (self.fd_r, self.fd_w):
            try:
                os.close(fd)
            except OSError:
                pass
        if kill:
            self.proc.signal_kill()  # under bubblewrap: the worker's whole pid namespace
        first = not retry_all
        while self.pending:
            fut = self.pending.popleft()
            if not fut.done():
                fut.set_result(_Fail(exc) if first else _RETRY)
            first = False


@dataclass
class _Slot:
    proc: SandboxProcess | None
    chan: _Channel | None = None
    spawn_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    gen: int = 0  # bumped each time the process is replaced
    instances: int = 0


@dataclass
class _Instance:
    slot: int
    gen: int = -1  # slot generation the instance was created in (-1: not created yet)
    create_kwargs: dict[str, Any] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one call of an instance at a time


class ToolSandbox:
    """One tool's sandboxed workers (see the module docstring)."""

    def __init__(self, spec: ToolSpec) -> None:
        self.spec = spec
        self.name = ""
        self.schema: dict[str, Any] = {}
        self.network = "?"
        self.hooks: frozenset[str] = frozenset(OPTIONAL_HOOKS)
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
                              loading="the tool class", confinement=tool_confinement(self.spec))

    def _channel(self, proc: SandboxProcess, gen: int) -> _Channel:
        return _Channel(proc, gen, self.spec.timeout_s, self.spec.max_result_bytes)

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
        self._slots = [_Slot(proc=p, chan=self._channel(p, 0)) for p in procs]
        ready = procs[0].ready
        self.name = str(ready.get("name") or "")
        self.schema = ready.get("schema") if isinstance(ready.get("schema"), dict) else {}
        self.network = procs[0].network
        hooks = ready.get("hooks")
        if isinstance(hooks, list):
            self.hooks = frozenset(h for h in hooks if h in OPTIONAL_HOOKS)
        return self

    # -- workers ---------------------------------------------------------------------------

    def _respawn(self, old: SandboxProcess | None) -> SandboxProcess | None:
        """Reap ``old`` and start a new worker (runs in an executor thread)."""
        if old is not None:
            old.kill()
        if self._closed:
            return None
        try:
            return self._spawn()
        except SandboxStartError as exc:
            log.error("tool %s: replacing a worker failed: %s", self.spec.class_name, exc)
            return None

    async def _replace(self, slot: _Slot, chan: _Channel | None) -> None:
        """Replace the slot's worker if it is still the one behind ``chan``."""
        async with slot.spawn_lock:
            if slot.chan is not chan:
                return  # another call replaced it already
            if chan is not None:
                chan.die(ChannelClosed("worker replaced"), retry_all=True)
            old, slot.proc, slot.chan = slot.proc, None, None
            slot.gen += 1
            self.restarts += 1
            new = await asyncio.get_running_loop().run_in_executor(self._exec, self._respawn, old)
            if new is not None and self._closed:
                new.kill()
                new = None
            if new is not None:
                slot.proc, slot.chan = new, self._channel(new, slot.gen)

    async def _live(self, slot: _Slot) -> _Channel | None:
        """The slot's channel, after replacing a worker that died (None: cannot start one)."""
        chan = slot.chan
        if chan is not None and not chan.dead and chan.proc.proc.poll() is not None:
            chan.die(ChannelClosed("worker exited"), kill=False)  # died between calls
        if chan is None or chan.dead:
            await self._replace(slot, chan)
            chan = slot.chan
        return chan

    def _failure(self, exc: BaseException, op: str, proc: SandboxProcess | None) -> ToolReply:
        if isinstance(exc, ChannelTimeout):
            return ToolReply(False, error=f"tool call ({op}) exceeded its {self.spec.timeout_s:g}s deadline", kind="timeout")
        if isinstance(exc, ChannelError):
            if "exceeds the limit" in str(exc):
                return ToolReply(False, error=f"tool reply is larger than {self.spec.max_result_bytes} bytes", kind="too_large")
            return ToolReply(False, error=f"bad reply from the tool: {exc}", kind="invalid")
        code = proc.proc.poll() if proc is not None else None
        detail = proc.exit_detail(code) if proc is not None else f"exit code {code}"
        return ToolReply(False, error=f"tool worker died during {op} ({detail})", kind="crash")

    async def _send(self, slot: _Slot, chan: _Channel, op: str, data: bytes) -> ToolReply | None:
        """One call on ``chan``; None when the worker died before reaching it (send again)."""
        t0 = time.perf_counter()
        got = await chan.submit(data)
        if got is _RETRY:
            return None
        if self._closed:
            return ToolReply(False, error="tool sandbox is closed", kind="crash", latency_s=time.perf_counter() - t0)
        if isinstance(got, _Fail):
            await self._replace(slot, chan)  # reaps the old process first: its exit status is known
            out = self._failure(got.exc, op, chan.proc)
            out.latency_s = time.perf_counter() - t0
            return out
        dt = time.perf_counter() - t0
        if got.get("ok") is True:
            return ToolReply(True, result=got.get("result"), latency_s=dt)
        kind = str(got.get("kind") or "exception")
        out = ToolReply(False, error=str(got.get("error", "unknown error"))[:2000], kind=kind, latency_s=dt)
        if kind == "memory":
            await self._replace(slot, chan)
        return out

    # -- calls -----------------------------------------------------------------------------

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
        if op in OPTIONAL_HOOKS and op not in self.hooks:
            return ToolReply(True)  # the base class's no-op: nothing to ask the worker
        try:
            data = pack({"op": op, "iid": iid, "args": args, "kwargs": kwargs or {}})
            create = pack({"op": "create", "iid": iid, "kwargs": inst.create_kwargs})
        except (TypeError, ValueError) as exc:
            return ToolReply(False, error=f"arguments are not JSON: {exc}", kind="invalid")
        got: ToolReply | None = None
        async with inst.lock:
            for _attempt in range(3):
                if self._closed:
                    return ToolReply(False, error="tool sandbox is closed", kind="crash")
                slot = self._slots[inst.slot]
                chan = await self._live(slot)
                if chan is None:
                    return ToolReply(False, error="tool worker could not be (re)started", kind="crash")
                if inst.gen != chan.gen:
                    if inst.gen != -1 and op == "reward":
                        return ToolReply(False, error="tool state was lost (its worker was replaced)", kind="lost")
                    if "create" in self.hooks:
                        created = await self._send(slot, chan, "create", create)
                        if created is None:
                            continue
                        if not created.ok:
                            return created
                    inst.gen = chan.gen
                got = await self._send(slot, chan, op, data)
                if got is None:
                    continue
                if got.ok or got.kind != "lost":
                    return got
                inst.gen = -1  # the worker does not hold it: create again
        return got or ToolReply(False, error="tool worker died before it could take the call", kind="crash")

    async def release(self, iid: str, kwargs: dict[str, Any] | None = None) -> ToolReply:
        """Release ``iid`` in its worker (if it was created there) and forget it."""
        inst = self._instances.pop(iid, None)
        if inst is None:
            return ToolReply(True)
        slot = self._slots[inst.slot]
        slot.instances -= 1
        if "release" not in self.hooks or self._closed:
            return ToolReply(True)
        try:
            data = pack({"op": "release", "iid": iid, "kwargs": kwargs or {}})
        except (TypeError, ValueError) as exc:
            return ToolReply(False, error=f"arguments are not JSON: {exc}", kind="invalid")
        async with inst.lock:
            chan = slot.chan
            if chan is None or chan.dead or inst.gen != chan.gen:
                return ToolReply(True)  # not held by the live worker: nothing to release
            got = await self._send(slot, chan, "release", data)
            return got if got is not None else ToolReply(True)

    async def close(self) -> None:
        self._closed = True
        for slot in self._slots:
            if slot.chan is not None:
                slot.chan.die(ChannelClosed("tool sandbox closed"), retry_all=True)
                slot.chan = None
            if slot.proc is not None:
                slot.proc.kill()
                slot.proc = None
        self._exec.shutdown(wait=False, cancel_futures=True)


class InProcessTool:
    """A trusted tool called inside the replica process (``ToolSpec.sandbox: false``).

    Same interface as :class:`ToolSandbox`. Each call runs synchronously on the event loop:
    no process, pipe or thread on the way, but also no isolation and no deadline, so only
    for trusted tools that answer at once. What it raises, or a reply over
    ``max_result_bytes``, is still an error reply.
    """

    def __init__(self, spec: ToolSpec) -> None:
        self.spec = spec
        self.name = ""
        self.schema: dict[str, Any] = {}
        self.network = "in-process"
        self.hooks: frozenset[str] = frozenset(OPTIONAL_HOOKS)
        self.restarts = 0
        self._tool: Any = None
        self._live: set[str] = set()
        self._create_kwargs: dict[str, dict[str, Any]] = {}

    async def start(self) -> "InProcessTool":
        from rollout_svc.tools.worker import load_tool_class, overridden_hooks

        try:
            cls = load_tool_class(self.spec.class_name)
            self._tool = cls(config=dict(self.spec.config), schema=self.spec.tool_schema or None)
        except Exception as exc:  # noqa: BLE001 - a bad class fails the start, as in the sandbox
            raise SandboxStartError(f"tool {self.spec.class_name} failed to load the tool class: "
                                    f"{type(exc).__name__}: {exc}") from None
        self.name = self._tool.name
        self.schema = self._tool.schema if isinstance(self._tool.schema, dict) else {}
        self.hooks = frozenset(overridden_hooks(cls))
        return self

    def open(self, iid: str, create_kwargs: dict[str, Any] | None = None) -> None:
        self._create_kwargs.setdefault(iid, dict(create_kwargs or {}))

    def _run(self, fn, *args: Any, **kwargs: Any) -> ToolReply:
        t0 = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the tool's errors are observations
            return ToolReply(False, error=f"{type(exc).__name__}: {exc}"[:2000], kind="exception",
                             latency_s=time.perf_counter() - t0)
        return ToolReply(True, result=result, latency_s=time.perf_counter() - t0)

    async def call(self, op: str, iid: str, *, args: Any = None, kwargs: dict[str, Any] | None = None) -> ToolReply:
        from rollout_svc.tools.worker import _normalise_execute

        if self._tool is None:
            return ToolReply(False, error="tool is closed", kind="crash")
        if op in OPTIONAL_HOOKS and op not in self.hooks:
            return ToolReply(True)
        kw = dict(kwargs or {})
        if iid not in self._live:
            if op == "reward":
                return ToolReply(True)  # never created: nothing to reward
            if "create" in self.hooks:
                created = self._run(self._tool.create, iid, **self._create_kwargs.get(iid, {}))
                if not created.ok:
                    return created
            self._live.add(iid)
        if op == "execute":
            rep = self._run(self._tool.execute, iid, args, **kw)
            if rep.ok:
                rep.result = _normalise_execute(rep.result)
                if len(rep.result.get("text", "").encode()) > self.spec.max_result_bytes:
                    return ToolReply(False, error=f"tool reply is larger than {self.spec.max_result_bytes} bytes",
                                     kind="too_large", latency_s=rep.latency_s)
            return rep
        if op == "reward":
            rep = self._run(self._tool.reward, iid, **kw)
            if rep.ok and rep.result is not None:
                rep.result = float(rep.result)
            return rep
        return ToolReply(False, error=f"unknown op {op!r}", kind="invalid")

    async def release(self, iid: str, kwargs: dict[str, Any] | None = None) -> ToolReply:
        self._create_kwargs.pop(iid, None)
        if iid not in self._live:
            return ToolReply(True)
        self._live.discard(iid)
        if "release" not in self.hooks or self._tool is None:
            return ToolReply(True)
        return self._run(self._tool.release, iid, **dict(kwargs or {}))

    async def close(self) -> None:
        self._tool = None
