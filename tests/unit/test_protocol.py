"""DataProto semantics, case by case after verl's documented behaviour (own tests)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from services.protocol import (
    DataProto,
    DataProtoError,
    DataProtoItem,
    union_numpy_dict,
    union_tensor_dict,
)


def make(n: int = 6, meta: dict | None = None) -> DataProto:
    """``obs`` = [1..n] int64, ``labels`` = 'a','b',... object column."""
    return DataProto.from_dict(
        tensors={"obs": torch.arange(1, n + 1)},
        non_tensors={"labels": [chr(ord("a") + i) for i in range(n)]},
        meta_info=dict(meta or {"name": "abc"}),
    )


# ---------------------------------------------------------------- construction
def test_from_dict_types_and_batch_size():
    d = DataProto.from_dict(
        tensors={"input_ids": torch.zeros(4, 7, dtype=torch.int64), "old_log_probs": torch.zeros(4, 3)},
        non_tensors={"uid": ["u0", "u0", "u1", "u1"], "reward_model": [{"ground_truth": "1"}] * 4},
        meta_info={"eos_token_id": 2},
    )
    assert isinstance(d.batch, TensorDict)
    assert d.batch.batch_size == torch.Size([4])
    assert all(v.dtype == object and isinstance(v, np.ndarray) for v in d.non_tensor_batch.values())
    assert d.non_tensor_batch["reward_model"][2] == {"ground_truth": "1"}
    assert len(d) == 4 and d.meta_info == {"eos_token_id": 2}


def test_from_dict_rejects_mismatched_batch_sizes():
    with pytest.raises(AssertionError, match="same batch size"):
        DataProto.from_dict(tensors={"a": torch.zeros(3), "b": torch.zeros(4)})
    with pytest.raises(DataProtoError, match="not equal to batch size"):
        DataProto.from_dict(tensors={"a": torch.zeros(3)}, non_tensors={"u": ["x", "y"]})


def test_from_dict_num_batch_dims_other_than_one_fails_like_verl():
    obs, act = torch.randn(10, 5), torch.randn(10, 5, 3)
    assert DataProto.from_dict(tensors={"obs": obs, "act": act}).batch.batch_size == torch.Size([10])
    with pytest.raises(AssertionError):
        DataProto.from_dict(tensors={"obs": obs, "act": act}, num_batch_dims=2)
    with pytest.raises(AssertionError):
        DataProto.from_dict(tensors={"obs": obs, "act": act}, num_batch_dims=3)
    with pytest.raises(AssertionError):
        DataProto.from_dict(tensors={"obs": obs}, num_batch_dims=0)


def test_constructor_checks_consistency():
    with pytest.raises(DataProtoError, match="numpy.array"):
        DataProto(batch=None, non_tensor_batch={"u": ["x"]})
    td = TensorDict({"a": torch.zeros(2)}, batch_size=[2])
    with pytest.raises(DataProtoError, match="length 3"):
        DataProto(batch=td, non_tensor_batch={"u": np.array(["x", "y", "z"], dtype=object)})
    with pytest.raises(DataProtoError, match="num_batch_dims=1"):
        DataProto(batch=TensorDict({"a": torch.zeros(2, 2)}, batch_size=[2, 2]))


def test_from_single_dict_splits_and_respects_subclass():
    class MyProto(DataProto):
        pass

    d = MyProto.from_single_dict({"x": torch.arange(3), "s": np.array(["a", "b", "c"], dtype=object)}, meta_info={"k": 1})
    assert type(d) is MyProto
    assert list(d.batch.keys()) == ["x"] and list(d.non_tensor_batch) == ["s"]
    with pytest.raises(DataProtoError, match="Unsupported type"):
        DataProto.from_single_dict({"x": [1, 2, 3]})
    assert type(d.slice(0, 2)) is MyProto and type(d.repeat(2)) is MyProto
    assert type(MyProto.concat([d, d])) is MyProto


def test_len_variants():
    labels = np.array(["a", "b", "c"], dtype=object)
    assert len(make(3)) == 3
    assert len(DataProto(batch=None, non_tensor_batch={"labels": labels})) == 3
    assert len(DataProto(batch=None, non_tensor_batch={}, meta_info={"i": 1})) == 0
    assert len(DataProto(batch=None, non_tensor_batch=None, meta_info={"i": 1})) == 0


# ---------------------------------------------------------------- indexing
def test_int_index_returns_item():
    d = make(4)
    item = d[1]
    assert isinstance(item, DataProtoItem)
    assert item.batch["obs"].item() == 2 and item.non_tensor_batch["labels"] == "b"
    assert item.meta_info is d.meta_info
    assert d[-1].non_tensor_batch["labels"] == "d"
    assert d[np.int64(2)].batch["obs"].item() == 3
    with pytest.raises(IndexError):
        d[4]
    with pytest.raises(TypeError):
        d["obs"]


@pytest.mark.parametrize(
    "index",
    [
        [3, 0, 3],
        np.array([3, 0, 3]),
        torch.tensor([3, 0, 3]),
        [True, False, True, False, False, True],
        np.array([True, False, True, False, False, True]),
        torch.tensor([True, False, True, False, False, True]),
    ],
    ids=["list", "np-int", "torch-int", "list-bool", "np-bool", "torch-bool"],
)
def test_array_indexing(index):
    d = make(6)
    sel = d[index]
    as_np = index.numpy() if isinstance(index, torch.Tensor) else np.asarray(index)
    expected = np.arange(1, 7)[as_np]
    assert isinstance(sel, DataProto)
    assert sel.batch["obs"].tolist() == expected.tolist()
    assert sel.non_tensor_batch["labels"].tolist() == [chr(ord("a") + i - 1) for i in expected]
    assert isinstance(sel.batch.batch_size, torch.Size)
    assert all(isinstance(s, int) for s in sel.batch.batch_size)
    assert sel.meta_info == d.meta_info


def test_bad_mask_and_out_of_range_indices():
    d = make(4)
    with pytest.raises(DataProtoError, match="mask"):
        d[np.array([True, False])]
    with pytest.raises(IndexError):
        d[[0, 9]]


def test_slices_are_views_and_keep_meta():
    d = make(6)
    s = d[1:5:2]
    assert s.batch["obs"].tolist() == [2, 4]
    assert s.non_tensor_batch["labels"].tolist() == ["b", "d"]
    assert d.slice(4).batch["obs"].tolist() == [5, 6]
    s2 = d[2:4]
    s2.batch["obs"][0] = 100
    assert d.batch["obs"][2].item() == 100


def test_select_idxs_without_batch():
    d = DataProto.from_dict(non_tensors={"labels": ["a", "b", "c"]})
    assert d.select_idxs([2, 0]).non_tensor_batch["labels"].tolist() == ["c", "a"]
    assert d.select_idxs([2, 0]).batch is None


# ---------------------------------------------------------------- keys
def test_select_keys_and_deepcopy():
    d = DataProto.from_dict(
        tensors={"a": torch.zeros(2), "b": torch.ones(2)},
        non_tensors={"u": ["x", "y"], "v": [{"x": 1}, {"x": 2}]},
        meta_info={"m1": [1], "m2": 2},
    )
    s = d.select(batch_keys=["a"], non_tensor_batch_keys=["v"], meta_info_keys=["m1"])
    assert list(s.batch.keys()) == ["a"] and list(s.non_tensor_batch) == ["v"] and s.meta_info == {"m1": [1]}
    s.batch["a"][0] = 5
    s.meta_info["m1"].append(9)
    assert d.batch["a"][0].item() == 5 and d.meta_info["m1"] == [1, 9]
    c = d.select(batch_keys=["a"], non_tensor_batch_keys=["v"], meta_info_keys=["m1"], deepcopy=True)
    c.batch["a"][1] = 7
    c.non_tensor_batch["v"][0]["x"] = 3
    c.meta_info["m1"].append(4)
    assert d.batch["a"][1].item() == 0 and d.non_tensor_batch["v"][0] == {"x": 1} and d.meta_info["m1"] == [1, 9]
    with pytest.raises(DataProtoError, match="not found"):
        d.select(batch_keys=["nope"])


def test_pop_moves_keys():
    d = DataProto.from_dict(
        {"obs": torch.randn(5, 2), "act": torch.randn(5)}, non_tensors={"u": list("abcde")}, meta_info={"2": 2, "1": 1}
    )
    p = d.pop(batch_keys=["obs"], non_tensor_batch_keys=["u"], meta_info_keys=["2"])
    assert set(p.batch.keys()) == {"obs"} and set(p.non_tensor_batch) == {"u"} and p.meta_info == {"2": 2}
    assert set(d.batch.keys()) == {"act"} and d.non_tensor_batch == {} and d.meta_info == {"1": 1}
    with pytest.raises(DataProtoError, match="not found"):
        d.pop(batch_keys=["obs"])
    assert set(d.batch.keys()) == {"act"}  # a failed pop removes nothing


def test_pop_without_batch():
    d = DataProto.from_dict(non_tensors={"labels": ["a", "b", "c"]}, meta_info={"info": "x"})
    p = d.pop(non_tensor_batch_keys=["labels"])
    assert p.non_tensor_batch["labels"].tolist() == ["a", "b", "c"] and d.non_tensor_batch == {}


def test_rename():
    d = DataProto.from_dict({"a": torch.zeros(2), "b": torch.ones(2)})
    assert d.rename("a", "x") is d
    d.rename(old_keys=["x", "b"], new_keys=["y", "z"])
    assert set(d.batch.keys()) == {"y", "z"}
    d.rename(["y", "z"], ["z", "y"])  # a swap
    assert d.batch["y"].tolist() == [1.0, 1.0] and d.batch["z"].tolist() == [0.0, 0.0]
    with pytest.raises(DataProtoError, match="already exist"):
        d.rename("y", "z")
    with pytest.raises(ValueError):
        d.rename(["y"], ["p", "q"])
    with pytest.raises(TypeError):
        d.rename(1, 2)


def test_union_merges_and_refuses_conflicts():
    shared = torch.randn(4)
    a = DataProto.from_dict({"obs": shared, "act": torch.randn(4)}, {"u": list("abcd")}, {"k": 1})
    b = DataProto.from_dict({"obs": shared, "rew": torch.randn(4)}, {"u": list("abcd"), "v": list("wxyz")}, {"j": 2})
    out = a.union(b)
    assert out is a
    assert set(a.batch.keys()) == {"obs", "act", "rew"} and set(a.non_tensor_batch) == {"u", "v"}
    assert a.meta_info == {"k": 1, "j": 2}
    with pytest.raises(AssertionError, match="not the same object"):
        a.union(DataProto.from_dict({"obs": shared + 1}))
    with pytest.raises(AssertionError, match="not the same object"):
        a.union(DataProto.from_dict({"obs": shared}, {"u": list("abcX")}))
    with pytest.raises(AssertionError):
        a.union(DataProto.from_dict({"obs": shared}, meta_info={"k": 5}))
    with pytest.raises(AssertionError):
        a.union(DataProto.from_dict({"x": torch.zeros(3)}))


def test_union_tensor_dict_and_numpy_dict():
    obs = torch.randn(10, 3)
    d1 = TensorDict({"obs": obs, "act": torch.randn(10)}, batch_size=[10])
    union_tensor_dict(d1, TensorDict({"obs": obs, "rew": torch.randn(10)}, batch_size=[10]))
    assert set(d1.keys()) == {"obs", "act", "rew"}
    with pytest.raises(AssertionError):
        union_tensor_dict(d1, TensorDict({"obs": obs + 1}, batch_size=[10]))
    with pytest.raises(AssertionError, match="identical batch size"):
        union_tensor_dict(d1, TensorDict({"z": torch.zeros(3)}, batch_size=[3]))

    nan = np.array([1.0, np.nan, 3.0])
    union_numpy_dict({"d": nan}, {"d": np.array([1.0, np.nan, 3.0])})  # NaN == NaN here
    with pytest.raises(AssertionError, match="`d` in tensor_dict1 and tensor_dict2 are not the same object."):
        union_numpy_dict({"d": nan}, {"d": np.array([np.nan, 1.0, 3.0])})
    obj = np.array([1, "hi", np.array([2, 3])], dtype=object)
    union_numpy_dict({"o": obj}, {"o": np.array([1, "hi", np.array([2, 3])], dtype=object)})
    with pytest.raises(AssertionError):
        union_numpy_dict({"o": obj}, {"o": np.array([1, "hi", np.array([2, 4])], dtype=object)})
    mixed = np.array([float("nan"), "nan"], dtype=object)
    union_numpy_dict({"m": mixed}, {"m": mixed.copy()})
    circ1, circ2 = np.array([None], dtype=object), np.array([None], dtype=object)
    circ1[0], circ2[0] = circ1, circ2
    union_numpy_dict({"c": circ1}, {"c": circ2})
    with pytest.raises(AssertionError):
        union_numpy_dict({"c": circ1}, {"c": np.array([None], dtype=object)})


def test_reorder_in_place():
    d = make(6, {"name": "abdce"})
    d.reorder(torch.tensor([3, 4, 2, 0, 1, 5]))
    assert d.batch["obs"].tolist() == [4, 5, 3, 1, 2, 6]
    assert d.non_tensor_batch["labels"].tolist() == ["d", "e", "c", "a", "b", "f"]
    assert d.meta_info == {"name": "abdce"}


# ---------------------------------------------------------------- split / join
def test_chunk_concat_round_trip_and_uneven_error():
    d = make(6, {"name": "abdce"})
    with pytest.raises(AssertionError, match="only support equal chunk"):
        d.chunk(5)
    parts = d.chunk(2)
    assert [p.batch["obs"].tolist() for p in parts] == [[1, 2, 3], [4, 5, 6]]
    assert parts[1].non_tensor_batch["labels"].tolist() == ["d", "e", "f"]
    assert all(p.meta_info == {"name": "abdce"} for p in parts)
    back = DataProto.concat(parts)
    assert torch.equal(back.batch["obs"], d.batch["obs"])
    assert back.non_tensor_batch["labels"].tolist() == d.non_tensor_batch["labels"].tolist()
    assert back.meta_info == d.meta_info


def test_chunk_non_tensor_only():
    d = DataProto.from_dict(non_tensors={"l": list("abcd")})
    assert [p.non_tensor_batch["l"].tolist() for p in d.chunk(2)] == [["a", "b"], ["c", "d"]]


def test_split_handles_uneven():
    parts = make(5).split(2)
    assert [p.batch["obs"].tolist() for p in parts] == [[1, 2], [3, 4], [5]]
    with pytest.raises(DataProtoError):
        make(5).split(0)


def test_concat_merges_metrics_from_workers():
    workers = [
        DataProto.from_dict({"obs": torch.tensor([1, 2])}, meta_info={"metrics": [{"loss": 0.5, "acc": 0.9}], "flag": True}),
        DataProto.from_dict({"obs": torch.tensor([3, 4])}, meta_info={"metrics": {"loss": 0.6, "acc": 0.8}, "flag": True}),
        DataProto.from_dict({"obs": torch.tensor([5, 6])}, meta_info={"flag": True}),
    ]
    out = DataProto.concat(workers)
    assert out.batch["obs"].tolist() == [1, 2, 3, 4, 5, 6]
    assert out.meta_info["metrics"] == {"loss": [0.5, 0.6], "acc": [0.9, 0.8]}
    assert out.meta_info["flag"] is True
    # first worker without metrics: the others' are kept
    out = DataProto.concat(workers[::-1])
    assert out.meta_info["metrics"] == {"loss": [0.6, 0.5], "acc": [0.8, 0.9]}


def test_concat_merges_distinct_meta_keys_and_refuses_conflicts():
    a = DataProto.from_dict({"obs": torch.tensor([1])}, meta_info={"config": "A", "shared": "X"})
    b = DataProto.from_dict({"obs": torch.tensor([2])}, meta_info={"extra": "B", "shared": "X"})
    out = DataProto.concat([a, b])
    assert out.meta_info == {"config": "A", "shared": "X", "extra": "B"}
    c = DataProto.from_dict({"obs": torch.tensor([3])}, meta_info={"config": "B"})
    with pytest.raises(AssertionError, match="Conflicting values for meta_info key 'config'"):
        DataProto.concat([a, c])


def test_concat_refuses_mismatched_columns():
    a = make(2)
    with pytest.raises(DataProtoError, match="keys differ"):
        DataProto.concat([a, DataProto.from_dict({"obs": torch.tensor([1])}, {"other": ["z"]})])
    with pytest.raises(DataProtoError):
        DataProto.concat([a, DataProto.from_dict(non_tensors={"labels": ["z"]})])
    with pytest.raises(DataProtoError, match="batch keys differ"):
        DataProto.concat([a, DataProto.from_dict({"act": torch.tensor([1])}, {"labels": ["z"]})])
    assert len(DataProto.concat([])) == 0


# ---------------------------------------------------------------- repeats
def test_repeat_interleave_rules():
    d = DataProto.from_dict({"obs": torch.tensor([[1, 2], [3, 4], [5, 6]])}, {"labels": ["a", "b", "c"]}, {"info": "t"})
    inter = d.repeat(repeat_times=2, interleave=True)
    assert inter.batch["obs"].tolist() == [[1, 2], [1, 2], [3, 4], [3, 4], [5, 6], [5, 6]]
    assert inter.non_tensor_batch["labels"].tolist() == ["a", "a", "b", "b", "c", "c"]
    tiled = d.repeat(repeat_times=2, interleave=False)
    assert tiled.batch["obs"].tolist() == [[1, 2], [3, 4], [5, 6], [1, 2], [3, 4], [5, 6]]
    assert tiled.non_tensor_batch["labels"].tolist() == ["a", "b", "c", "a", "b", "c"]
    assert inter.meta_info == tiled.meta_info == {"info": "t"}
    assert d.repeat().batch["obs"].shape[0] == 6  # defaults: 2 times, interleaved
    assert d.repeat().non_tensor_batch["labels"].tolist()[:2] == ["a", "a"]
    # the repeated rows are copies, not views of one row
    inter.batch["obs"][0, 0] = 99
    assert inter.batch["obs"][1, 0].item() == 1 and d.batch["obs"][0, 0].item() == 1


def test_sample_level_repeat():
    d = DataProto.from_dict({"obs": torch.tensor([[1, 2], [3, 4], [5, 6]])}, {"labels": ["a", "b", "c"]}, {"info": "t"})
    r = d.sample_level_repeat(repeat_times=[3, 1, 2])
    assert r.batch["obs"].tolist() == [[1, 2]] * 3 + [[3, 4]] + [[5, 6]] * 2
    assert r.non_tensor_batch["labels"].tolist() == ["a", "a", "a", "b", "c", "c"]
    r = d.sample_level_repeat(repeat_times=torch.tensor([1, 2, 3]))
    assert r.non_tensor_batch["labels"].tolist() == ["a", "b", "b", "c", "c", "c"]
    assert d.sample_level_repeat((0, 1, 0)).non_tensor_batch["labels"].tolist() == ["b"]
    assert len(d.sample_level_repeat(np.array([2, 2, 2]))) == 6
    with pytest.raises(DataProtoError):
        d.sample_level_repeat([1, 2])
    with pytest.raises(DataProtoError):
        d.sample_level_repeat(3)


def test_unfold_column_chunks():
    obs1 = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
    obs2 = torch.tensor([[1, 2], [5, 6], [9, 10]])
    d = DataProto.from_dict({"obs1": obs1, "obs2": obs2}, {"labels": [["a1", "a2"], ["b1", "b2"], ["c1", "c2"]]}, {"n": 1})
    r = d.unfold_column_chunks(2, split_keys=["obs1", "labels"])
    assert r.batch["obs1"].tolist() == [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12]]
    assert r.batch["obs2"].tolist() == [[1, 2], [1, 2], [5, 6], [5, 6], [9, 10], [9, 10]]
    assert r.non_tensor_batch["labels"].tolist() == [["a1"], ["a2"], ["b1"], ["b2"], ["c1"], ["c2"]]
    r = d.unfold_column_chunks(2, split_keys=["obs1"])
    assert r.non_tensor_batch["labels"].shape == (6, 2)
    with pytest.raises(DataProtoError, match="divisible"):
        d.unfold_column_chunks(3, split_keys=["obs1"])


# ---------------------------------------------------------------- iteration, device, info
def test_make_iterator_is_reproducible_with_seed():
    n = 20
    d = DataProto.from_dict({"obs": torch.arange(n)}, {"labels": [str(i) for i in range(n)]}, {"k": "v"})

    def run(seed):
        it = d.make_iterator(mini_batch_size=5, epochs=2, seed=seed, dataloader_kwargs={"shuffle": True})
        return [m for m in it]

    a, b, c = run(1), run(1), run(2)
    assert len(a) == 8 and all(isinstance(m, DataProto) and len(m) == 5 for m in a)
    assert all(m.meta_info == {"k": "v"} for m in a)
    assert [m.batch["obs"].tolist() for m in a] == [m.batch["obs"].tolist() for m in b]
    assert [m.batch["obs"].tolist() for m in a] != [m.batch["obs"].tolist() for m in c]
    for m in a:  # rows stay aligned
        assert m.non_tensor_batch["labels"].tolist() == [str(x) for x in m.batch["obs"].tolist()]
    assert sorted(x for m in a[:4] for x in m.batch["obs"].tolist()) == list(range(n))
    plain = [m.batch["obs"].tolist() for m in d.make_iterator(mini_batch_size=10, epochs=1)]
    assert plain == [list(range(10)), list(range(10, 20))]
    with pytest.raises(AssertionError):
        d.make_iterator(mini_batch_size=3, epochs=1)


def test_to_device_returns_self():
    d = make(2)
    assert d.to("cpu") is d and d.batch.device == torch.device("cpu")


def test_print_size_and_data_info(capsys):
    d = DataProto.from_dict({"a": torch.zeros(4, 256, dtype=torch.float32)}, {"u": list("abcd")}, {"m": {"x": [1]}})
    msg = d.print_size(prefix="step 1")
    assert capsys.readouterr().out.strip() == msg
    assert msg.startswith("step 1, Size of tensordict: ") and str(4 * 256 * 4 / 1024**3) in msg
    info = d.get_data_info()
    assert "a: (4, 256) (torch.float32)" in info and "u: ndarray(4,) (object)" in info
    assert "m: dict[str: list[int]]" in info


def test_failed_union_changes_nothing():
    a = DataProto.from_dict({"obs": torch.arange(3)}, {"u": list("abc")}, {"k": 1})
    b = DataProto.from_dict({"new": torch.ones(3), "obs": torch.arange(3) + 1}, {"v": list("xyz")}, {"j": 2})
    with pytest.raises(AssertionError):
        a.union(b)
    assert set(a.batch.keys()) == {"obs"} and set(a.non_tensor_batch) == {"u"} and a.meta_info == {"k": 1}
    c = DataProto.from_dict({"new": torch.ones(3)}, {"v": list("xyz")}, {"k": 2})
    with pytest.raises(AssertionError):
        a.union(c)
    assert set(a.batch.keys()) == {"obs"} and set(a.non_tensor_batch) == {"u"} and a.meta_info == {"k": 1}
    batch_before = a.batch
    a.union(DataProto.from_dict({"new": torch.ones(3)}, meta_info={"k": 1.0}))
    assert a.batch is batch_before and set(batch_before.keys()) == {"obs", "new"}  # merged in place, as verl
    assert DataProto().union(a) is not None


def test_concat_meta_equality_is_value_based():
    a = DataProto.from_dict({"obs": torch.tensor([1])}, meta_info={"t": 1, "arr": np.array([1.0, np.nan]), "d": {"x": [1]}})
    b = DataProto.from_dict({"obs": torch.tensor([2])}, meta_info={"t": 1.0, "arr": np.array([1.0, np.nan]), "d": {"x": [1]}})
    assert DataProto.concat([a, b]).meta_info["t"] == 1
    c = DataProto.from_dict({"obs": torch.tensor([2])}, meta_info={"arr": np.array([1.0, 2.0])})
    with pytest.raises(AssertionError, match="Conflicting values for meta_info key 'arr'"):
        DataProto.concat([a, c])


def test_collate_items_back_into_a_batch():
    from torch.utils.data import DataLoader

    from services.protocol import collate_fn

    d = make(6)
    loaded = list(DataLoader(d, batch_size=4, collate_fn=collate_fn))  # a DataProto is a map-style dataset
    assert [m.batch["obs"].tolist() for m in loaded] == [[1, 2, 3, 4], [5, 6]]
    assert loaded[1].non_tensor_batch["labels"].tolist() == ["e", "f"]
