"""Both queue backends against real servers: a private redis-server, a broker process.

Each test runs once per backend (``redis`` / ``embedded``) with the same assertions.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter as Tally

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from services.config.queues import EmbeddedQueueConfig, RedisQueueConfig
from services.protocol import DataProto
from services.queues import QueueFullError, QueueMetrics, RawItem, make_queue

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]


class Env:
    """One backend under test: ``cfg(**overrides)``, and the server's ``kill()``/``restart()``."""

    def __init__(self, kind: str, server) -> None:
        self.kind, self.server = kind, server

    def cfg(self, **kw):
        base = {"op_timeout_s": 5.0, "put_timeout_s": 20.0, "lease_idle_s": 0, "reconnect_backoff_max_s": 0.3}
        base.update(kw)
        if self.kind == "redis":
            return RedisQueueConfig(url=self.server.url, **base)
        base.pop("large_frame_bytes", None)
        return EmbeddedQueueConfig(address=self.server.address, **base)

    def queue(self, stream="s", group="g", consumer="c", **kw):
        return make_queue(self.cfg(**kw), stream=stream, group=group, consumer=consumer)


@pytest.fixture(params=["redis", "embedded"])
def env(request):
    if request.param == "redis":
        return Env("redis", request.getfixturevalue("redis_server"))
    return Env("embedded", request.getfixturevalue("broker"))


@pytest.fixture(params=["redis", "embedded"])
def durable_env(request):
    """Backends whose server writes every acknowledged change to disk before replying."""
    if request.param == "redis":
        return Env("redis", request.getfixturevalue("redis_server_aof"))
    return Env("embedded", request.getfixturevalue("broker_aof"))


def group(ids: list[str], width: int = 4) -> DataProto:
    """A DataProto of ``len(ids)`` rows: ``x`` float32 [B, width] (row r = r*width..), ``sample_id``."""
    x = torch.arange(len(ids) * width, dtype=torch.float32).reshape(len(ids), width)
    return DataProto.from_dict(tensors={"x": x}, non_tensors={"sample_id": np.array(ids, dtype=object)})


async def drain(q, want: int, rounds: int = 200, stage: str | None = None) -> list[str]:
    """Get + ack until ``want`` samples were seen (or ``rounds`` empty polls); returns sample ids in order."""
    seen: list[str] = []
    empty = 0
    while len(seen) < want and empty < rounds:
        got = await q.get(16, 0.2)
        if not got:
            empty += 1
            continue
        for item in got:
            seen += list(item.data.non_tensor_batch["sample_id"])
        await q.ack(got, stage=stage)
    return seen


async def test_ordered_delivery_per_producer(env):
    p1, p2 = env.queue(consumer="p1"), env.queue(consumer="p2")
    c = env.queue(consumer="c", large_frame_bytes=2048)
    await asyncio.gather(
        p1.put([group([f"a{i}"]) for i in range(30)]),
        p2.put([group([f"b{i}", f"b{i}x"], width=300) for i in range(30)]),  # 2.4 KB frames: stored aside on redis
    )
    seqs: dict[str, list[int]] = {}
    seen: list[str] = []
    while len(seen) < 90:
        got = await c.get(7, 2.0)
        assert got, f"stream ran dry after {len(seen)} samples"
        for item in got:
            seqs.setdefault(item.raw.producer, []).append(item.raw.seq)
            seen += list(item.data.non_tensor_batch["sample_id"])
            assert item.data.batch["x"].shape[0] == len(item.sample_ids)
        await c.ack(got)
    assert [s for s in seen if s.startswith("a")] == [f"a{i}" for i in range(30)]
    assert [s for s in seen if s.startswith("b") and not s.endswith("x")] == [f"b{i}" for i in range(30)]
    assert all(v == list(range(1, 31)) for v in seqs.values()) and len(seqs) == 2
    assert await c.depth() == 0
    assert c.stats()["delivered"] == 60 and c.stats()["acked"] == 60
    if env.kind == "redis":  # acked large frames are deleted with their entries
        assert await c._r.keys("*:b:*") == []
    for q in (p1, p2, c):
        await q.close()


async def test_many_producers_and_consumers(env):
    producers = [env.queue(consumer=f"p{k}") for k in range(4)]
    consumers = [env.queue(consumer=f"c{k}") for k in range(3)]
    n_per = 40

    async def produce(k, q):
        for i in range(0, n_per, 8):
            await q.put([group([f"p{k}-{j}"]) for j in range(i, i + 8)])

    sinks: list[list[str]] = [[] for _ in consumers]
    total = 4 * n_per

    async def consume(q, sink):
        empty = 0
        while sum(map(len, sinks)) < total and empty < 50:
            got = await q.get(4, 0.2)
            empty = 0 if got else empty + 1
            sink.extend(s for g in got for s in g.sample_ids)
            await q.ack(got)

    await asyncio.gather(*[produce(k, q) for k, q in enumerate(producers)],
                         *[consume(q, s) for q, s in zip(consumers, sinks)])
    allseen = [s for sink in sinks for s in sink]
    assert sorted(allseen) == sorted(f"p{k}-{j}" for k in range(4) for j in range(n_per))
    assert sum(1 for s in sinks if s) >= 2, "work was not shared between consumers"
    assert await consumers[0].depth() == 0
    for q in producers + consumers:
        await q.close()


async def test_dedupe_ledger_and_metrics(env):
    reg = CollectorRegistry()
    metrics = QueueMetrics(reg)
    a = make_queue(env.cfg(), stream="s", group="g", consumer="a", metrics=metrics)
    b = make_queue(env.cfg(), stream="s", group="g", consumer="b", metrics=metrics)
    await a.put([group(["s1", "s2"]), group(["s3"])], stage="generated")
    await b.put([group(["s2", "s4"]), group(["s1"])])  # s1, s2 again from another producer
    got = await drain(a, 4, rounds=10, stage="scored")
    assert sorted(got) == ["s1", "s2", "s3", "s4"]
    st = a.stats()
    assert st["deduplicated"] == 2 and st["dropped"] == 1  # the lone "s1" item was dropped whole
    assert await a.stages(["s1", "s3", "s4", "zz"]) == {"s1": "scored", "s3": "scored", "s4": "scored", "zz": None}
    await a.record_stage(["s4"], "trained")
    assert (await b.stages(["s4"]))["s4"] == "trained"
    assert reg.get_sample_value("meshrl_queue_deduplicated_total", {"stream": "s", "group": "g"}) == 2
    assert reg.get_sample_value("meshrl_queue_put_total", {"stream": "s", "group": "g"}) == 4
    with pytest.raises(ValueError, match="sample_id"):
        await a.put([DataProto.from_dict(tensors={"x": torch.zeros(1, 2)})])
    with pytest.raises(ValueError, match="stage"):
        await a.record_stage(["s1"], "Not A Stage")
    await a.close()
    await b.close()


async def test_backpressure_holds_and_releases(env):
    p = env.queue(consumer="p", max_depth=3, large_frame_bytes=0)  # redis: every frame stored aside
    c = env.queue(consumer="c", max_depth=3, large_frame_bytes=0)
    await p.put([group([f"x{i}"]) for i in range(3)])
    with pytest.raises(QueueFullError, match="max_depth=3"):
        await p.put([group(["x3"])], timeout=0.3)
    waiting = asyncio.create_task(p.put([group(["x3"]), group(["x4"])], timeout=30))
    await asyncio.sleep(0.5)
    assert not waiting.done(), "put must wait while the stream is full"
    assert await p.depth() == 3
    got = await c.get(2, 2.0)
    await c.ack(got)
    ids = await asyncio.wait_for(waiting, 30)
    assert len(ids) == 2 and all(ids)
    assert sorted(await drain(c, 3, rounds=10)) == ["x2", "x3", "x4"]
    assert p.stats()["seq_gaps"] == 0  # the refused put's number was reused, not skipped
    if env.kind == "redis":  # acked frames' keys are gone; only the refused put's key waits for its TTL
        assert len(await c._r.keys("*:b:*")) <= 1
    await p.close()
    await c.close()


async def test_malformed_entries_are_dropped_and_counted(env, caplog):
    caplog.set_level("ERROR", logger="meshrl.queues")
    c = env.queue(consumer="c")
    p = env.queue(consumer="p")
    await p.put([group(["ok1"])])
    if env.kind == "redis":
        await c.depth()
        r = c._r
        await r.xadd(c.k_stream, {"garbage": b"\x00\x01"})  # missing every field
        await r.xadd(c.k_stream, {"p": "evil", "s": "1", "i": '["bad1"]', "n": "5", "d": b"hello"})  # not a frame
        await r.xadd(c.k_stream, {"p": "evil", "s": "2", "i": "not json", "n": "1", "d": b"x"})
        n_bad = 3
    else:
        await p.put_frames([RawItem(b"definitely not a wire frame", ("bad1",)),
                            RawItem(b"\xff" * 5000, ("bad2",))])
        n_bad = 2
    await p.put([group(["ok2"])])
    assert sorted(await drain(c, 2, rounds=10)) == ["ok1", "ok2"]
    assert c.stats()["malformed"] == n_bad and c.stats()["dropped"] == n_bad
    logged = [r for r in caplog.records if r.levelname == "ERROR" and "malformed" in r.getMessage()]
    assert len(logged) == n_bad
    assert await c.depth() == 0
    with pytest.raises(ValueError, match="sample_id"):
        await p.put_frames([RawItem(b"x", ())])
    await p.close()
    await c.close()


async def test_large_frames_in_chunks(env):
    p = env.queue(consumer="p", chunk_bytes=64 * 1024) if env.kind == "embedded" else env.queue(consumer="p")
    c = env.queue(consumer="c", chunk_bytes=64 * 1024) if env.kind == "embedded" else env.queue(consumer="c")
    big = group([f"big{i}" for i in range(8)], width=40_000)  # 1.28 MB: many chunks / a key aside
    await p.put([big, group(["small"])])
    got = await c.get(2, 5.0)
    assert [g.sample_ids for g in got] == [tuple(f"big{i}" for i in range(8)), ("small",)]
    assert torch.equal(got[0].data.batch["x"], big.batch["x"])
    await c.ack(got)
    await p.close()
    await c.close()


async def test_auto_reclaim_after_lease_idle(env):
    p = env.queue(consumer="p")
    dead = env.queue(consumer="dead")
    live = env.queue(consumer="live", lease_idle_s=0.3)
    await p.put([group([f"r{i}"]) for i in range(4)])
    held = await dead.get(4, 2.0)
    assert len(held) == 4  # "dead" never acks
    await asyncio.sleep(0.4)
    got = await live.get(10, 3.0)
    assert sorted(s for g in got for s in g.sample_ids) == ["r0", "r1", "r2", "r3"]
    assert all(g.delivery_count > 1 for g in got) and live.stats()["redelivered"] == 4
    await live.ack(got)
    assert await live.depth() == 0
    for q in (p, dead, live):
        await q.close()


async def test_redis_password_from_env_and_bounded_windows(tmp_path, monkeypatch, caplog):
    from services.queues.redis_server import RedisServer

    with RedisServer(tmp_path / "pw", password="s3cret-pw") as srv:
        monkeypatch.setenv("MESHRL_QUEUE_TEST_PW", "s3cret-pw")
        cfg = RedisQueueConfig(url=srv.url, password_env="MESHRL_QUEUE_TEST_PW", op_timeout_s=5,
                               dedupe_window=4, ledger_max_entries=5)
        q = make_queue(cfg, stream="s", group="g", consumer="c")
        await q.put([group([f"k{i}"]) for i in range(10)], stage="queued")
        assert sorted(await drain(q, 10, rounds=10)) == sorted(f"k{i}" for i in range(10))
        assert await q._r.hlen(q._k_claims[0]) == 4  # dedupe window: the 4 newest ids
        stages = await q.stages([f"k{i}" for i in range(10)])
        assert [stages[f"k{i}"] for i in range(10)] == [None] * 5 + ["queued"] * 5  # ledger: 5 newest
        await q.close()
        monkeypatch.setenv("MESHRL_QUEUE_TEST_PW", "wrong")
        bad = make_queue(cfg.model_copy(update={"op_timeout_s": 1.0}), stream="s", group="g", consumer="c")
        with pytest.raises(Exception, match="(?i)auth|password|pass"):
            await bad.depth()
        await bad.close()


async def test_a_second_consumer_group_is_refused(env):
    p = env.queue(consumer="p")
    first = env.queue(group="reward", consumer="r0")
    other = env.queue(group="trainer", consumer="t0")
    await p.put([group(["g1"])])
    got = await first.get(1, 2.0)
    assert len(got) == 1
    with pytest.raises(Exception, match="exactly one consumer group"):
        await other.get(1, 0.2)
    await first.ack(got)
    for q in (p, first, other):
        await q.close()


async def test_calls_to_a_dead_server_fail_at_their_deadline(env):
    from services.queues import QueueUnavailableError

    q = env.queue(consumer="c", op_timeout_s=0.5, reconnect_backoff_max_s=0.1)
    await q.put([group(["d0"])])
    env.server.kill()
    with pytest.raises(QueueUnavailableError, match="unreachable"):
        await q.put([group(["d1"])], timeout=0.5)
    with pytest.raises(QueueUnavailableError):
        await q.get(1, 0.2)
    with pytest.raises(QueueUnavailableError):
        await q.depth()
    assert q.stats()["reconnects"] > 0
    await q.close()


async def test_redis_over_a_unix_socket_stores_large_frames_through_redis_py(redis_server):
    cfg = RedisQueueConfig(url=redis_server.unix_url, large_frame_bytes=1024, op_timeout_s=5, max_depth=2)
    p = make_queue(cfg, stream="u", group="g", consumer="p")
    c = make_queue(cfg, stream="u", group="g", consumer="c")
    assert p._blob is None  # the zero-copy connection is TCP only
    big = group([f"u{i}" for i in range(3)], width=1000)  # 12 KB: stored aside
    await p.put([big, group(["u3"], width=1000)])
    with pytest.raises(QueueFullError):
        await p.put([group(["u4"], width=1000)], timeout=0.2)
    got = await c.get(4, 2.0)
    assert [g.sample_ids for g in got] == [("u0", "u1", "u2"), ("u3",)]
    assert torch.equal(got[0].data.batch["x"], big.batch["x"])
    await c.ack(got)
    assert len(await c._r.keys("*:b:*")) <= 1  # acked frames deleted; only the refused put's key may wait for its TTL
    for q in (p, c):
        await q.close()
