"""The reward service's side of the sandbox: a pool of reward-function workers with deadlines.

    pool = SandboxPool(SandboxSpec(path="my_reward.py", name="compute_score", num_workers=2))
    pool.start()
    results = pool.score([{"data_source": ..., "solution_str": ..., "ground_truth": ..., "extra_info": ...}])
    pool.close()

``score`` sends the samples in chunks to idle workers; each worker answers item by item.
When an item's answer does not arrive within ``call_timeout_s`` (a hang), or the worker's
pipe closes (it was killed, or blew its memory limit), or it answers garbage, that item
gets a :class:`CallResult` with score 0.0 and the error; the worker's process group is
killed, a fresh worker is started, and the chunk's remaining items go back to the queue.
No item is lost and none waits longer than its own deadline plus one worker restart.
Every result is validated here: scores must be finite numbers, dict extras plain scalars.
Each worker is a :class:`services.sandbox.process.SandboxProcess` (the isolation shared
with the rollout's tools) running :mod:`reward_svc.sandbox.worker`.
"""

from __future__ import annotations

import math
import os
import queue
import subprocess
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from services.sandbox.confine import Confinement
from services.sandbox.process import SandboxProcess, SandboxStartError
from services.sandbox.protocol import ChannelClosed, ChannelError, ChannelTimeout, pack

ErrorKind = Literal["exception", "timeout", "crash", "memory", "invalid"]


@dataclass
class SandboxSpec:
    """What the workers run and under which limits (mirrors :class:`RewardConfig`)."""

    path: str | None = None  # None: the built-in default_compute_score
    name: str = "compute_score"
    kwargs: dict[str, Any] = field(default_factory=dict)
    num_workers: int = 2
    call_timeout_s: float = 10.0
    batch_timeout_s: float = 120.0
    memory_limit_mb: int = 2048
    allow_network: bool = False
    max_result_bytes: int = 65_536
    max_extra_columns: int = 32
    start_timeout_s: float = 30.0
    chunk_size: int = 64


@dataclass
class CallResult:
    """The outcome of one sample: ``score`` (0.0 on error), dict ``extra`` columns, error text/kind."""

    score: float
    extra: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    kind: ErrorKind | None = None


_SCALARS = (str, int, float, bool, type(None))


def validate_result(value: Any, max_extra: int) -> CallResult:
    """Turn a scorer's return value (float or dict with "score") into a :class:`CallResult`."""
    if isinstance(value, bool) or not isinstance(value, (int, float, dict)):
        return CallResult(0.0, error=f"reward function returned {type(value).__name__}, want float or dict", kind="invalid")
    if isinstance(value, dict):
        if "score" not in value:
            return CallResult(0.0, error="reward dict has no 'score' key", kind="invalid")
        score = value["score"]
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            return CallResult(0.0, error=f"'score' is {type(score).__name__}, want a number", kind="invalid")
        extra = {k: v for k, v in value.items()}
        if len(extra) > max_extra + 1:
            return CallResult(0.0, error=f"reward dict has {len(extra)} keys, limit {max_extra + 1}", kind="invalid")
        for k, v in extra.items():
            if not isinstance(k, str) or not isinstance(v, _SCALARS):
                return CallResult(0.0, error=f"reward dict value {k!r} is not a plain scalar", kind="invalid")
    else:
        score, extra = value, {}
    score = float(score)
    if not math.isfinite(score):
        return CallResult(0.0, error=f"score is not finite: {score}", kind="invalid")
    return CallResult(score, extra=extra)


def reward_confinement(spec: SandboxSpec) -> Confinement:
    """What a reward worker sees: the meshrl core and ``reward_svc``, the function's file (or
    its module's top-level package), read-only, and the job's inputs. Without a user
    function (``isolate_builtin``) it runs trusted code only."""
    packages = ["services", "reward_svc"]
    inputs: list[str] = []
    if spec.path:
        if spec.path.endswith(".py") or os.path.isfile(spec.path):
            inputs.append(os.path.abspath(spec.path))
        else:
            packages.append(spec.path.split(".", 1)[0])
    return Confinement(packages=tuple(packages), inputs=tuple(inputs), allow_network=spec.allow_network,
                       user_code=bool(spec.path))


class _Worker(SandboxProcess):
    """One reward worker process."""

    def __init__(self, spec: SandboxSpec) -> None:
        path = spec.path
        if path and (path.endswith(".py") or os.path.isfile(path)):
            path = os.path.abspath(path)  # the worker's working directory is its scratch
        init = {
            "op": "init",
            "path": path,
            "name": spec.name,
            "kwargs": spec.kwargs,
            "memory_limit_mb": spec.memory_limit_mb,
            "allow_network": spec.allow_network,
        }
        super().__init__("reward_svc.sandbox.worker", init, max_reply_bytes=spec.max_result_bytes,
                         start_timeout_s=spec.start_timeout_s, what="reward worker", loading="the function",
                         confinement=reward_confinement(spec))


def _failure(exc: BaseException, what: str, worker: SandboxProcess | None) -> CallResult:
    if isinstance(exc, ChannelTimeout):
        return CallResult(0.0, error=f"{what} exceeded its deadline", kind="timeout")
    if isinstance(exc, (ChannelClosed, BrokenPipeError)):
        try:
            code = worker.proc.wait(timeout=2) if worker is not None else None
        except subprocess.TimeoutExpired:
            code = None
        detail = worker.exit_detail(code) if worker is not None else f"exit code {code}"
        return CallResult(0.0, error=f"reward worker died during {what} ({detail})", kind="crash")
    return CallResult(0.0, error=f"bad reply during {what}: {exc}", kind="invalid")


class SandboxPool:
    """A fixed-size pool of sandboxed workers; thread-safe ``score`` / ``score_batch``."""

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        self._idle: queue.Queue[_Worker | None] = queue.Queue()
        self._exec = ThreadPoolExecutor(max_workers=spec.num_workers, thread_name_prefix="reward-sandbox")
        self._lock = threading.Lock()
        self.restarts = 0
        self.network = "?"
        self._closed = False

    def start(self) -> "SandboxPool":
        """Start every worker (in parallel); raise :class:`SandboxStartError` if one cannot."""
        futures = [self._exec.submit(_Worker, self.spec) for _ in range(self.spec.num_workers)]
        workers, error = [], None
        for f in futures:
            try:
                workers.append(f.result())
            except SandboxStartError as exc:
                error = exc
        if error is not None:
            for w in workers:
                w.kill()
            raise error
        self.network = workers[0].network
        for w in workers:
            self._idle.put(w)
        return self

    # -- worker checkout -------------------------------------------------------------------

    def _acquire(self) -> _Worker | None:
        worker = self._idle.get()
        if worker is None or worker.proc.poll() is not None:
            worker = self._respawn(worker)
        return worker

    def _respawn(self, old: _Worker | None) -> _Worker | None:
        if old is not None:
            old.kill()
        with self._lock:
            self.restarts += 1
        try:
            return _Worker(self.spec)
        except SandboxStartError:
            return None

    def _release(self, worker: _Worker | None) -> None:
        self._idle.put(worker)

    # -- per-sample calls ------------------------------------------------------------------

    def score(self, items: list[dict[str, Any]]) -> list[CallResult]:
        """Score ``items`` (each the kwargs of one per-sample call); one result per item, in order."""
        if self._closed:
            raise RuntimeError("SandboxPool is closed")
        results: list[CallResult | None] = [None] * len(items)
        if not items:
            return []
        n_chunks = max(1, min(self.spec.num_workers, math.ceil(len(items) / self.spec.chunk_size)))
        size = math.ceil(len(items) / n_chunks)
        todo: deque[list[int]] = deque(list(range(i, min(i + size, len(items)))) for i in range(0, len(items), size))
        todo_lock = threading.Lock()

        def run() -> None:
            worker = self._acquire()
            try:
                while True:
                    with todo_lock:
                        if not todo:
                            return
                        idxs = todo.popleft()
                    if worker is None:
                        worker = self._respawn(None)
                    if worker is None:
                        for i in idxs:
                            results[i] = CallResult(0.0, error="reward worker could not be (re)started", kind="crash")
                        continue
                    rest = self._run_chunk(worker, idxs, items, results)
                    if rest is not None:  # the worker failed on one item: replace it, requeue the rest
                        worker = self._respawn(worker)
                        if rest:
                            with todo_lock:
                                todo.appendleft(rest)
            finally:
                self._release(worker)

        futures = [self._exec.submit(run) for _ in range(min(self.spec.num_workers, len(todo)))]
        for f in futures:
            f.result()
        return [r if r is not None else CallResult(0.0, error="not scored", kind="crash") for r in results]

    def _run_chunk(
        self, worker: _Worker, idxs: list[int], items: list[dict[str, Any]], results: list[CallResult | None]
    ) -> list[int] | None:
        """Run one chunk; return None if the worker is still healthy, else the unstarted indices."""
        try:
            worker.send({"op": "calls", "items": [items[i] for i in idxs]})
        except (OSError, ValueError, TypeError) as exc:
            if isinstance(exc, (TypeError, ValueError)):  # an item is not JSON: fail items one by one
                return self._run_singly(worker, idxs, items, results)
            results[idxs[0]] = _failure(ChannelClosed(), "a reward call", worker)
            return idxs[1:]
        for pos, i in enumerate(idxs):
            try:
                msg = worker.reader.read(time.monotonic() + self.spec.call_timeout_s)
            except (ChannelTimeout, ChannelClosed, ChannelError, OSError) as exc:
                results[i] = _failure(exc, "a reward call", worker if not isinstance(exc, ChannelTimeout) else None)
                return idxs[pos + 1 :]
            results[i] = self._from_reply(msg)
            if results[i].kind == "memory":  # a worker that ran out of memory is replaced
                return idxs[pos + 1 :]
        return None

    def _run_singly(
        self, worker: _Worker, idxs: list[int], items: list[dict[str, Any]], results: list[CallResult | None]
    ) -> list[int] | None:
        for pos, i in enumerate(idxs):
            try:
                pack({"op": "calls", "items": [items[i]]})
            except (TypeError, ValueError) as exc:
                results[i] = CallResult(0.0, error=f"sample is not JSON-serialisable: {exc}", kind="invalid")
                continue
            rest = self._run_chunk(worker, [i], items, results)
            if rest is not None:
                return idxs[pos + 1 :]
        return None

    def _from_reply(self, msg: dict[str, Any]) -> CallResult:
        if msg.get("ok") is True:
            return validate_result(msg.get("result"), self.spec.max_extra_columns)
        kind = msg.get("kind") if msg.get("kind") in ("exception", "memory", "invalid") else "exception"
        return CallResult(0.0, error=str(msg.get("error", "unknown error"))[:2000], kind=kind)

    # -- batch calls -----------------------------------------------------------------------

    def score_batch(self, args: dict[str, list[Any]], n: int) -> list[CallResult]:
        """One batch-scorer call for ``n`` samples (``args``: data_sources, solution_strs, ...)."""
        worker = self._acquire()
        healthy = False
        try:
            if worker is None:
                return [CallResult(0.0, error="reward worker could not be (re)started", kind="crash")] * n
            try:
                worker.send({"op": "batch", "args": args})
                msg = worker.reader.read(time.monotonic() + self.spec.batch_timeout_s)
            except (TypeError, ValueError) as exc:
                healthy = True
                return [CallResult(0.0, error=f"batch is not JSON-serialisable: {exc}", kind="invalid")] * n
            except (ChannelTimeout, ChannelClosed, ChannelError, OSError) as exc:
                res = _failure(exc, "a batch reward call", worker if not isinstance(exc, ChannelTimeout) else None)
                return [res] * n
            if msg.get("ok") is not True:
                res = self._from_reply(msg)
                healthy = res.kind != "memory"
                return [res] * n
            healthy = True
            value = msg.get("result")
            if not isinstance(value, list) or len(value) != n:
                got = len(value) if isinstance(value, list) else type(value).__name__
                return [CallResult(0.0, error=f"batch scorer returned {got}, want a list of {n}", kind="invalid")] * n
            return [validate_result(v, self.spec.max_extra_columns) for v in value]
        finally:
            if worker is not None and not healthy:
                worker = self._respawn(worker)
            self._release(worker)

    def close(self) -> None:
        """Kill every worker and stop the threads."""
        self._closed = True
        self._exec.shutdown(wait=True)
        while True:
            try:
                w = self._idle.get_nowait()
            except queue.Empty:
                break
            if w is not None:
                w.kill()
