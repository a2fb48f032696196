"""The publisher's snapshot arena and the deadline/abort behaviour of a data group.

The group tests use a real 2-rank gloo group over a TCPStore (both ranks in this process,
each in its own thread)."""

from __future__ import annotations

import threading

import pytest
import torch

from services.net import free_port
from services.weights import SnapshotError, TransferError, iter_buckets
from trainer_svc.weights.arena import RotatingBuffers, SnapshotArena
from services.weights.group import DataGroup, GroupSpec, connect_store
from services.weights.snapshot import parse_safetensors

CPU = torch.device("cpu")


def publish_into(arena: SnapshotArena, version: int, named) -> list:
    arena.begin_write()
    buckets = list(iter_buckets(iter(named), 1024, CPU, arena.buffer))
    arena.commit(version, buckets)
    return buckets


def fetch(arena: SnapshotArena, chunk: int = 100, min_version: int = -1) -> tuple[int, dict]:
    buf = bytearray()
    version = None
    for v, total, offset, data in arena.stream(chunk, min_version):
        assert offset == len(buf) and (version is None or v == version)
        version = v
        buf += data
    assert len(buf) == total
    file_version, tensors = parse_safetensors(buf)
    assert file_version == version
    return version, dict(tensors)


def test_arena_serves_latest_version_and_reuses_memory():
    arena = SnapshotArena()
    with pytest.raises(SnapshotError, match="no snapshot"):
        next(arena.stream(100))
    named1 = [("a", torch.arange(300, dtype=torch.float32)), ("b", torch.ones(10, dtype=torch.bfloat16))]
    b1 = publish_into(arena, 1, named1)
    v, got = fetch(arena)
    assert v == 1 and torch.equal(got["a"], named1[0][1]) and torch.equal(got["b"], named1[1][1])
    named2 = [(n, t * 2) for n, t in named1]
    b2 = publish_into(arena, 2, named2)
    assert b2[0].buffer.data_ptr() == b1[0].buffer.data_ptr()  # same memory, new contents
    v, got = fetch(arena, chunk=7)
    assert v == 2 and torch.equal(got["a"], named2[0][1])
    with pytest.raises(SnapshotError):
        next(arena.stream(100, min_version=3))
    assert arena.wait_for(2, timeout=0.1) and not arena.wait_for(3, timeout=0.1)


def test_arena_stream_stops_when_a_new_publish_starts():
    arena = SnapshotArena()
    publish_into(arena, 1, [("a", torch.zeros(1000))])
    chunks = arena.stream(256)
    next(chunks)
    next(chunks)
    arena.begin_write()  # the next version starts overwriting the buffers
    assert arena.version == -1
    with pytest.raises(SnapshotError, match="superseded"):
        list(chunks)


def test_arena_save_writes_safetensors(tmp_path):
    from safetensors.torch import load_file

    arena = SnapshotArena()
    publish_into(arena, 4, [("w", torch.randn(50, 7)), ("i", torch.arange(3))])
    assert arena.save(tmp_path / "s.safetensors") == 4
    assert set(load_file(str(tmp_path / "s.safetensors"))) == {"w", "i"}


def test_rotating_buffers_alternate_and_grow():
    rb = RotatingBuffers(CPU, slots=2)
    a, b = rb.buffer(0, 10), rb.buffer(1, 10)
    assert a.data_ptr() != b.data_ptr() and rb.buffer(2, 10).data_ptr() == a.data_ptr()
    assert rb.buffer(3, 100).numel() == 100


def two_rank_group(timeout_s: float, prefix: str, gloo_devices: int = 1):
    """A 2-rank gloo group: (publisher DataGroup, receiver DataGroup), built concurrently."""
    port = free_port()
    master = connect_store("127.0.0.1", port, timeout_s, is_master=True)
    client = connect_store("127.0.0.1", port, timeout_s)
    out: dict = {}

    def build(rank, store):
        spec = GroupSpec("127.0.0.1", port, prefix, rank, 2, "gloo", timeout_s, gloo_devices=gloo_devices)
        out[rank] = DataGroup(spec, store)

    ts = [threading.Thread(target=build, args=(r, s)) for r, s in ((0, master), (1, client))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    return out[0], out[1], (master, client)


@pytest.mark.distributed
@pytest.mark.timeout(60)
def test_group_broadcast_then_deadline_and_abort():
    root, peer, _stores = two_rank_group(1.5, "deadline/")
    src = torch.arange(4096, dtype=torch.uint8)
    dst = torch.zeros(4096, dtype=torch.uint8)
    pending = peer.post(dst)
    root.broadcast(src)
    pending.wait()
    assert torch.equal(src, dst)

    # The peer never posts: the root's wait ends at the deadline with TransferError.
    with pytest.raises(TransferError, match="within"):
        root.broadcast(src)
    assert root.aborted
    with pytest.raises(TransferError, match="aborted"):
        root.post(src)

    # An abort from another thread wakes a blocked wait at once (long before the deadline).
    root2, peer2, _stores2 = two_rank_group(30.0, "abort/")
    waiting = peer2.post(dst)
    threading.Timer(0.1, peer2.abort, args=("publisher said ABORT",)).start()
    with pytest.raises(TransferError, match="ABORT"):
        waiting.wait(timeout_s=30)
    root2.broadcast(src)  # the root's send completes the peer's abandoned receive; no hang


@pytest.mark.distributed
@pytest.mark.timeout(60)
def test_group_with_several_devices_keeps_concurrent_broadcasts_in_order():
    """Consecutive broadcasts alternate between the gloo devices and run concurrently; each
    still lands in the buffer its receiver posted for it."""
    root, peer, _stores = two_rank_group(20.0, "devices/", gloo_devices=3)
    srcs = [torch.full((1 << 20,), i, dtype=torch.uint8) for i in range(7)]
    dsts = [torch.zeros(1 << 20, dtype=torch.uint8) for _ in srcs]
    recv = [peer.post(d) for d in dsts]
    sent = [root.post(s) for s in srcs]
    for p in sent + recv:
        p.wait()
    assert all(torch.equal(s, d) for s, d in zip(srcs, dsts))


@pytest.mark.distributed
@pytest.mark.timeout(60)
def test_group_formation_fails_within_its_deadline():
    port = free_port()
    master = connect_store("127.0.0.1", port, 1.0, is_master=True)
    spec = GroupSpec("127.0.0.1", port, "lonely/", 0, 2, "gloo", 1.0)  # rank 1 never comes
    with pytest.raises(TransferError, match="forming the gloo group"):
        DataGroup(spec, master)
