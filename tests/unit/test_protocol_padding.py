"""Auto-padding (DataProtoConfig, env vars, per-batch flag), pad/unpad and batch-dim folding."""

from __future__ import annotations

import pytest
import torch

from services.protocol import (
    DataProto,
    DataProtoConfig,
    DataProtoError,
    fold_batch_dim,
    pad_dataproto_to_divisor,
    unfold_batch_dim,
    unpad_dataproto,
)


@pytest.fixture(autouse=True)
def _padding_off(monkeypatch):
    """Every test starts (and ends) with auto-padding off and no env override."""
    for name in ("VERL_AUTO_PADDING", "MESHRL_AUTO_PADDING"):
        monkeypatch.delenv(name, raising=False)
    DataProtoConfig.auto_padding = False
    yield
    DataProtoConfig.auto_padding = False


def make(n: int, meta: dict | None = None) -> DataProto:
    return DataProto.from_dict(
        {"obs": torch.arange(1, n + 1)}, {"labels": [chr(ord("a") + i) for i in range(n)]}, meta or {"info": "t"}
    )


def test_class_switch_is_settable_and_typed():
    assert DataProtoConfig.auto_padding is False
    DataProtoConfig.auto_padding = True
    assert DataProtoConfig.auto_padding is True
    assert make(3).is_padding_enabled()
    with pytest.raises(TypeError):
        DataProtoConfig.auto_padding = 1


@pytest.mark.parametrize("name", ["VERL_AUTO_PADDING", "MESHRL_AUTO_PADDING"])
@pytest.mark.parametrize("value,expected", [("1", True), ("TRUE", True), ("true", True), ("0", False), ("no", False)])
def test_env_var_turns_padding_on(monkeypatch, name, value, expected):
    monkeypatch.setenv(name, value)
    assert DataProtoConfig.auto_padding is expected
    assert make(3).is_padding_enabled() is expected


def test_per_batch_flag_from_dict():
    d = DataProto.from_dict({"obs": torch.arange(5)}, auto_padding=True)
    assert d.is_padding_enabled() and d.meta_info[DataProtoConfig.auto_padding_key] is True
    assert not make(5).is_padding_enabled()
    s = DataProto.from_single_dict({"obs": torch.arange(5)}, auto_padding=True)
    assert s.is_padding_enabled()


def test_uneven_chunk_needs_padding():
    with pytest.raises(AssertionError, match="only support equal chunk"):
        make(7).chunk(2)
    DataProtoConfig.auto_padding = True
    parts = make(7).chunk(2)
    assert [len(p) for p in parts] == [4, 3]
    assert parts[1].non_tensor_batch["labels"].tolist() == ["e", "f", "g"]
    parts = make(5).chunk(4)  # torch.chunk would give only 3 parts: fall back to balanced sizes
    assert [len(p) for p in parts] == [2, 1, 1, 1]
    assert torch.equal(DataProto.concat(parts).batch["obs"], make(5).batch["obs"])


def test_padding_then_chunk_like_dispatch():
    """What verl's dispatch does with auto-padding: pad in place, chunk evenly, drop pad after."""
    d = DataProto.from_dict({"obs": torch.arange(1, 8)}, {"labels": list("abcdefg")}, auto_padding=True)
    world = 4
    pad = (world - len(d) % world) % world
    d.padding(padding_size=pad)
    assert len(d) == 8 and d.batch["obs"].tolist()[-1] == 7  # last row repeated by default
    parts = d.chunk(world)
    assert all(len(p) == 2 for p in parts)
    out = unpad_dataproto(DataProto.concat(parts), pad_size=pad)
    assert out.batch["obs"].tolist() == list(range(1, 8))
    first = make(3)
    first.padding(2, padding_candidate="first")
    assert first.non_tensor_batch["labels"].tolist() == ["a", "b", "c", "a", "a"]
    first.padding(0)
    assert len(first) == 5


@pytest.mark.parametrize(
    "divisor,pad,expected",
    [(2, 1, [1, 2, 3, 1]), (3, 0, [1, 2, 3]), (7, 4, [1, 2, 3, 1, 2, 3, 1])],
)
def test_pad_and_unpad_to_divisor(divisor, pad, expected):
    d = DataProto.from_dict({"obs": torch.tensor([1, 2, 3])}, {"labels": ["a", "b", "c"]}, {"info": "t"})
    padded, pad_size = pad_dataproto_to_divisor(d, size_divisor=divisor)
    assert pad_size == pad
    assert padded.batch["obs"].tolist() == expected
    assert padded.non_tensor_batch["labels"].tolist() == [" abc"[i] for i in expected]
    assert padded.meta_info == {"info": "t"}
    un = unpad_dataproto(padded, pad_size=pad_size)
    assert un.batch["obs"].tolist() == [1, 2, 3] and un.non_tensor_batch["labels"].tolist() == ["a", "b", "c"]
    assert len(d) == 3  # input untouched


def test_pad_rejects_bad_divisor():
    with pytest.raises(DataProtoError):
        pad_dataproto_to_divisor(make(3), 0)
    with pytest.raises(AssertionError):
        pad_dataproto_to_divisor({"obs": 1}, 2)


def test_fold_reorder_unfold():
    d = DataProto.from_dict({"obs": torch.tensor([[1, 2], [3, 4], [5, 6]])}, {"labels": ["a", "b", "c"]}, {"info": "t"})
    folded = fold_batch_dim(d.repeat(repeat_times=2, interleave=True), new_batch_size=3)
    assert folded.batch["obs"].tolist() == [[[1, 2], [1, 2]], [[3, 4], [3, 4]], [[5, 6], [5, 6]]]
    assert folded.non_tensor_batch["labels"].tolist() == [["a", "a"], ["b", "b"], ["c", "c"]]
    folded.reorder(indices=torch.tensor([1, 2, 0]))
    out = unfold_batch_dim(folded, batch_dims=2)
    assert out.batch["obs"].tolist() == [[3, 4], [3, 4], [5, 6], [5, 6], [1, 2], [1, 2]]
    assert out.non_tensor_batch["labels"].tolist() == ["b", "b", "c", "c", "a", "a"]
    assert out.meta_info == {"info": "t"}
    with pytest.raises(DataProtoError, match="divisible"):
        fold_batch_dim(d, new_batch_size=2)
