"""DataProtoFuture over concurrent.futures and asyncio futures (Ray is not installed here)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest
import torch

from services.protocol import DataProto, DataProtoError, DataProtoFuture


def part(start: int, n: int = 2) -> DataProto:
    return DataProto.from_dict({"obs": torch.arange(start, start + n)}, {"u": [f"s{i}" for i in range(start, start + n)]})


def test_thread_pool_futures_concat_and_chunk():
    release = threading.Event()

    def work(start: int) -> DataProto:
        release.wait(timeout=10)
        return part(start)

    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        futures = [pool.submit(work, s) for s in (0, 2, 4)]
        fut = DataProtoFuture.concat(futures)
        pieces = fut.chunk(3)
        assert not any(f.done() for f in futures)  # building futures does not wait
        release.set()
        whole = fut.get()
        assert whole.batch["obs"].tolist() == [0, 1, 2, 3, 4, 5]
        assert [p.get().non_tensor_batch["u"].tolist() for p in pieces] == [["s0", "s1"], ["s2", "s3"], ["s4", "s5"]]


def test_custom_collect_and_dispatch():
    done = concurrent.futures.Future()
    done.set_result(part(0, 4))
    fut = DataProtoFuture(collect_fn=lambda xs: xs[0], futures=[done], dispatch_fn=lambda x: x[1:3])
    assert fut.get().batch["obs"].tolist() == [1, 2]
    halves = fut.chunk(2)
    assert [h.get().batch["obs"].tolist() for h in halves] == [[1], [2]]


def test_plain_values_pass_through_and_type_is_checked():
    assert DataProtoFuture.concat([part(0), part(2)]).get().batch["obs"].tolist() == [0, 1, 2, 3]
    bad = concurrent.futures.Future()
    bad.set_result({"not": "a DataProto"})
    with pytest.raises(DataProtoError, match="expected a DataProto"):
        DataProtoFuture.concat([bad]).get()


def test_get_has_a_deadline():
    never = concurrent.futures.Future()
    fut = DataProtoFuture(collect_fn=DataProto.concat, futures=[never], timeout=0.05)
    with pytest.raises(concurrent.futures.TimeoutError):
        fut.get()


def test_worker_exception_propagates():
    failed = concurrent.futures.Future()
    failed.set_exception(RuntimeError("worker died"))
    with pytest.raises(RuntimeError, match="worker died"):
        DataProtoFuture.concat([failed]).get()


async def test_asyncio_futures_await():
    async def produce(start: int) -> DataProto:
        await asyncio.sleep(0)
        return part(start)

    tasks = [asyncio.ensure_future(produce(s)) for s in (0, 2)]
    fut = DataProtoFuture.concat(tasks)
    assert (await fut.get_async()).batch["obs"].tolist() == [0, 1, 2, 3]
    # a blocking get() from inside the owning loop is refused (it would deadlock), unless done
    assert fut.get().batch["obs"].tolist() == [0, 1, 2, 3]
    pending = asyncio.get_running_loop().create_future()
    with pytest.raises(DataProtoError, match="get_async"):
        DataProtoFuture.concat([pending]).get()
    pending.cancel()


def test_asyncio_future_from_another_thread():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        async def make_future():
            f = loop.create_future()
            loop.call_later(0.01, f.set_result, part(7))
            return f

        afut = asyncio.run_coroutine_threadsafe(make_future(), loop).result(timeout=10)
        assert DataProtoFuture.concat([afut]).get().batch["obs"].tolist() == [7, 8]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


async def test_get_async_over_thread_futures():
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(part, s) for s in (0, 2)]
        got = await DataProtoFuture.concat(futures).get_async()
    assert got.batch["obs"].tolist() == [0, 1, 2, 3]
