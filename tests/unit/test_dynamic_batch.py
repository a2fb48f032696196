"""trainer_svc.dynamic_batch: verl's prepare_dynamic_batch / restore_dynamic_batch."""

from __future__ import annotations

import datetime
import json
import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from services.protocol import DataProto
from trainer_svc.dynamic_batch import (
    get_reverse_idx,
    get_seqlen_balanced_partitions,
    prepare_dynamic_batch,
    rearrange_micro_batches,
    restore_dynamic_batch,
)


def batch_with_lengths(lengths: list[int], width: int = 10) -> DataProto:
    n = len(lengths)
    mask = torch.zeros(n, width, dtype=torch.int64)
    for i, length in enumerate(lengths):
        mask[i, width - length :] = 1
    return DataProto.from_dict(
        tensors={"attention_mask": mask, "row": torch.arange(n, dtype=torch.float32).unsqueeze(1).repeat(1, width)},
        non_tensors={"uid": np.array([f"u{i}" for i in range(n)], dtype=object)},
        meta_info={"temperature": 0.7},
    )


LENGTHS = [9, 2, 7, 3, 5, 5, 1, 8]  # 40 tokens


def test_micro_batches_respect_budget_cover_all_rows_and_balance() -> None:
    data = batch_with_lengths(LENGTHS)
    micro, idx_list = prepare_dynamic_batch(data, max_token_len=10)
    assert sorted(i for idx in idx_list for i in idx) == list(range(len(LENGTHS)))
    sums = [sum(LENGTHS[i] for i in idx) for idx in idx_list]
    assert len(micro) == 4  # first-fit needs 4 bins of 10 for these 40 tokens
    assert max(sums) <= 10 and max(sums) - min(sums) <= 1
    for mb, idx in zip(micro, idx_list):
        assert mb.batch["row"][:, 0].tolist() == [float(i) for i in idx]
        assert mb.non_tensor_batch["uid"].tolist() == [f"u{i}" for i in idx]
        assert mb.meta_info == {"temperature": 0.7}
    assert micro[0].meta_info is not data.meta_info


def test_restore_puts_results_back_in_original_order() -> None:
    data = batch_with_lengths(LENGTHS)
    micro, idx_list = prepare_dynamic_batch(data, max_token_len=12)
    # a per-row "log-prob" computed per micro-batch, then concatenated
    results = torch.cat([mb.batch["row"][:, :3] * 2 for mb in micro])
    restored = restore_dynamic_batch(results, idx_list)
    assert torch.equal(restored, data.batch["row"][:, :3] * 2)
    with pytest.raises(ValueError, match="rows"):
        restore_dynamic_batch(results[:-1], idx_list)


def test_counts_options_and_errors() -> None:
    data = batch_with_lengths(LENGTHS)
    _, idx = rearrange_micro_batches(data.batch, max_token_len=40)
    assert len(idx) == 1
    _, idx = rearrange_micro_batches(data.batch, max_token_len=40, min_num_micro_batch=3)
    assert len(idx) == 3
    _, idx = rearrange_micro_batches(data.batch, max_token_len=10, num_batches_divided_by=3)
    assert len(idx) == 6
    _, idx = rearrange_micro_batches(data.batch, max_token_len=40, min_num_micro_batch=100)
    assert len(idx) == len(LENGTHS)  # never more micro-batches than rows
    with pytest.raises(ValueError, match="max_token_len=8"):
        rearrange_micro_batches(data.batch, max_token_len=8)
    assert get_seqlen_balanced_partitions([4, 4, 1, 1], 2, equal_size=True) in ([[0, 2], [1, 3]], [[0, 3], [1, 2]])
    assert get_reverse_idx([2, 0, 1]) == [1, 2, 0]
    with pytest.raises(ValueError, match="exactly once"):
        get_reverse_idx([0, 0, 1])


WORLD = 2


def _free_port() -> int:
    from services.net import free_port

    return free_port()


def _rank(rank: int, port: int, out_dir: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )
    # rank 0 needs 1 micro-batch on its own, rank 1 needs 4: both must use 4
    data = batch_with_lengths([3, 3, 2, 2] if rank == 0 else LENGTHS)
    micro, idx_list = prepare_dynamic_batch(data, max_token_len=10, dp_group=dist.group.WORLD)
    # fewer rows on rank 0 than the agreed count: both settle on its row count
    short = batch_with_lengths([3, 3] if rank == 0 else LENGTHS)
    short_micro, _ = prepare_dynamic_batch(short, max_token_len=10, dp_group=dist.group.WORLD)
    capped, _ = prepare_dynamic_batch(data, max_token_len=10, dp_group=dist.group.WORLD, same_micro_num_in_dp=False)
    result = {"count": len(micro), "short": len(short_micro), "alone": len(capped), "idx": idx_list}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_ranks_agree_on_the_number_of_micro_batches(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, str(tmp_path))) for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=90)
            assert p.exitcode == 0, f"rank exited with {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    r0 = json.loads((tmp_path / "rank0.json").read_text())
    r1 = json.loads((tmp_path / "rank1.json").read_text())
    assert r0["count"] == r1["count"] == 4
    assert sorted(i for idx in r0["idx"] for i in idx) == [0, 1, 2, 3]
    # rank 1 needs 4 micro-batches but the short rank 0 holds only 2 rows: both use 2, so
    # every rank still runs the same number of forward passes
    assert r0["short"] == r1["short"] == 2
    assert r0["alone"] == 1 and r1["alone"] == 4
