"""Crashes: a consumer process SIGKILLed while holding leases; the server (redis-server with
AOF, or the broker's host process with its append-only file) SIGKILLed and restarted
mid-stream. Every sample must come out downstream exactly once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import Counter as Tally

import pytest
import torch

from tests.integration.test_queues_backends import drain, durable_env, env, group  # noqa: F401 - fixtures

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

# A worker that leases six items, writes all six downstream, acks only three, then hangs.
# It moves frames without decoding them (the frames layer), so it starts without torch.
DOOMED_WORKER = r"""
import asyncio, json, sys
from services.config.queues import parse_queue_config
from services.queues import RawItem, make_queue

async def main():
    cfg = parse_queue_config(json.loads(sys.argv[1]))
    src = make_queue(cfg, stream="in", group="work", consumer="doomed")
    dst = make_queue(cfg, stream="out", group="sink", consumer="doomed")
    got = []
    while len(got) < 6:
        got += await src.get_frames(6 - len(got), 2.0)
    await dst.put_frames([RawItem(g.payload, g.sample_ids) for g in got])
    await src.ack(got[:3])
    print("HOLDING", "torch" in sys.modules, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


async def test_killed_consumer_leases_are_reclaimed_exactly_once(env):
    cfg = env.cfg()
    producer = env.queue(stream="in", group="work", consumer="producer")
    await producer.put([group([f"w{i}"]) for i in range(10)])
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", DOOMED_WORKER, cfg.model_dump_json(),
        stdout=asyncio.subprocess.PIPE, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line.strip() == b"HOLDING False", line  # and it never imported torch
        assert await producer.depth() == 7  # 4 never delivered + 3 leased by the doomed worker
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()

    live_in = env.queue(stream="in", group="work", consumer="live")
    live_out = env.queue(stream="out", group="work-out", consumer="live")
    await asyncio.sleep(0.3)
    reclaimed = await live_in.reclaim(min_idle=0.2)
    assert len(reclaimed) == 3 and all(r.delivery_count > 1 for r in reclaimed)
    rest = await live_in.get(10, 2.0)
    assert len(rest) == 4
    for batch in (reclaimed, rest):  # the live worker's downstream write, then ack
        await live_out.put([r.data for r in batch])
        await live_in.ack(batch)
    assert await live_in.depth() == 0

    sink = env.queue(stream="out", group="sink", consumer="sink")
    seen = await drain(sink, 10, rounds=10)
    assert sorted(seen) == sorted(f"w{i}" for i in range(10))
    assert max(Tally(seen).values()) == 1
    assert sink.stats()["deduplicated"] == 3  # the doomed worker's unacked three, written twice
    assert await sink.depth() == 0
    for q in (producer, live_in, live_out, sink):
        await q.close()


async def test_server_killed_and_restarted_mid_stream(durable_env):
    server = durable_env.server
    p = durable_env.queue(consumer="p", op_timeout_s=30, put_timeout_s=60)  # ride out a slow restart
    c = durable_env.queue(consumer="c", op_timeout_s=30, put_timeout_s=60)
    n = 150
    sink: list[str] = []
    restarted = asyncio.Event()
    killed = asyncio.Event()

    async def produce():
        for i in range(0, n, 5):
            if i == 100:
                await killed.wait()  # the crash lands mid-stream; the rest is put through the outage
            # every fourth batch carries ~300 KB frames: stored aside (redis) / chunked (broker)
            await p.put([group([f"m{j}"], width=75_000 if i % 20 == 0 else 4) for j in range(i, i + 5)])

    async def consume():
        while len(set(sink)) < n:
            got = await c.get(8, 0.5)
            for g in got:
                x = g.data.batch["x"]
                assert torch.equal(x[0, :4], torch.arange(4, dtype=torch.float32)), "frame corrupted"
            sink.extend(s for g in got for s in g.sample_ids)  # the downstream write
            await c.ack(got)

    async def crash():
        while len(sink) < 40:
            await asyncio.sleep(0.005)
        server.kill()
        killed.set()
        await asyncio.sleep(0.3)
        await asyncio.to_thread(server.restart)
        restarted.set()

    await asyncio.wait_for(asyncio.gather(produce(), consume(), crash()), 90)
    assert restarted.is_set()
    assert sorted(set(sink)) == sorted(f"m{j}" for j in range(n))
    dups = [s for s, k in Tally(sink).items() if k > 1]
    assert dups == [], f"consumed twice: {dups}"
    assert await c.depth() == 0
    assert p.stats()["reconnects"] + c.stats()["reconnects"] > 0, "the restart went unnoticed"
    assert p.stats()["seq_gaps"] == 0
    await p.close()
    await c.close()


async def test_a_server_that_lost_its_data_shows_up_as_a_sequence_gap(env, caplog):
    p = env.queue(consumer="p", op_timeout_s=30)
    await p.put([group([f"lost{i}"]) for i in range(5)])
    await asyncio.to_thread(env.server.restart)  # in memory only: the five items are gone
    await p.put([group(["after"])])
    assert p.stats()["seq_gaps"] == 5
    assert any("sequence gap" in r.getMessage() for r in caplog.records)
    c = env.queue(consumer="c")
    assert await drain(c, 1, rounds=5) == ["after"]
    await p.close()
    await c.close()
