"""Property tests: DataProto row operations agree with numpy indexing on random batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from services.protocol import DataProto, DataProtoConfig, pad_dataproto_to_divisor, unpad_dataproto

FAST = settings(max_examples=40, deadline=None)


def make(n: int) -> DataProto:
    """Row i: ``row`` = i (int64), ``vec`` = [i, -i] (float32), ``tag`` = "t{i}", ``obj`` = {"i": i}."""
    return DataProto.from_dict(
        {"row": torch.arange(n), "vec": torch.stack([torch.arange(n), -torch.arange(n)], 1).float()},
        {"tag": [f"t{i}" for i in range(n)], "obj": [{"i": i} for i in range(n)]},
        {"m": 1},
    )


def rows(d: DataProto) -> list[int]:
    """Row ids, after checking every column agrees with them."""
    ids = d.batch["row"].tolist()
    assert d.batch["vec"][:, 0].long().tolist() == ids and (-d.batch["vec"][:, 1]).long().tolist() == ids
    assert d.non_tensor_batch["tag"].tolist() == [f"t{i}" for i in ids]
    assert [o["i"] for o in d.non_tensor_batch["obj"]] == ids
    return ids


@FAST
@given(n=st.integers(0, 12), data=st.data())
def test_index_lists_and_masks_match_numpy(n, data):
    d = make(n)
    if n:
        idx = data.draw(st.lists(st.integers(-n, n - 1), max_size=15))
        assert rows(d[idx]) == np.arange(n)[np.asarray(idx, dtype=np.int64)].tolist()
        assert rows(d[torch.tensor(idx, dtype=torch.int64)]) == rows(d[np.asarray(idx, dtype=np.int64)])
    mask = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    assert rows(d[np.asarray(mask, dtype=bool)]) == [i for i in range(n) if mask[i]]
    start, stop = data.draw(st.integers(-n - 2, n + 2)), data.draw(st.integers(-n - 2, n + 2))
    step = data.draw(st.sampled_from([None, 1, 2, 3]))
    assert rows(d[start:stop:step]) == list(range(n))[start:stop:step]


@FAST
@given(n=st.integers(0, 12), k=st.integers(1, 5))
def test_chunk_then_concat_is_identity(n, k):
    n = n * k  # divisible: allowed without padding
    parts = make(n).chunk(k)
    assert len(parts) == k and all(len(p) == n // k for p in parts)
    assert rows(DataProto.concat(parts)) == list(range(n))


@FAST
@given(n=st.integers(1, 20), k=st.integers(1, 7))
def test_padded_chunking_keeps_every_row_once(n, k):
    DataProtoConfig.auto_padding = True
    try:
        parts = make(n).chunk(k)
    finally:
        DataProtoConfig.auto_padding = False
    assert len(parts) == k
    assert rows(DataProto.concat(parts)) == list(range(n))


@FAST
@given(n=st.integers(0, 20), k=st.integers(1, 9))
def test_pad_unpad_round_trip(n, k):
    d = make(n)
    padded, pad = pad_dataproto_to_divisor(d, k)
    if n:
        assert len(padded) % k == 0 and 0 <= pad < k
        assert rows(padded) == (list(range(n)) * (pad // n + 2))[: n + pad]
    assert rows(unpad_dataproto(padded, pad)) == list(range(n))


@FAST
@given(n=st.integers(0, 10), r=st.integers(0, 4), interleave=st.booleans())
def test_repeat_layout(n, r, interleave):
    got = rows(make(n).repeat(repeat_times=r, interleave=interleave))
    expected = np.repeat(np.arange(n), r) if interleave else np.tile(np.arange(n), r)
    assert got == expected.tolist()


@FAST
@given(counts=st.lists(st.integers(0, 4), max_size=10))
def test_sample_level_repeat_matches_np_repeat(counts):
    d = make(len(counts))
    assert rows(d.sample_level_repeat(counts)) == np.repeat(np.arange(len(counts)), counts).tolist()


@FAST
@given(n=st.integers(0, 15), size=st.integers(1, 6))
def test_split_sizes(n, size):
    parts = make(n).split(size)
    assert [len(p) for p in parts] == [min(size, n - i) for i in range(0, n, size)]
    if n:
        assert rows(DataProto.concat(parts)) == list(range(n))


@FAST
@given(n=st.integers(0, 8))
def test_tensordict_round_trip(n):
    d = make(n)
    back = DataProto.from_tensordict(d.to_tensordict())
    assert rows(back) == list(range(n)) and back.meta_info == {"m": 1}
    assert back.batch["vec"].dtype == torch.float32


@pytest.mark.parametrize("n", [0, 1, 5])
def test_make_iterator_covers_each_row_once_per_epoch(n):
    d = make(n * 2)
    seen = [rows(m) for m in d.make_iterator(mini_batch_size=2, epochs=2, seed=3, dataloader_kwargs={"shuffle": True})]
    flat = [i for m in seen for i in m]
    assert sorted(flat[: 2 * n]) == list(range(2 * n)) and sorted(flat[2 * n:]) == list(range(2 * n))
