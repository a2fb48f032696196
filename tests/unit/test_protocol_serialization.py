"""DataProto conversions: TensorDict round trip, tensor (de)serialization, pickling, disk."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from services.protocol import (
    DataProto,
    DataProtoError,
    deserialize_single_tensor,
    deserialize_tensordict,
    serialize_single_tensor,
    serialize_tensordict,
)
from services.protocol.tensordict_utils import get_tensordict
from services.wire import WireError


class PickledSub(DataProto):
    """A subclass at module level (picklable by reference)."""


def rollout_like(n: int = 4) -> DataProto:
    """A small batch with meshrl's usual columns and a numeric non-tensor column."""
    return DataProto.from_dict(
        tensors={
            "responses": torch.randint(0, 100, (n, 5)),
            "response_mask": torch.ones(n, 5, dtype=torch.bool),
            "rollout_log_probs": torch.randn(n, 5),
            "old_log_probs": torch.randn(n, 5).bfloat16(),
            "policy_version": torch.full((n,), 3, dtype=torch.int64),
        },
        non_tensors={
            "uid": [f"p{i // 2}" for i in range(n)],
            "sample_id": [f"s{i}" for i in range(n)],
            "reward_model": [{"ground_truth": str(i), "style": "rule"} for i in range(n)],
            "raw_prompt_ids": [[1, 2, i] for i in range(n)] if n != 3 else [[1], [2, 3], [4]],
            "score": np.arange(n, dtype=np.float64),
        },
        meta_info={"eos_token_id": 2, "temperature": 1.0, "metrics": {"x": [1.5]}},
    )


def assert_same(a: DataProto, b: DataProto) -> None:
    assert type(a) is type(b)
    assert (a.batch is None) == (b.batch is None)
    if a.batch is not None:
        assert set(a.batch.keys()) == set(b.batch.keys()) and a.batch.batch_size == b.batch.batch_size
        for k in a.batch.keys():
            assert a.batch[k].dtype == b.batch[k].dtype and torch.equal(a.batch[k], b.batch[k]), k
    assert a.non_tensor_batch.keys() == b.non_tensor_batch.keys()
    for k, v in a.non_tensor_batch.items():
        w = b.non_tensor_batch[k]
        assert v.dtype == w.dtype and v.shape == w.shape and v.tolist() == w.tolist(), k
    assert a.meta_info == b.meta_info


def test_to_tensordict_layout():
    d = DataProto.from_dict({"obs": torch.arange(6)}, {"labels": list("abcdef")}, {"name": "abdce"})
    td = d.to_tensordict()
    assert torch.equal(td["obs"], torch.arange(6))
    assert td["labels"] == list("abcdef")
    assert td["name"] == "abdce"


@pytest.mark.parametrize("n", [4, 3, 0])
def test_tensordict_round_trip_is_lossless(n):
    d = rollout_like(n)
    assert_same(d, DataProto.from_tensordict(d.to_tensordict()))
    nt_only = DataProto.from_dict(non_tensors={"u": [f"x{i}" for i in range(n)]}, meta_info={"k": 1})
    back = DataProto.from_tensordict(nt_only.to_tensordict())
    assert back.batch is None and back.non_tensor_batch["u"].tolist() == [f"x{i}" for i in range(n)]


def test_to_tensordict_refuses_key_clash():
    d = DataProto.from_dict({"obs": torch.arange(2)}, meta_info={"obs": 1})
    with pytest.raises(DataProtoError, match="clash"):
        d.to_tensordict()


def test_from_tensordict_built_by_get_tensordict():
    td = get_tensordict({"obs": torch.tensor([1, 2, 3]), "labels": ["a", "b", "c"]}, {"name": "abdce"})
    d = DataProto.from_tensordict(td, meta_info={"extra": True})
    assert d.non_tensor_batch["labels"].tolist() == ["a", "b", "c"]
    assert d.batch["obs"].tolist() == [1, 2, 3]
    assert d.meta_info == {"extra": True, "name": "abdce"}
    with pytest.raises(DataProtoError):
        get_tensordict({"obs": torch.zeros(3), "labels": ["a"]})


def test_serialize_single_tensor_all_dtypes():
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
              torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn]
    for dtype in dtypes:
        t = (torch.randn(3, 4, 5) * 10).to(dtype)
        name, shape, data = serialize_single_tensor(t)
        back = deserialize_single_tensor((name, shape, data))
        assert back.dtype == dtype and back.shape == t.shape
        assert torch.equal(back.view(torch.uint8), t.view(torch.uint8)), dtype
    empty = deserialize_single_tensor(serialize_single_tensor(torch.zeros(0, 3)))
    assert empty.shape == (0, 3)
    scalar = deserialize_single_tensor(serialize_single_tensor(torch.tensor(2.5)))
    assert scalar.shape == () and scalar.item() == 2.5
    strided = torch.arange(12).view(3, 4).t()  # non-contiguous input
    assert torch.equal(deserialize_single_tensor(serialize_single_tensor(strided)), strided)
    assert torch.equal(deserialize_single_tensor(("int64", (2,), bytes(16))), torch.zeros(2, dtype=torch.int64))


def test_deserialize_single_tensor_rejects_bad_input():
    with pytest.raises(DataProtoError, match="needs 24 bytes"):
        deserialize_single_tensor(("float32", (2, 3), np.zeros(10, dtype=np.uint8)))
    with pytest.raises(DataProtoError, match="unknown torch dtype"):
        deserialize_single_tensor(("float99", (1,), np.zeros(4, dtype=np.uint8)))


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_serialize_tensordict_regular_nested_and_device():
    td = TensorDict(
        {
            "f": torch.randn(2, 3),
            "i": torch.randint(0, 9, (2, 3)).int(),
            "b": torch.tensor([[True, False], [False, True]]),
            "h": torch.randn(2, 3).bfloat16(),
            "sub": TensorDict({"x": torch.arange(2)}, batch_size=[2]),
        },
        batch_size=(2,),
    )
    batch_size, device, items = serialize_tensordict(td)
    back = deserialize_tensordict((batch_size, device, items))
    assert back.batch_size == td.batch_size and device is None
    for key in td.keys(include_nested=True, leaves_only=True):
        assert back[key].dtype == td[key].dtype and torch.equal(back[key], td[key]), key

    nested = torch.nested.as_nested_tensor([torch.randn(2, 3), torch.randn(3, 4), torch.randn(1, 5)])
    td2 = TensorDict({"nested": nested, "regular": torch.randn(3, 4, 5)}, batch_size=(3,))
    back2 = deserialize_tensordict(serialize_tensordict(td2))
    assert back2["nested"].is_nested and back2["nested"].layout == nested.layout
    for a, b in zip(nested.unbind(), back2["nested"].unbind()):
        assert torch.equal(a, b)

    td3 = TensorDict({"t": torch.randn(2, 3, 4)}, batch_size=(2, 3), device="cpu")
    bs, dev, it = serialize_tensordict(td3)
    back3 = deserialize_tensordict((bs, dev, it))
    assert str(back3.device) == "cpu" and back3.batch_size == torch.Size([2, 3])
    assert torch.equal(back3["t"], td3["t"])


def test_pickle_round_trip_in_process():
    d = rollout_like()
    back = pickle.loads(pickle.dumps(d))
    assert_same(d, back)
    empty = pickle.loads(pickle.dumps(DataProto()))
    assert empty.batch is None and len(empty) == 0

    s = PickledSub.from_dict({"x": torch.arange(2)})
    assert type(pickle.loads(pickle.dumps(s))) is PickledSub


def test_save_and_load_from_disk_uses_wire(tmp_path):
    d = rollout_like()
    path = tmp_path / "batch.frame"
    d.save_to_disk(path)
    assert path.read_bytes()[:64] != pickle.dumps(d)[:64]
    back = DataProto.load_from_disk(path)
    assert_same(d, back)
    back.batch["responses"][0, 0] = -1  # the loaded tensors are writable
    assert back.batch["responses"][0, 0].item() == -1


def test_save_refuses_arbitrary_objects_and_writes_nothing(tmp_path):
    class Opaque:
        pass

    d = DataProto.from_dict({"x": torch.arange(2)}, {"o": [Opaque(), Opaque()]})
    path = tmp_path / "bad.frame"
    with pytest.raises(TypeError):
        d.save_to_disk(path)
    assert not path.exists()


def test_load_rejects_corrupt_file(tmp_path):
    path = tmp_path / "batch.frame"
    rollout_like().save_to_disk(path)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(WireError):
        DataProto.load_from_disk(path)
