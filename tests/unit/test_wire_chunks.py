"""The chunked form for gRPC streams: round trips, and every broken chunk sequence rejected
with WireError (gap, repeat, reorder, mixed frames, size lies, oversize, extra chunks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services import wire
from services.pb import frame_pb2
from services.protocol import DataProto


@pytest.fixture(scope="module")
def frame() -> bytearray:
    d = DataProto.from_dict(
        tensors={"ids": torch.arange(200).view(4, 50), "lp": torch.randn(4, 50)},
        non_tensors={"uid": np.array(["a", "b", "c", "d"], dtype=object)},
        meta_info={"v": 3},
    )
    return wire.encode(d)


@pytest.mark.parametrize("chunk_bytes", [1, 7, 64, 1000, 1 << 20])
def test_chunk_round_trip(frame, chunk_bytes):
    chunks = list(wire.iter_chunks(frame, chunk_bytes))
    assert len(chunks) == -(-len(frame) // chunk_bytes)
    assert {c.frame_id for c in chunks} == {chunks[0].frame_id}
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert all(c.total_chunks == len(chunks) and c.total_bytes == len(frame) for c in chunks)
    joined = wire.join_chunks(chunks)
    assert isinstance(joined, bytearray) and joined == frame
    back = wire.decode(joined)
    assert torch.equal(back.batch["ids"], torch.arange(200).view(4, 50))


def test_chunks_survive_protobuf_serialization(frame):
    wire_msgs = [c.SerializeToString() for c in wire.iter_chunks(frame, 100)]
    chunks = [frame_pb2.FrameChunk.FromString(m) for m in wire_msgs]
    assert wire.join_chunks(chunks) == frame


def test_parts_are_chunked_without_joining(frame):
    d = wire.decode(frame)
    parts = wire.encode_parts(d)
    assert wire.join_chunks(wire.iter_chunks(parts, 33)) == frame


def test_assembler_incremental(frame):
    asm = wire.ChunkAssembler(max_frame_bytes=len(frame))
    chunks = list(wire.iter_chunks(frame, 128))
    for c in chunks[:-1]:
        assert asm.add(c) is False
    with pytest.raises(wire.WireError, match="incomplete"):
        asm.frame()
    assert asm.add(chunks[-1]) is True and asm.frame() == frame


def _chunks(frame, n=100):
    return list(wire.iter_chunks(frame, n))


def _copy(c: frame_pb2.FrameChunk, **kw) -> frame_pb2.FrameChunk:
    out = frame_pb2.FrameChunk()
    out.CopyFrom(c)
    for k, v in kw.items():
        setattr(out, k, v)
    return out


BAD = [
    ("missing first", lambda cs: cs[1:], "first chunk must have seq 0"),
    ("gap", lambda cs: cs[:2] + cs[3:], "missing"),
    ("repeat", lambda cs: cs[:2] + [cs[1]] + cs[2:], "repeated"),
    ("swap", lambda cs: [cs[0], cs[2], cs[1]] + cs[3:], "missing"),
    ("truncated stream", lambda cs: cs[:-1], "incomplete"),
    ("extra after end", lambda cs: cs + [cs[-1]], "extra chunk"),
    ("empty stream", lambda cs: [], "incomplete"),
    ("mixed frame ids", lambda cs: [cs[0], _copy(cs[1], frame_id=cs[1].frame_id ^ 1)] + cs[2:], "mixed"),
    ("total_bytes lie", lambda cs: [_copy(c, total_bytes=c.total_bytes + 1) for c in cs], "total_bytes"),
    ("total_chunks lie", lambda cs: [_copy(c, total_chunks=c.total_chunks + 1) for c in cs], "incomplete"),
    ("too few total_chunks", lambda cs: [_copy(c, total_chunks=2) for c in cs], "extra chunk|total_bytes"),
    ("zero chunks", lambda cs: [_copy(cs[0], total_chunks=0)], "impossible"),
    ("empty data", lambda cs: [cs[0], _copy(cs[1], data=b"")] + cs[2:], "empty data"),
    ("data overrun", lambda cs: [cs[0], _copy(cs[1], data=cs[1].data * 50)] + cs[2:], "runs past"),
    ("not a chunk", lambda cs: [b"raw bytes"], "expected a FrameChunk"),
]


@pytest.mark.parametrize("name, mangle, message", BAD, ids=[b[0] for b in BAD])
def test_bad_chunk_sequences_are_rejected(frame, name, mangle, message):
    with pytest.raises(wire.WireError, match=message):
        wire.join_chunks(mangle(_chunks(frame)))


def test_max_frame_bytes_checked_before_allocating(frame):
    huge = frame_pb2.FrameChunk(frame_id=1, seq=0, total_chunks=1, total_bytes=1 << 50, data=b"x")
    with pytest.raises(wire.WireError, match="max_frame_bytes"):
        wire.join_chunks([huge])
    with pytest.raises(wire.WireError, match="max_frame_bytes"):
        wire.join_chunks(_chunks(frame), max_frame_bytes=len(frame) - 1)


def test_iter_chunks_argument_checks(frame):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            list(wire.iter_chunks(frame, bad))
    with pytest.raises(ValueError):
        list(wire.iter_chunks(b"", 10))
