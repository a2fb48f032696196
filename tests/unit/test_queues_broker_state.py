"""The embedded broker's state and append-only file, in process (no gRPC)."""

from __future__ import annotations

import pytest

from services.queues.aof import AppendOnlyFile, replay
from services.queues.broker import BrokerState
from services.queues.chunkcodec import chunk_deserializer, chunk_serializer
from services.pb import queue_pb2


async def test_put_get_dedupe_ack_and_seq_numbers():
    st = BrokerState()
    assert await st.put("s", "p", 1, ("a", "b"), b"f1", "queued", 10) == ("1", 0)
    assert await st.put("s", "p", 1, ("a", "b"), b"f1", "", 10) == ("", 0)  # same seq: duplicate
    assert await st.put("s", "p", 4, ("c",), b"f4", "", 10) == ("2", 2)  # 2 and 3 skipped
    assert await st.put("s", "q", 1, ("b", "d"), b"g1", "", 10) == ("3", 0)
    got = await st.get("s", "grp", "c0", 10, 0, 100)
    assert [(d.entry.id, d.fresh) for d in got] == [(1, (True, True)), (2, (True,)), (3, (False, True))]
    assert st.depth("s") == (3, 0, 3)
    assert await st.ack("s", [1, 2, 3, 99], "scored", ["a", "b", "c", "d"], 10) == 3
    assert st.depth("s") == (0, 0, 0)
    assert st.stages(["a", "d", "zz"]) == ["scored", "scored", ""]


async def test_reclaim_idle_and_own_leases():
    st = BrokerState()
    for i in range(3):
        await st.put("s", "p", i + 1, (f"x{i}",), b"f", "", 10)
    got = await st.get("s", "g", "dead", 3, 0, 100)
    assert len(got) == 3
    assert st.reclaim("s", "g", "live", 3600, 10, 100) == []  # not idle yet
    again = st.reclaim("s", "g", "live", 0, 2, 100)
    assert [d.entry.deliveries for d in again] == [2, 2] and all(d.fresh == (True,) for d in again)
    own = st.reclaim("s", "g", "dead", 0, 10, 100, own_only=True, exclude=frozenset({3}))
    assert own == []  # "dead" only still holds entry 3, which it excluded


async def test_aof_restores_unacked_leases_claims_and_ledger(tmp_path):
    path = tmp_path / "q.aof"
    st = BrokerState(path)
    for i in range(4):
        await st.put("s", "p", i + 1, (f"x{i}",), [b"fr", b"ame"], "queued", 100)
    got = await st.get("s", "g", "c", 2, 0, 100)  # x0, x1 leased
    await st.ack("s", [got[0].entry.id], "scored", ["x0"], 100)
    st.close()

    st2 = BrokerState(path)  # a restart: replays, then compacts the file
    assert st2.depth("s") == (3, 2, 1)  # x1 still leased to "c"; x2, x3 queued
    assert st2.streams["s"].leased[2].consumer == "c" and st2.streams["s"].leased[2].deliveries == 1
    assert st2.stages(["x0", "x1"]) == ["scored", "queued"]
    assert await st2.put("s", "p", 4, ("x3",), b"dup", "", 100) == ("", 0)  # seq remembered
    await st2.put("s", "other", 1, ("x1",), b"frame", "", 100)
    got2 = await st2.get("s", "g", "c2", 10, 0, 100)
    assert [(d.entry.sample_ids, d.fresh) for d in got2] == [(("x2",), (True,)), (("x3",), (True,)), (("x1",), (False,))]
    assert bytes(got2[0].entry.data) == b"frame"
    st2.close()
    st3 = BrokerState(path)  # the compacted file replays to the same state
    assert st3.depth("s") == (4, 0, 4)
    st3.close()


def test_aof_cuts_a_torn_tail(tmp_path):
    path = tmp_path / "t.aof"
    f = AppendOnlyFile(path)
    f.append(["L", "queued", ["a"]], ["L", "scored", ["b"]])
    f.close()
    good = path.stat().st_size
    with open(path, "ab") as fh:
        fh.write(b"\x10\x00\x00\x00garbage")  # a record header whose body never made it
    assert [r[1] for r in replay(path)] == ["queued", "scored"]
    assert path.stat().st_size == good


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300_000])
def test_chunk_codec_matches_protobuf(n):
    data = bytes(range(256)) * (n // 256) + b"x" * (n % 256)
    ser = chunk_serializer(3)(memoryview(data))
    assert ser == queue_pb2.QueuePutMessage(chunk=data).SerializeToString() or n == 0
    back = chunk_deserializer(3, queue_pb2.QueuePutMessage)(ser)
    if n:
        assert isinstance(back, memoryview) and bytes(back) == data
    header = queue_pb2.QueuePutMessage(item=queue_pb2.QueuePutItem(seq=5, sample_ids=["a"], frame_bytes=9))
    assert chunk_deserializer(3, queue_pb2.QueuePutMessage)(chunk_serializer(3)(header)) == header


async def test_aof_is_compacted_as_items_are_acked(tmp_path):
    """10 000 puts of 1 KiB frames, each acked soon after: the file stays bounded by the
    live items (a few here), not the 10 MB of history, and replays to the same state."""
    path = tmp_path / "c.aof"
    st = BrokerState(path, compact_min_bytes=64 << 10)
    frame = bytes(range(256)) * 4
    biggest = 0
    for i in range(10_000):
        await st.put("s", "p", i + 1, (f"x{i}",), frame, "queued", 1000)
        if i % 4 == 3:  # ack in small batches, leaving up to 4 live items
            got = await st.get("s", "g", "c", 10, 0, 1000)
            await st.ack("s", [d.entry.id for d in got], "done", [d.entry.sample_ids[0] for d in got], 1000)
        biggest = max(biggest, path.stat().st_size)
    await st.put("s", "p", 10_001, ("tail",), b"live", "queued", 1000)
    assert st.compactions > 10
    assert biggest < 256 << 10  # 10 MB of frames went through the file
    st.close()
    st2 = BrokerState(path)
    assert st2.depth("s") == (1, 1, 0)
    assert bytes(next(iter(st2.streams["s"].entries.values())).data) == b"live"
    assert await st2.put("s", "p", 10_000, ("x9999",), b"dup", "", 1000) == ("", 0)  # seq survives compaction
    assert st2.stages(["x9998", "tail"]) == ["done", "queued"]
    got = await st2.get("s", "g", "c", 10, 0, 1000)
    assert [d.fresh for d in got] == [(True,)]
    st2.close()


async def test_stage_counts_follow_the_ledger(tmp_path):
    """The broker keeps per-stage sample counts as stages change (the controller reads them
    instead of walking the whole ledger): they equal a count over the ledger after puts,
    acks, records, evictions past ``ledger_max`` and a replay of the file."""
    from collections import Counter

    path = tmp_path / "l.aof"
    st = BrokerState(path)
    for i in range(40):
        await st.put("s", "p", i + 1, (f"u{i}/0", f"u{i}/1"), b"x", "queued", 60)
    got = await st.get("s", "g", "c", 10, 0, 1000)
    await st.ack("s", [d.entry.id for d in got], "generated", [s for d in got for s in d.entry.sample_ids], 60)
    st.record(["u39/0", "u39/1", "new"], "trained", 60)
    assert len(st.ledger) == 60  # the oldest ids were evicted
    assert {k: v for k, v in st.stage_counts.items() if v} == dict(Counter(st.ledger.values()))
    st.close()
    st2 = BrokerState(path)
    assert {k: v for k, v in st2.stage_counts.items() if v} == dict(Counter(st2.ledger.values()))
    st2.close()
