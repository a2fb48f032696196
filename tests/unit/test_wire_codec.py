"""Round trips of services.wire: every dtype, edge shapes, plain-data columns and meta_info,
zero-copy semantics, scatter-gather parts, and refusal of non-plain objects."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from services import wire
from services.protocol import DataProto
from services.wire import codec
from services.wire.codec import FrameParts, decode_frame, encode_frame

ALL_DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16,
    torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128,
    torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2,
    torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2,
]


def _random(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Random bits of ``dtype`` (every bit pattern, incl. NaNs, must survive)."""
    g = torch.Generator().manual_seed(seed)
    n = int(np.prod(shape)) * dtype.itemsize
    raw = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
    )


def assert_same(a: DataProto, b: DataProto) -> None:
    """Exact equality of two DataProtos: tensors bit for bit, columns element for element."""
    assert (a.batch is None) == (b.batch is None)
    if a.batch is not None:
        assert a.batch.batch_size == b.batch.batch_size
        ka = sorted(a.batch.keys(include_nested=True, leaves_only=True), key=str)
        kb = sorted(b.batch.keys(include_nested=True, leaves_only=True), key=str)
        assert ka == kb
        for k in ka:
            assert _same_bits(a.batch.get(k), b.batch.get(k)), k
    assert list(a.non_tensor_batch) == list(b.non_tensor_batch)
    for k, col in a.non_tensor_batch.items():
        other = b.non_tensor_batch[k]
        assert col.dtype == other.dtype and col.shape == other.shape, k
        if col.dtype == object:
            assert _deep_equal(list(col.reshape(-1)), list(other.reshape(-1))), k
        else:  # raw columns: bit for bit (NaNs included)
            assert col.tobytes() == other.tobytes(), k
    assert _deep_equal(a.meta_info, b.meta_info)


def _deep_equal(x, y) -> bool:
    if type(x) is not type(y) and not (isinstance(x, (bytes, bytearray)) and isinstance(y, bytes)):
        return False
    if isinstance(x, dict):
        return list(x) == list(y) and all(_deep_equal(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(_deep_equal(u, v) for u, v in zip(x, y))
    if isinstance(x, np.ndarray):
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if x.dtype == object:
            return _deep_equal(list(x.reshape(-1)), list(y.reshape(-1)))
        return x.tobytes() == y.tobytes()
    if isinstance(x, np.generic):
        return x.dtype == y.dtype and x.tobytes() == y.tobytes()
    if isinstance(x, torch.Tensor):
        return _same_bits(x, y)
    if isinstance(x, float) and x != x:
        return y != y
    return x == y


def roundtrip(d: DataProto, **kw) -> DataProto:
    frame = wire.encode(d)
    assert isinstance(frame, bytearray)
    assert bytes(frame) == b"".join(bytes(p) for p in wire.encode_parts(d))
    back = wire.decode(frame, **kw)
    assert type(back) is type(d)
    assert_same(d, back)
    return back


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype_round_trips_bit_exactly(dtype):
    d = DataProto.from_dict(tensors={"x": _random((3, 5), dtype), "s": _random((3,), dtype, 1)})
    roundtrip(d)


def test_edge_shapes_zero_d_empty_and_batch_zero():
    # 0-d tensors: DataProto needs a batch dim, so at the codec layer (batch_size ()) and in meta_info
    parts = decode_frame(encode_frame(FrameParts(tensors={("s",): torch.tensor(3.5), ("v",): torch.tensor([1, 2])}, batch_size=())))
    assert parts.batch_size == () and parts.tensors[("s",)].shape == () and parts.tensors[("s",)].item() == 3.5
    roundtrip(DataProto.from_dict(tensors={"x": torch.ones(1)}, meta_info={"zero_d": torch.tensor(7, dtype=torch.int16), "np0": np.array(2.5)}))
    d = DataProto.from_dict(tensors={"e": torch.empty(4, 0), "f": torch.zeros(4, 0, 7, dtype=torch.bfloat16), "k": torch.arange(4)})
    roundtrip(d)
    zero = DataProto.from_dict(
        tensors={"ids": torch.empty(0, 16, dtype=torch.int64), "lp": torch.empty(0, 16)},
        non_tensors={"uid": np.array([], dtype=object)},
    )
    back = roundtrip(zero)
    assert len(back) == 0


def test_non_contiguous_and_conj_and_requires_grad_are_sent_as_values():
    base = torch.arange(48, dtype=torch.float32).reshape(4, 12)
    c = torch.randn(4, 3, dtype=torch.complex64)
    w = torch.randn(4, 2, requires_grad=True)
    d = DataProto.from_dict(tensors={"t": base.t().contiguous().t(), "step": base[:, ::3], "conj": c.conj(), "w": w})
    assert not d.batch["step"].is_contiguous()
    back = wire.decode(wire.encode(d))
    assert torch.equal(back.batch["step"], base[:, ::3])
    assert torch.equal(back.batch["conj"], c.conj().resolve_conj())
    assert torch.equal(back.batch["w"], w.detach()) and not back.batch["w"].requires_grad


def test_no_tensor_batch_and_nested_tensordict():
    only_cols = DataProto(batch=None, non_tensor_batch={"uid": np.array(["a", "b"], dtype=object)}, meta_info={"k": 1})
    back = roundtrip(only_cols)
    assert back.batch is None and len(back) == 2
    td = TensorDict({"top": torch.ones(2, 3), "sub": {"a": torch.arange(2), "deep": {"b": torch.zeros(2, 1, dtype=torch.int8)}}}, batch_size=[2])
    roundtrip(DataProto(batch=td))


def test_object_columns_and_meta_info_of_plain_data():
    cells = [
        "text", 7, -(2**63), 2**64 - 1, 1.25, float("nan"), True, None, b"\x00\xff", [1, [2, "x"]],
        (1, ("nested", None)), {"ground_truth": "42", "style": "rule", 3: [1.5]},
        np.arange(5, dtype=np.int32), np.array([[1.0, 2.0]], dtype=np.float16), np.float32(0.5),
        np.int64(-3), np.bool_(True), np.array(["ab", "c"]), torch.tensor([1, 2], dtype=torch.bfloat16),
        np.array([{"a": 1}, [2]], dtype=object), "ünïcödé ✓",
    ]
    b = len(cells)
    col = np.empty(b, dtype=object)
    for i, v in enumerate(cells):  # assign one by one: lists stay single elements
        col[i] = v
    d = DataProto.from_dict(
        tensors={"ids": torch.arange(b)},
        non_tensors={
            "cell": col,
            "uid": np.array([f"u{i}" for i in range(b)], dtype=object),
            "num": np.arange(b, dtype=np.float64),
            "fixed_str": np.array([f"s{i}" for i in range(b)]),
            "fixed_bytes": np.array([b"ab"] * b),
            "grid": np.zeros((b, 2), dtype=np.int16),
        },
        meta_info={
            "eos_token_id": 2, "temperature": 0.7, "metrics": {"loss": [0.1, 0.2], "kl": {"mean": np.float64(1e-3)}},
            "empty": {}, "none": None, "raw": b"bytes", "tup": (1, 2), "arr": np.ones((2, 2), dtype=np.uint8),
            "ints": {1: "one", -2: "minus two"}, "t": torch.arange(3),
        },
    )
    back = roundtrip(d)
    assert back.non_tensor_batch["cell"][10] == (1, ("nested", None))  # tuples stay tuples
    assert isinstance(back.non_tensor_batch["cell"][9], list)
    assert isinstance(back.meta_info["metrics"]["kl"]["mean"], np.float64)


def test_decode_is_zero_copy_over_a_writable_buffer():
    d = DataProto.from_dict(tensors={"x": torch.zeros(2, 4, dtype=torch.int64)}, non_tensors={"n": np.zeros(2, dtype=np.int32)})
    frame = wire.encode(d)
    back = wire.decode(frame)
    back.batch["x"][0, 0] = 123  # writes through to the frame
    again = wire.decode(frame)
    assert again.batch["x"][0, 0].item() == 123
    back.non_tensor_batch["n"][1] = 9
    assert wire.decode(frame).non_tensor_batch["n"][1] == 9
    mv = memoryview(frame)
    assert wire.decode(mv).batch["x"][0, 0].item() == 123


def test_readonly_bytes_are_copied_unless_zero_copy_readonly():
    d = DataProto.from_dict(tensors={"x": torch.arange(8)})
    raw = bytes(wire.encode(d))
    safe = wire.decode(raw)
    safe.batch["x"][0] = -1  # the copy is writable and does not touch `raw`
    assert wire.decode(raw).batch["x"][0].item() == 0
    shared = wire.decode(raw, zero_copy_readonly=True)
    assert torch.equal(shared.batch["x"], torch.arange(8))
    arr = np.frombuffer(raw, dtype=np.uint8)
    assert shared.batch["x"].data_ptr() >= arr.ctypes.data  # views the bytes object itself
    assert shared.batch["x"].data_ptr() < arr.ctypes.data + len(raw)


def test_tensor_offsets_are_64_byte_aligned_in_the_frame():
    d = DataProto.from_dict(tensors={"a": torch.ones(3, 1, dtype=torch.int8), "b": torch.ones(3, 5), "c": torch.ones(3, dtype=torch.float64)})
    frame = wire.encode(d)
    back = wire.decode(frame)
    start = np.frombuffer(frame, dtype=np.uint8).ctypes.data
    for k in ("a", "b", "c"):
        assert (back.batch[k].data_ptr() - start) % 64 == 0


def test_decode_never_unpickles(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("pickle used on the decode path")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    d = DataProto.from_dict(tensors={"x": torch.ones(2)}, non_tensors={"u": np.array(["a", {"b": [1]}], dtype=object)}, meta_info={"m": (1,)})
    roundtrip(d)


def _nest_tuples(depth: int):
    value: object = "leaf"
    for _ in range(depth):
        value = (value,)
    return value


def test_nesting_up_to_the_limit_round_trips():
    roundtrip(DataProto.from_dict(tensors={"x": torch.ones(1)}, meta_info={"deep": _nest_tuples(16), "lists": [[[[[[1]]]]]] * 3}))


class Opaque:
    """An arbitrary object: must never be pickled onto the wire."""


@pytest.mark.parametrize(
    "meta, path",
    [
        ({"cfg": Opaque()}, "meta_info['cfg']"),
        ({"a": {"b": [1, 2, Opaque()]}}, "meta_info['a']['b'][2]"),
        ({"s": {1, 2}}, "meta_info['s']"),
        ({"f": lambda: 0}, "meta_info['f']"),
        ({"big": 2**70}, "meta_info['big']"),
        ({"surrogate": "\ud800"}, "meta_info['surrogate']"),
        ({"o": np.array([Opaque()], dtype=object)}, "meta_info['o'][0]"),
        ({"dt": np.array(["2020-01-01"], dtype="datetime64[D]")}, "meta_info['dt']"),
        ({"cplx": 1j}, "meta_info['cplx']"),
        ({"deep": _nest_tuples(17)}, "nested more than 16"),
        ({"d": [{"ok": 1}, {1.5: "float key"}]}, "meta_info['d'][1]: dict key 1.5"),
        ({"d": {(1, 2): "tuple key"}}, "meta_info['d']: dict key (1, 2)"),
        ({"d": {2**62: "huge int key"}}, "meta_info['d']: dict key"),
    ],
)
def test_encode_refuses_non_plain_meta_info_naming_the_path(meta, path):
    d = DataProto.from_dict(tensors={"x": torch.ones(1)}, meta_info=meta)
    with pytest.raises(TypeError) as e:
        wire.encode(d)
    assert path in str(e.value)


def test_encode_refuses_bad_columns_and_tensors():
    col = np.empty(2, dtype=object)
    col[0], col[1] = "ok", Opaque()
    with pytest.raises(TypeError, match=r"non_tensor_batch\['c'\]\[1\].*Opaque"):
        wire.encode(DataProto(batch=None, non_tensor_batch={"c": col}))
    with pytest.raises(TypeError, match="non_tensor_batch\\['s'\\]"):
        wire.encode(DataProto(batch=None, non_tensor_batch={"s": np.zeros(2, dtype=[("a", "i4")])}))
    with pytest.raises(TypeError, match="layout"):
        encode_frame(FrameParts(tensors={("sp",): torch.eye(2).to_sparse()}, batch_size=(2,)))
    with pytest.raises(TypeError, match="bits8"):
        encode_frame(FrameParts(tensors={("q",): torch.zeros(2, dtype=torch.bits8)}, batch_size=(2,)))
    with pytest.raises(TypeError, match="DataProto"):
        wire.encode({"x": 1})


def test_codec_layer_parts_round_trip_without_dataproto():
    parts = FrameParts(
        tensors={("a",): torch.arange(6).view(2, 3), ("g", "b"): torch.ones(2)},
        batch_size=(2,),
        non_tensors={"c": np.array(["x", None], dtype=object)},
        meta_info={"k": [1, 2]},
    )
    frame = encode_frame(parts)
    back = decode_frame(frame)
    assert back.batch_size == (2,) and list(back.tensors) == [("a",), ("g", "b")]
    assert torch.equal(back.tensors[("a",)], parts.tensors[("a",)])
    assert back.non_tensors["c"].tolist() == ["x", None] and back.meta_info == {"k": [1, 2]}
    assert bytes(frame[:4]) == codec.MAGIC


def test_decode_into_a_subclass_and_a_size_limit():
    class MyProto(DataProto):
        pass

    d = DataProto.from_dict(tensors={"x": torch.ones(4, 4)})
    frame = wire.encode(d)
    assert type(wire.decode(frame, cls=MyProto)) is MyProto
    with pytest.raises(wire.WireError, match="max_frame_bytes"):
        wire.decode(frame, max_frame_bytes=len(frame) - 1)
    assert wire.decode(frame, max_frame_bytes=len(frame)).batch["x"].sum().item() == 16


def test_every_frame_byte_is_written_even_over_recycled_memory():
    """encode allocates without zero-fill; padding must still come out as zeros."""
    d = DataProto.from_dict(
        tensors={**{f"t{i}": torch.ones(3, i + 1, dtype=torch.int8) for i in range(6)},
                 "big": torch.ones(3, 500_001, dtype=torch.int8)},  # > 1 MiB: the no-zero-fill path
        non_tensors={"u": np.array(["a", "bb", "c"], dtype=object), "n": np.arange(3, dtype=np.int16)},
        meta_info={"k": "v"},
    )
    expected = b"".join(bytes(p) for p in wire.encode_parts(d))
    assert len(expected) > codec._UNINIT_MIN
    for _ in range(3):
        garbage = bytearray(b"\xab" * len(expected))
        del garbage  # the allocator is likely to hand this memory to encode next
        assert bytes(wire.encode(d)) == expected
