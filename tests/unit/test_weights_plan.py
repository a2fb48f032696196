"""Bucket planning/packing, snapshot files, control-message validation and the config."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file

from services.config.weights import WeightChannelConfig
from services.pb import weights_pb2 as pb
from services.weights import ALIGN, PlanError, SnapshotError, WeightChannelError, iter_buckets
from services.weights.messages import bucket_from_pb, bucket_to_pb, check_control, check_replica_id, control
from services.weights.plan import Bucket, TensorAssembler, TensorSpec, iter_tensors
from services.weights.snapshot import parse_safetensors, write_snapshot

CPU = torch.device("cpu")


def unpack(buckets):
    return [(n, t.clone()) for n, t in iter_tensors(buckets)]


def assert_bitwise(got, want):
    assert [n for n, _ in got] == [n for n, _ in want]
    for (n, a), (_, b) in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, n
        assert torch.equal(a.view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)), n


def sample():
    g = torch.Generator().manual_seed(0)
    return [
        ("a", torch.randn(10, 10, generator=g)),
        ("big", torch.randn(3000, generator=g)),  # 12000 B > a 4096 B bucket
        ("bf", torch.randn(7, generator=g).to(torch.bfloat16)),
        ("empty", torch.empty(0, 5)),
        ("scalar", torch.tensor(3.5, dtype=torch.float64)),
        ("flags", torch.tensor([True, False, True])),
        ("ids", torch.arange(5, dtype=torch.int32)),
        ("f8", torch.randn(9, generator=g).to(torch.float8_e4m3fn)),
        ("strided", torch.randn(8, 6, generator=g).t()),  # non-contiguous
    ]


def test_roundtrip_bitwise_with_alignment_and_split_tensor():
    named = sample()
    buckets = list(iter_buckets(iter(named), 4096, CPU))
    assert [b.index for b in buckets] == list(range(len(buckets)))
    pieces = [s for b in buckets for s in b.specs if s.name == "big"]
    # 12000 B over 4096 B buckets: the rest of bucket 0 (after "a"), two full buckets, the tail
    assert [(s.piece_offset, s.nbytes) for s in pieces] == [(0, 3648), (3648, 4096), (7744, 4096), (11840, 160)]
    assert all(s.is_piece and s.whole_nbytes == 12000 for s in pieces)
    for b in buckets:
        b.validate()
        assert b.buffer.dtype == torch.uint8 and b.buffer.numel() == b.nbytes <= 4096
        assert all(s.offset % ALIGN == 0 for s in b.specs)
    assert_bitwise(unpack(buckets), named)


def test_everything_in_one_bucket_and_one_per_bucket():
    named = sample()
    assert len(list(iter_buckets(iter(named), 1 << 20, CPU))) == 1
    one_each = list(iter_buckets(iter(named), 1, CPU))  # one element per bucket
    assert all(len(b.specs) == 1 and b.nbytes <= 8 for b in one_each if b.nbytes)
    assert_bitwise(unpack(one_each), named)


@pytest.mark.parametrize("bucket", [64, 100, 1000, 4096])
def test_bucket_size_bounds_every_buffer_and_zero_copy_pieces_borrow(bucket):
    g = torch.Generator().manual_seed(1)
    named = [("small", torch.randn(3, generator=g)), ("huge", torch.randn(5000, generator=g)),
             ("after", torch.randn(4, 4, generator=g))]
    buckets = list(iter_buckets(iter(named), bucket, CPU, zero_copy_min_bytes=1000))
    assert all(b.nbytes <= max(bucket, 4) for b in buckets)
    huge = [b for b in buckets if b.specs[0].name == "huge"]
    assert all(b.borrowed for b in huge)  # views of the tensor's own memory, no copy
    base = named[1][1].data_ptr()
    assert [b.buffer.data_ptr() - base for b in huge] == [s.piece_offset for b in huge for s in b.specs]
    assert_bitwise(unpack(buckets), named)


@pytest.mark.parametrize("wire", [torch.bfloat16, torch.float16])
def test_wire_dtype_casts_wider_floats_only(wire):
    g = torch.Generator().manual_seed(2)
    named = [("w", torch.randn(40, 30, generator=g)), ("d", torch.randn(5, dtype=torch.float64, generator=g)),
             ("h", torch.randn(6, generator=g).to(torch.bfloat16)), ("i", torch.arange(4)),
             ("big", torch.randn(3000, generator=g))]
    for zero_copy in (None, 1):
        buckets = list(iter_buckets(iter(named), 2048, CPU, zero_copy_min_bytes=zero_copy, wire_dtype=wire))
        got = dict(unpack(buckets))
        for n, t in named:
            want = t.to(wire) if t.is_floating_point() and t.dtype.itemsize > wire.itemsize else t
            assert got[n].dtype == want.dtype and torch.equal(got[n], want), n
        # half the bytes of the fp32 tensors went on the wire
        assert sum(s.nbytes for b in buckets for s in b.specs if s.name == "big") == 6000


def test_assembler_refuses_broken_piece_sequences():
    def piece(name, off, n=16, total=48):
        return TensorSpec(name, "float32", (12,), 0, n, piece_offset=off, tensor_nbytes=total)

    whole = TensorSpec("x", "float32", (4,), 0, 16)
    for seq, match in [
        ([piece("t", 16)], "without its beginning"),
        ([piece("t", 0), whole], "incomplete"),
        ([piece("t", 0), piece("t", 32)], "incomplete"),
        ([piece("t", 0), piece("u", 16)], "incomplete"),
    ]:
        asm = TensorAssembler()
        with pytest.raises(PlanError, match=match):
            for s in seq:
                asm.advance(s)
    asm = TensorAssembler()
    asm.advance(piece("t", 0))
    with pytest.raises(PlanError, match="ended inside"):
        asm.close()
    for spec, match in [(piece("t", 2), "whole elements"), (piece("t", 40, 16), "whole elements"),
                        (piece("t", 0, 16, 44), "nbytes")]:
        with pytest.raises(PlanError, match=match):
            Bucket(0, 64, [spec]).validate()


def test_split_tensors_travel_through_plans_and_snapshots(tmp_path):
    g = torch.Generator().manual_seed(3)
    named = [("a", torch.randn(7, generator=g)), ("big", torch.randn(50, 40, generator=g))]
    buckets = list(iter_buckets(iter(named), 1024, CPU))
    again = []
    for b in buckets:
        c = bucket_from_pb(bucket_to_pb(b))
        assert c.specs == b.specs
        c.buffer = b.buffer
        again.append(c)
    assert_bitwise(unpack(again), named)
    p = tmp_path / "s.safetensors"
    write_snapshot(p, 4, buckets)
    assert_bitwise(list(load_file(str(p)).items()), named)
    version, parsed = parse_safetensors(bytearray(p.read_bytes()))
    assert version == 4
    assert_bitwise(parsed, named)


def test_only_empty_tensors_make_an_empty_bucket():
    buckets = list(iter_buckets(iter([("e1", torch.empty(0)), ("e2", torch.empty(2, 0, dtype=torch.bfloat16))]), 64, CPU))
    assert len(buckets) == 1 and buckets[0].nbytes == 0
    got = unpack(buckets)
    assert [(n, t.shape, t.dtype) for n, t in got] == [("e1", (0,), torch.float32), ("e2", (2, 0), torch.bfloat16)]


def test_iterator_is_consumed_lazily():
    pulled = []

    def gen():
        for i in range(6):
            pulled.append(i)
            yield f"t{i}", torch.full((256,), float(i))  # 1 KiB each

    it = iter_buckets(gen(), 2048, CPU)
    first = next(it)
    assert [s.name for s in first.specs] == ["t0", "t1"]
    assert len(pulled) <= 3  # at most one tensor beyond the bucket it yielded
    rest = list(it)
    assert len(pulled) == 6 and sum(len(b.specs) for b in rest) == 4


@pytest.mark.parametrize(
    "named, match",
    [
        ([("x", torch.zeros(2)), ("x", torch.zeros(2))], "twice"),
        ([("", torch.zeros(2))], "non-empty"),
        ([("c", torch.zeros(2, dtype=torch.complex64))], "not supported"),
        ([("n", [1.0, 2.0])], "torch.Tensor"),
    ],
)
def test_bad_tensors_are_rejected(named, match):
    with pytest.raises(PlanError, match=match):
        list(iter_buckets(iter(named), 1024, CPU))


def test_spec_validation_catches_bad_plans():
    ok = TensorSpec("w", "float32", (2, 3), 0, 24)
    Bucket(0, 24, [ok]).validate()
    for spec, match in [
        (TensorSpec("w", "float32", (2, 3), 0, 20), "nbytes"),
        (TensorSpec("w", "float32", (2, 3), 8, 24), "multiple"),
        (TensorSpec("w", "float32", (2, 3), 64, 24), "exceed"),
        (TensorSpec("w", "complex64", (2,), 0, 16), "dtype"),
        (TensorSpec("w", "float32", (-1, 3), 0, 0), "negative"),
    ]:
        with pytest.raises(PlanError, match=match):
            Bucket(0, 64, [spec]).validate()
    with pytest.raises(PlanError, match="overlaps"):
        Bucket(0, 128, [TensorSpec("a", "float32", (16,), 64, 64), TensorSpec("b", "float32", (4,), 0, 16)]).validate()


def test_bucket_plan_proto_roundtrip_and_validation():
    buckets = list(iter_buckets(iter(sample()), 4096, CPU))
    for b in buckets:
        back = bucket_from_pb(bucket_to_pb(b))
        assert back.specs == b.specs and back.nbytes == b.nbytes and back.index == b.index
    bad = bucket_to_pb(buckets[0])
    bad.tensors[0].offset = 3
    with pytest.raises(PlanError):
        bucket_from_pb(bad)


def test_control_messages_must_match_their_kind():
    K = pb.ControlKind
    m = control(K.CONTROL_KIND_END, 7, 1, 3, end=pb.End(num_buckets=1))
    assert check_control(m) == "end"
    with pytest.raises(WeightChannelError, match="payload"):
        check_control(control(K.CONTROL_KIND_BEGIN, 7, 1, 3, end=pb.End()))
    with pytest.raises(WeightChannelError, match="session"):
        check_control(control(K.CONTROL_KIND_END, 0, 1, 3, end=pb.End()))
    bad_join = pb.Join(rank=0, world_size=2, store_host="h", store_port=1, store_prefix="p", backend="gloo", timeout_s=1)
    with pytest.raises(WeightChannelError, match="rank"):
        check_control(control(K.CONTROL_KIND_JOIN, 7, 1, -1, join=bad_join))
    greedy = pb.Join(rank=1, world_size=2, store_host="h", store_port=1, store_prefix="p", backend="gloo",
                     timeout_s=1, gloo_devices=1000)  # would open 1000 connection sets and threads
    with pytest.raises(WeightChannelError, match="gloo_devices"):
        check_control(control(K.CONTROL_KIND_JOIN, 7, 1, -1, join=greedy))
    with pytest.raises(WeightChannelError, match="unknown kind"):
        check_control(pb.ControlMessage(kind=99, session=7))
    with pytest.raises(ValueError):
        check_replica_id("")
    with pytest.raises(ValueError):
        check_replica_id("x" * 129)


def test_snapshot_is_valid_safetensors_and_parses_back(tmp_path):
    named = sample()
    buckets = list(iter_buckets(iter(named), 4096, CPU))
    path = tmp_path / "w.safetensors"
    write_snapshot(path, 12, buckets)
    loaded = load_file(str(path))  # the reference reader accepts it
    want = {n: t.contiguous() for n, t in named}
    assert set(loaded) == set(want)
    for n, t in want.items():
        assert torch.equal(loaded[n].view(-1).view(torch.uint8), t.view(-1).view(torch.uint8)), n
    version, got = parse_safetensors(bytearray(path.read_bytes()))
    assert version == 12
    assert_bitwise(sorted(got, key=lambda x: x[0]), sorted(want.items(), key=lambda x: x[0]))


def test_corrupt_snapshots_are_rejected(tmp_path):
    path = tmp_path / "w.safetensors"
    write_snapshot(path, 1, list(iter_buckets(iter([("a", torch.ones(4)), ("b", torch.ones(2))]), 4096, CPU)))
    raw = path.read_bytes()
    with pytest.raises(SnapshotError, match="too short"):
        parse_safetensors(bytearray(raw[:4]))
    with pytest.raises(SnapshotError, match="does not fit"):
        parse_safetensors(bytearray(raw[:20]))
    with pytest.raises(SnapshotError, match="data section"):
        parse_safetensors(bytearray(raw[:-4]))
    with pytest.raises(SnapshotError, match="data section"):
        parse_safetensors(bytearray(raw + b"\0" * 8))
    hole = raw.replace(b'"data_offsets":[16,24]', b'"data_offsets":[20,28]')
    assert hole != raw
    with pytest.raises(SnapshotError, match="hole"):
        parse_safetensors(bytearray(hole))
    with pytest.raises(SnapshotError, match="JSON"):
        parse_safetensors(bytearray(raw[:8] + b"\xff" * (len(raw) - 8)))


def test_config_is_strict_and_bounded():
    cfg = WeightChannelConfig()
    assert cfg.backend == "auto" and cfg.bucket_bytes == 64 << 20 and cfg.rendezvous_host == "127.0.0.1"
    for bad in ({"bucket_mb": 0}, {"transfer_timeout_s": 0}, {"backend": "mpi"}, {"control_port": 70000},
                {"typo_field": 1}, {"host": "0.0.0.0"}, {"snapshot_chunk_kb": 8192}):
        with pytest.raises(ValidationError):
            WeightChannelConfig(**bad)
    assert WeightChannelConfig(host="0.0.0.0", advertise_host="10.0.0.5").rendezvous_host == "10.0.0.5"
    for name, f in WeightChannelConfig.model_fields.items():
        assert f.description, name


def test_zero_copy_buckets_borrow_big_contiguous_tensors():
    big = torch.randn(2048)  # 8 KiB, contiguous
    strided = torch.randn(64, 64).t()  # 16 KiB but not contiguous: packed
    small = torch.randn(8)
    named = [("small", small), ("big", big), ("strided", strided), ("small2", small + 1)]
    buckets = list(iter_buckets(iter(named), 4096, CPU, zero_copy_min_bytes=4096))
    borrowed = [b for b in buckets if b.borrowed]
    assert [b.specs[0].name for b in borrowed] == ["big", "big"]  # two 4 KiB pieces
    assert [b.buffer.data_ptr() for b in borrowed] == [big.data_ptr(), big.data_ptr() + 4096]  # no copy
    assert [b.index for b in buckets] == list(range(len(buckets)))
    assert_bitwise(unpack(buckets), named)
    assert all(not b.borrowed for b in iter_buckets(iter(named), 4096, CPU))  # off by default


def test_custom_allocator_is_used_for_packed_buckets():
    calls = []

    def alloc(index: int, nbytes: int) -> torch.Tensor:
        calls.append((index, nbytes))
        return torch.zeros(nbytes + 100, dtype=torch.uint8)

    named = [("a", torch.ones(100)), ("b", torch.ones(2000))]
    buckets = list(iter_buckets(iter(named), 1024, CPU, alloc))
    assert calls == [(i, 1024) for i in range(len(buckets))]  # "b" is split: no bigger buffer
    assert_bitwise(unpack(buckets), named)


DTYPE_CHOICES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int8, torch.bool, torch.float64]


def test_random_plans_roundtrip_bitwise():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    shapes = st.lists(st.integers(0, 40), min_size=0, max_size=3)
    entries = st.lists(st.tuples(shapes, st.sampled_from(DTYPE_CHOICES)), min_size=1, max_size=12)

    @settings(max_examples=60, deadline=None)
    @given(entries=entries, bucket=st.integers(1, 5000), zero_copy=st.sampled_from([None, 1, 700]))
    def check(entries, bucket, zero_copy):
        g = torch.Generator().manual_seed(len(entries) * 7919 + bucket)
        named = []
        for i, (shape, dt) in enumerate(entries):
            t = torch.randint(0, 100, tuple(shape), generator=g).to(dt)
            named.append((f"t{i}", t))
        buckets = list(iter_buckets(iter(named), bucket, CPU, zero_copy_min_bytes=zero_copy))
        for b in buckets:
            b.validate()
            bucket_from_pb(bucket_to_pb(b))
            assert b.nbytes <= max(bucket, 8)  # the bucket size bounds every buffer
        assert [b.index for b in buckets] == list(range(len(buckets)))
        assert_bitwise(unpack(buckets), named)

    check()
