"""Fuzzing the decoder: truncated, bit-flipped, random and hand-crafted malicious frames must
raise services.wire.WireError and nothing else — no other exception, no hang, no huge
allocation."""

from __future__ import annotations

import random
import struct
import tracemalloc

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services import wire
from services.pb import frame_pb2
from services.protocol import DataProto
from services.wire import codec

pytestmark = pytest.mark.timeout(180)


def _sample_frames() -> list[bytearray]:
    col = np.empty(3, dtype=object)
    col[0], col[1], col[2] = "a", {"gt": [1, 2.5, None]}, np.arange(3, dtype=np.int16)
    return [
        wire.encode(DataProto.from_dict(
            tensors={"ids": torch.arange(12).view(3, 4), "lp": torch.randn(3, 4).half(), "m": torch.ones(3, dtype=torch.bool)},
            non_tensors={"obj": col, "num": np.arange(3, dtype=np.float32), "s": np.array(["x", "yy", "z"])},
            meta_info={"t": (1, 2), "arr": np.ones(2), "nest": {"k": [b"b", 1.5]}},
        )),
        wire.encode(DataProto(batch=None, non_tensor_batch={"uid": np.array(["u0", "u1"], dtype=object)}, meta_info={})),
        wire.encode(DataProto.from_dict(tensors={"e": torch.empty(0, 5)})),
    ]


def decode_only_wire_error(buf, **kw) -> bool:
    """Decode; True if it decoded, False if it raised WireError. Anything else propagates."""
    try:
        wire.decode(buf, **kw)
    except wire.WireError as e:
        assert str(e), "WireError must carry a message"
        return False
    return True


def test_every_truncation_is_rejected():
    for frame in _sample_frames():
        assert decode_only_wire_error(frame)
        for n in range(len(frame)):
            assert not decode_only_wire_error(bytearray(frame[:n])), f"accepted a frame truncated to {n} bytes"
        assert not decode_only_wire_error(frame + b"\x00"), "accepted trailing bytes"


def test_bit_flips_never_raise_anything_but_wire_error():
    rng = random.Random(1234)
    for frame in _sample_frames():
        for _ in range(600):
            buf = bytearray(frame)
            for _ in range(rng.choice((1, 1, 2, 8))):
                pos = rng.randrange(len(buf))
                buf[pos] ^= 1 << rng.randrange(8)
            decode_only_wire_error(buf)


def test_header_byte_flips_are_caught():
    """Flips inside the prefix+header region: decode either rejects or yields a consistent batch."""
    rng = random.Random(7)
    frame = _sample_frames()[0]
    hlen = struct.unpack_from("<I", frame, 8)[0]
    for _ in range(1500):
        buf = bytearray(frame)
        buf[rng.randrange(codec.PREFIX.size + hlen)] = rng.randrange(256)
        decode_only_wire_error(buf)


def test_random_frames_are_rejected_without_huge_allocations():
    rng = random.Random(99)
    tracemalloc.start()
    try:
        for i in range(1500):
            n = rng.randrange(0, 400)
            body = bytearray(rng.randbytes(n))
            if i % 3:  # a valid prefix in front of garbage: exercises the header parser
                hlen = rng.randrange(0, n + 8)
                body = bytearray(codec.PREFIX.pack(codec.MAGIC, 1, 0, hlen, codec.PREFIX.size + n)) + body
            assert not decode_only_wire_error(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"decoding garbage allocated {peak} bytes"


def test_non_buffers_and_odd_buffers():
    for bad in (None, 12, "text", [1, 2], object()):
        with pytest.raises(wire.WireError, match="bytes-like"):
            wire.decode(bad)
    frame = _sample_frames()[0]
    assert decode_only_wire_error(np.frombuffer(bytes(frame), dtype=np.uint8).copy())
    with pytest.raises(wire.WireError):
        wire.decode(np.frombuffer(bytes(frame) * 2, dtype=np.uint8)[::2])  # not contiguous


# ---------------------------------------------------------------- crafted headers


def _split(frame: bytearray) -> tuple[frame_pb2.FrameHeader, bytes]:
    hlen = struct.unpack_from("<I", frame, 8)[0]
    hdr = frame_pb2.FrameHeader.FromString(bytes(frame[codec.PREFIX.size : codec.PREFIX.size + hlen]))
    start = (codec.PREFIX.size + hlen + 63) // 64 * 64
    return hdr, bytes(frame[start:])


def _build(hdr: frame_pb2.FrameHeader, data: bytes, *, data_bytes: int | None = None) -> bytearray:
    """A frame with a correct prefix around a (possibly malicious) header."""
    hdr.data_bytes = len(data) if data_bytes is None else data_bytes
    raw = hdr.SerializeToString()
    start = (codec.PREFIX.size + len(raw) + 63) // 64 * 64
    out = bytearray(start) + data
    codec.PREFIX.pack_into(out, 0, codec.MAGIC, codec.SCHEMA_VERSION, 0, len(raw), len(out))
    out[codec.PREFIX.size : codec.PREFIX.size + len(raw)] = raw
    return out


def _base() -> tuple[frame_pb2.FrameHeader, bytes]:
    return _split(_sample_frames()[0])


def _tensor_mut(field: str, value):
    def mut(h):
        setattr(h.tensors[0], field, value)
    return mut


CASES = [
    ("dtype code", _tensor_mut("dtype", 999), "unknown dtype"),
    ("dtype 0", _tensor_mut("dtype", 0), "unknown dtype"),
    ("offset past end", _tensor_mut("offset", 1 << 40), "run past"),
    ("misaligned", _tensor_mut("offset", 8), "aligned"),
    ("nbytes mismatch", _tensor_mut("nbytes", 8), "needs"),
    ("huge nbytes", _tensor_mut("nbytes", (1 << 64) - 1), "run past"),
    ("overlap", lambda h: setattr(h.tensors[1], "offset", h.tensors[0].offset), "overlap"),
    ("shape vs batch", lambda h: h.tensors[0].shape.__setitem__(0, 5), "batch size"),
    ("shape overflow", lambda h: (h.tensors[0].ClearField("shape"), h.tensors[0].shape.extend([3, 1 << 62, 1 << 62])), "dimension over"),
    ("too many dims", lambda h: (h.tensors[0].ClearField("shape"), h.tensors[0].shape.extend([3] + [1] * 80)), "dimensions"),
    ("empty key", lambda h: h.tensors[0].ClearField("key"), "key path"),
    ("empty key part", lambda h: h.tensors[0].key.append(""), "empty part"),
    ("key too deep", lambda h: h.tensors[0].key.extend(["a"] * 200_000), "parts"),
    ("duplicate key", lambda h: (h.tensors[1].ClearField("key"), h.tensors[1].key.extend(["ids"])), "collides"),
    ("prefix key", lambda h: (h.tensors[1].ClearField("key"), h.tensors[1].key.extend(["ids", "x"])), "collides"),
    ("no batch but tensors", lambda h: setattr(h, "has_batch", False), "has_batch"),
    ("column encoding", lambda h: setattr(h.columns[0], "encoding", 7), "encoding"),
    ("column object dtype", lambda h: (setattr(h.columns[1], "numpy_dtype", "|O8")), "not an allowed"),
    ("column void dtype", lambda h: (setattr(h.columns[1], "numpy_dtype", "|V4")), "not an allowed"),
    ("column dtype size", lambda h: (setattr(h.columns[1], "numpy_dtype", "<f8")), "needs"),
    ("column batch", lambda h: h.columns[0].shape.__setitem__(0, 2), "batch size"),
    ("column 0-d", lambda h: h.columns[0].ClearField("shape"), "batch size"),
    ("column dup", lambda h: setattr(h.columns[1], "name", h.columns[0].name), "duplicate"),
    ("column count", lambda h: (h.columns[0].ClearField("shape"), h.columns[0].shape.extend([3, 2])), "elements"),
    ("meta past end", lambda h: setattr(h.meta_info, "offset", h.meta_info.offset + 64 * 100), "run past"),
]


@pytest.mark.parametrize("name, mutate, message", CASES, ids=[c[0] for c in CASES])
def test_crafted_header_is_rejected_naming_the_problem(name, mutate, message):
    hdr, data = _base()
    mutate(hdr)
    with pytest.raises(wire.WireError, match=message):
        wire.decode(_build(hdr, data))


def test_too_many_entries_are_rejected_quickly():
    hdr, data = _base()
    for i in range(codec.MAX_ENTRIES):
        hdr.tensors.add(key=["k", str(i)], dtype=1, offset=0, nbytes=0)
    with pytest.raises(wire.WireError, match="over the limit"):
        wire.decode(_build(hdr, data))


def test_prefix_fields_are_checked():
    frame = _sample_frames()[0]
    for offset, value, message in [(0, b"XXXX", "magic"), (4, b"\x09\x00", "version"), (6, b"\x01\x00", "flags"),
                                   (8, b"\xff\xff\xff\x7f", "header length"), (12, b"\x00" * 8, "trailing")]:
        buf = bytearray(frame)
        buf[offset : offset + len(value)] = value
        with pytest.raises(wire.WireError, match=message):
            wire.decode(buf)
    hdr, data = _base()
    with pytest.raises(wire.WireError, match="data section"):
        wire.decode(_build(hdr, data, data_bytes=len(data) + 64))


def _with_column_payload(payload: bytes, shape=(3,)) -> bytearray:
    """The sample frame with its object column's msgpack payload replaced."""
    hdr, data = _base()
    col = hdr.columns[0]
    tail = data[col.offset + col.nbytes :]
    new_data = data[: col.offset] + payload
    pad = (-len(new_data)) % 64
    shift = len(new_data) + pad - (col.offset + col.nbytes + ((-(col.offset + col.nbytes)) % 64))
    new_data += b"\x00" * pad
    rest_start = col.offset + col.nbytes + ((-(col.offset + col.nbytes)) % 64)
    new_data += data[rest_start:]
    del tail
    col.nbytes = len(payload)
    col.ClearField("shape")
    col.shape.extend(shape)
    for other in list(hdr.columns[1:]):
        other.offset += shift
    hdr.meta_info.offset += shift
    return _build(hdr, new_data)


def test_column_payload_rewriter_is_faithful():
    good = msgpack.packb(["a", "b", "c"])
    assert wire.decode(_with_column_payload(good)).non_tensor_batch["obj"].tolist() == ["a", "b", "c"]


def _ext(code: int, fields) -> msgpack.ExtType:
    return msgpack.ExtType(code, msgpack.packb(fields, use_bin_type=True))


MSGPACK_ATTACKS = [
    ("ext unknown", msgpack.packb([msgpack.ExtType(99, b"x"), 1, 2]), "ext type"),
    ("ndarray object dtype", msgpack.packb([_ext(1, ["|O8", [1], b"\x00" * 8]), 1, 2]), "not an allowed"),
    ("ndarray size lie", msgpack.packb([_ext(1, ["<i8", [1000], b"\x00" * 8]), 1, 2]), "do not match"),
    ("ndarray neg shape", msgpack.packb([_ext(1, ["<i8", [-1], b"\x00" * 8]), 1, 2]), "negative"),
    ("ndarray bad fields", msgpack.packb([_ext(1, ["<i8"]), 1, 2]), "3-element"),
    ("scalar dtype", msgpack.packb([_ext(2, ["|V8", b"\x00" * 8]), 1, 2]), "not an allowed"),
    ("tensor dtype", msgpack.packb([_ext(5, ["qint8", [1], b"\x00"]), 1, 2]), "unknown dtype"),
    ("objarray count", msgpack.packb([_ext(3, [[5], [1, 2]]), 1, 2]), "element count"),
    ("tuple not list", msgpack.packb([msgpack.ExtType(4, msgpack.packb(5)), 1, 2]), "tuple"),
    ("huge array claim", b"\xdd\xff\xff\xff\xff", "malformed msgpack"),
    ("huge str claim", b"\x93\xdb\xff\xff\xff\xff", "malformed msgpack"),
    ("deep nesting", b"\x91" * 200_000 + b"\xc0", "malformed msgpack"),
    ("bad utf8", msgpack.packb(["a", "b"])[:-1] + b"\xa1\xff", "malformed msgpack"),
    ("not a list", msgpack.packb({"a": 1}), "expected 3 elements"),
    ("wrong count", msgpack.packb([1, 2]), "expected 3 elements"),
    ("unhashable key", b"\x93\x81\x91\x01\x01\x01\x01", "not allowed"),
    ("float key", msgpack.packb([{1.5: 1}, 1, 2]), "not allowed"),
    ("huge int key", msgpack.packb([{3 * ((1 << 61) - 1): 0}, 1, 2]), "not allowed"),
    ("tuple key", msgpack.packb([{msgpack.ExtType(4, msgpack.packb([1])): 0}, 1, 2]), "not allowed"),
    ("trailing data", msgpack.packb([1, 2, 3]) + b"\x01", "malformed msgpack"),
]


@pytest.mark.parametrize("name, payload, message", MSGPACK_ATTACKS, ids=[c[0] for c in MSGPACK_ATTACKS])
def test_malicious_msgpack_is_rejected(name, payload, message):
    with pytest.raises(wire.WireError, match=message):
        wire.decode(_with_column_payload(payload))


def test_meta_info_must_be_a_map():
    hdr, data = _base()
    meta = msgpack.packb([1, 2])
    data = data[: hdr.meta_info.offset] + meta
    hdr.meta_info.nbytes = len(meta)
    with pytest.raises(wire.WireError, match="meta_info"):
        wire.decode(_build(hdr, data))


def _nested_tuple_payload(depth: int) -> bytes:
    inner = msgpack.packb([1])
    for _ in range(depth):
        inner = msgpack.packb([msgpack.ExtType(4, inner)])
    return inner


@pytest.mark.parametrize("depth", [17, 300, 5000])
def test_deeply_nested_ext_payloads_are_refused_not_crashing(depth):
    """Each ext level is a recursive unpack on the C stack: unbounded nesting would crash
    the process (it did at ~300 levels before the depth limit)."""
    col = msgpack.packb([msgpack.ExtType(4, _nested_tuple_payload(depth)), 1, 2])
    with pytest.raises(wire.WireError, match="nested more than"):
        wire.decode(_with_column_payload(col))


# ---------------------------------------------------------------- structured random headers

_dims = st.sampled_from([0, 1, 2, 3, 4, 7, 64, 1 << 20, 1 << 47, 1 << 62, (1 << 64) - 1])
_offsets = st.sampled_from([0, 64, 128, 192, 8, 1 << 40, (1 << 64) - 64])
_nbytes = st.sampled_from([0, 1, 2, 8, 16, 24, 48, 64, 96, 1 << 33, (1 << 64) - 1])
_np_dtypes = st.sampled_from(["<i8", "<f4", "|b1", "<U2", "|S3", "|O", "O", "<U0", "|S0", "<f3", "|V8", "<M8[D]", "", "<c8", ">i2", "<U99999999"])
_keys = st.lists(st.sampled_from(["a", "b", "", "ids", "a.b"]), min_size=0, max_size=3)


@st.composite
def random_frames(draw) -> bytearray:
    hdr = frame_pb2.FrameHeader(has_batch=draw(st.booleans()))
    hdr.batch_size.extend(draw(st.lists(_dims, max_size=2)))
    for _ in range(draw(st.integers(0, 3))):
        hdr.tensors.add(key=draw(_keys), dtype=draw(st.integers(0, 25)), shape=draw(st.lists(_dims, max_size=3)),
                        offset=draw(_offsets), nbytes=draw(_nbytes))
    for _ in range(draw(st.integers(0, 3))):
        hdr.columns.add(name=draw(st.sampled_from(["u", "v", ""])), encoding=draw(st.integers(0, 3)),
                        shape=draw(st.lists(_dims, max_size=2)), numpy_dtype=draw(_np_dtypes),
                        offset=draw(_offsets), nbytes=draw(_nbytes))
    hdr.meta_info.offset, hdr.meta_info.nbytes = draw(_offsets), draw(_nbytes)
    data = draw(st.binary(max_size=320))
    if draw(st.booleans()):  # plausible msgpack where the blobs usually sit
        data = (msgpack.packb(draw(st.sampled_from([{}, [1, 2], ["a", None], {"k": [1]}, [msgpack.ExtType(1, b"\x93")]])))
                + bytes(64))[:64] * 5
    return _build(hdr, data, data_bytes=len(data) if draw(st.booleans()) else draw(_nbytes))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_frames())
def test_random_headers_only_raise_wire_error(frame):
    decode_only_wire_error(frame)


_ext_payloads = st.recursive(
    st.none() | st.integers(-5, 1 << 40) | st.binary(max_size=24) | st.text(max_size=5)
    | st.sampled_from(["<i8", "|O", "qint8", "bfloat16", "<U3"]),
    lambda inner: st.lists(inner, max_size=4)
    | st.builds(lambda code, v: msgpack.ExtType(code, msgpack.packb(v, use_bin_type=True)), st.integers(0, 7), inner),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_ext_payloads, min_size=3, max_size=3))
def test_random_ext_payloads_only_raise_wire_error(cells):
    decode_only_wire_error(_with_column_payload(msgpack.packb(cells, use_bin_type=True)))
