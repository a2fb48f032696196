"""``DataProtoFuture``: a DataProto still being computed by other workers (verl semantics).

It holds ``futures`` (one per worker), a ``collect_fn`` that reduces their results (usually
``DataProto.concat``) and an optional ``dispatch_fn`` that then picks this receiver's part
(e.g. ``lambda x: x.chunk(n)[i]``).  ``get()`` waits for all futures, collects, dispatches.

Supported futures: ``concurrent.futures.Future``, ``asyncio.Future`` (or tasks), Ray
``ObjectRef`` (``ray`` is imported only when such a ref is met), and already-computed
values.  Every wait has a deadline (``timeout`` seconds, default 600).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from services.protocol.dataproto import DataProto
from services.protocol.errors import require

DEFAULT_FUTURE_TIMEOUT_S = 600.0


def _is_ray_ref(obj: Any) -> bool:
    module = type(obj).__module__ or ""
    return module.split(".")[0] == "ray" and "ObjectRef" in type(obj).__name__


def _resolve_asyncio(fut: asyncio.Future, timeout: float | None) -> Any:
    """Block the calling thread on an asyncio future owned by a loop in another thread."""
    if fut.done():
        return fut.result()
    loop = fut.get_loop()
    if loop.is_running():
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        require(running is not loop and getattr(loop, "_thread_id", None) != threading.get_ident(),
                "DataProtoFuture.get() would block the event loop that owns its futures; use `await fut.get_async()`")

        async def wait() -> Any:
            return await fut

        return asyncio.run_coroutine_threadsafe(wait(), loop).result(timeout)
    return loop.run_until_complete(asyncio.wait_for(fut, timeout))


def _resolve_all(futures: list[Any], timeout: float | None) -> list[Any]:
    """Results of ``futures`` in order (each wait bounded by ``timeout``)."""
    refs = [f for f in futures if _is_ray_ref(f)]
    ray_results: dict[int, Any] = {}
    if refs:
        import ray  # optional dependency: only when Ray refs are present

        for ref, value in zip(refs, ray.get(refs, timeout=timeout)):
            ray_results[id(ref)] = value
    out = []
    for f in futures:
        if id(f) in ray_results:
            out.append(ray_results[id(f)])
        elif isinstance(f, concurrent.futures.Future):
            out.append(f.result(timeout=timeout))
        elif isinstance(f, asyncio.Future):
            out.append(_resolve_asyncio(f, timeout))
        else:
            out.append(f)
    return out


@dataclass
class DataProtoFuture:
    """Deferred DataProto: ``dispatch_fn(collect_fn([results of futures]))``.

    Attributes:
        collect_fn: ``list[DataProto] -> DataProto`` (e.g. ``DataProto.concat``).
        futures: one future (or value) per producing worker.
        dispatch_fn: optional ``DataProto -> DataProto`` applied after collecting.
        timeout: seconds each wait may take (None = forever; avoid).
    """

    collect_fn: Callable
    futures: list
    dispatch_fn: Callable | None = None
    timeout: float | None = DEFAULT_FUTURE_TIMEOUT_S

    @staticmethod
    def concat(data: list) -> "DataProtoFuture":
        """A future for ``DataProto.concat`` of the results of ``data`` (a list of futures)."""
        return DataProtoFuture(collect_fn=DataProto.concat, futures=list(data))

    def chunk(self, chunks: int) -> list["DataProtoFuture"]:
        """``chunks`` futures; the i-th resolves to ``self.get().chunk(chunks)[i]``."""
        require(chunks > 0, f"chunks must be positive, got {chunks}")
        return [
            DataProtoFuture(collect_fn=self.collect_fn, futures=self.futures,
                            dispatch_fn=partial(_pick_chunk, i=i, chunks=chunks, first=self.dispatch_fn),
                            timeout=self.timeout)
            for i in range(chunks)
        ]

    def _finish(self, results: list[Any]) -> Any:
        for r in results:
            require(isinstance(r, DataProto), f"a future resolved to {type(r)}, expected a DataProto")
        output = self.collect_fn(results)
        if self.dispatch_fn is not None:
            output = self.dispatch_fn(output)
        return output

    def get(self) -> Any:
        """Wait for every future (each within ``timeout``), collect, then dispatch."""
        return self._finish(_resolve_all(list(self.futures), self.timeout))

    async def get_async(self) -> Any:
        """Awaitable :meth:`get` for code running inside an event loop."""
        results = []
        for f in self.futures:
            if isinstance(f, asyncio.Future):
                results.append(await asyncio.wait_for(asyncio.shield(f), self.timeout))
            elif isinstance(f, concurrent.futures.Future):
                results.append(await asyncio.wait_for(asyncio.wrap_future(f), self.timeout))
            elif _is_ray_ref(f):
                results.append(await asyncio.wait_for(f, self.timeout))  # ObjectRefs are awaitable
            else:
                results.append(f)
        return self._finish(results)


def _pick_chunk(x: DataProto, i: int, chunks: int, first: Callable | None) -> DataProto:
    if first is not None:
        x = first(x)
    return x.chunk(chunks=chunks)[i]
