"""Property tests: random DataProtos (random dtypes, shapes, columns and meta_info) survive
encode/decode exactly, through the whole-frame, scatter-gather and chunked forms."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services import wire
from services.protocol import DataProto
from tests.unit.test_wire_codec import ALL_DTYPES, _random, assert_same

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
scalars = (
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False) | st.text(max_size=20) | st.binary(max_size=20)
)
numeric_dtypes = st.sampled_from([np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint64, np.float16, np.float32, np.float64, np.bool_, np.complex64])


@st.composite
def small_arrays(draw):
    dt = np.dtype(draw(numeric_dtypes))
    shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
    raw = draw(st.binary(min_size=int(np.prod(shape)) * dt.itemsize, max_size=int(np.prod(shape)) * dt.itemsize))
    arr = np.frombuffer(raw, dtype=np.uint8).copy().view(dt).reshape(shape) if raw else np.zeros(shape, dtype=dt)
    return arr.astype(bool) if dt == np.bool_ else arr


plain = st.recursive(
    scalars | small_arrays(),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=8) | st.integers(-5, 5), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def dataprotos(draw):
    b = draw(st.integers(0, 5))
    has_batch = draw(st.booleans()) or b == 0
    tensors = {}
    if has_batch:
        for i, name in enumerate(draw(st.lists(names, max_size=4, unique=True))):
            dtype = draw(st.sampled_from(ALL_DTYPES))
            tail = tuple(draw(st.lists(st.integers(0, 4), max_size=2)))
            tensors[name] = _random((b, *tail), dtype, seed=draw(st.integers(0, 2**16)))
            if draw(st.booleans()) and tensors[name].dim() >= 2:  # also send a non-contiguous view
                tensors[name] = tensors[name].transpose(0, 1).contiguous().transpose(0, 1)
    non_tensors = {}
    for name in draw(st.lists(names, max_size=3, unique=True)):
        if draw(st.booleans()):
            col = np.empty(b, dtype=object)
            for i in range(b):
                col[i] = draw(plain)
        else:
            col = np.resize(draw(small_arrays()), (b,))  # a plain numeric column of length b
        non_tensors[name] = col
    if not tensors and not non_tensors and not has_batch:
        has_batch = True
    meta = draw(st.dictionaries(names, plain, max_size=4))
    if has_batch:
        d = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta) if tensors else None
        if d is None:
            from tensordict import TensorDict

            d = DataProto(batch=TensorDict({}, batch_size=[b]), non_tensor_batch=non_tensors, meta_info=meta)
        return d
    return DataProto(batch=None, non_tensor_batch=non_tensors, meta_info=meta)


@SETTINGS
@given(dataprotos())
def test_random_dataprotos_round_trip_exactly(d):
    frame = wire.encode(d)
    assert_same(d, wire.decode(frame))
    assert_same(d, wire.decode(bytes(frame)))
    assert bytes(frame) == b"".join(bytes(p) for p in wire.encode_parts(d))


@SETTINGS
@given(dataprotos(), st.integers(1, 300))
def test_random_dataprotos_round_trip_through_chunks(d, chunk_bytes):
    parts = wire.encode_parts(d)
    chunks = list(wire.iter_chunks(parts, chunk_bytes))
    assert all(0 < len(c.data) <= chunk_bytes for c in chunks)
    assert_same(d, wire.decode(wire.join_chunks(chunks)))


@settings(max_examples=60, deadline=None)
@given(plain)
def test_any_plain_value_survives_meta_info(value):
    d = DataProto.from_dict(tensors={"x": torch.zeros(1)}, meta_info={"v": value})
    assert_same(d, wire.decode(wire.encode(d)))


@settings(max_examples=80, deadline=None)
@given(st.binary(max_size=600))
def test_arbitrary_bytes_only_raise_wire_error(raw):
    try:
        wire.decode(bytearray(raw))
    except wire.WireError:
        pass
