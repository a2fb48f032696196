"""all_gather_data_proto across 2 real processes (torch.distributed, gloo, loopback TCP)."""

from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

WORLD = 2
JOIN_DEADLINE_S = 120


def _free_port() -> int:
    from services.net import free_port

    return free_port()


def _wait_for(path: Path, deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if path.exists():
            return True
        time.sleep(0.05)
    return False


def _worker(rank: int, port: int, out_dir: str) -> None:
    """Rank 0 holds 3 rows, rank 1 holds 2; both gather, then rank 0 checks the deadline."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist

    from services.protocol import DataProto, all_gather_data_proto

    torch.set_num_threads(1)
    out = Path(out_dir)
    result: dict = {"rank": rank}
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )
    n = 3 if rank == 0 else 2
    data = DataProto.from_dict(
        tensors={
            "input_ids": torch.full((n, 4), rank, dtype=torch.int64),
            "old_log_probs": torch.arange(n, dtype=torch.float32).unsqueeze(1).repeat(1, 4) + 10 * rank,
            "policy_version": torch.full((n,), 7, dtype=torch.int64),
        },
        non_tensors={"sample_id": [f"r{rank}-{i}" for i in range(n)], "reward_model": [{"rank": rank}] * n},
        meta_info={"local_rank": rank},
    )
    returned = all_gather_data_proto(data=data, process_group=None, timeout=60)
    result["returned_none"] = returned is None
    result["len"] = len(data)
    result["ids_first_col"] = data.batch["input_ids"][:, 0].tolist()
    result["old_log_probs"] = data.batch["old_log_probs"][:, 0].tolist()
    result["sample_id"] = data.non_tensor_batch["sample_id"].tolist()
    result["reward_model"] = data.non_tensor_batch["reward_model"].tolist()
    result["meta"] = data.meta_info
    result["dtypes"] = {k: str(v.dtype) for k, v in data.batch.items()}

    if rank == 0:
        # rank 1 never joins this collective: the gather must give up at its deadline
        try:
            all_gather_data_proto(data=DataProto.from_dict({"x": torch.zeros(1)}), process_group=None, timeout=1.0)
            result["deadline"] = "returned"
        except RuntimeError as exc:
            result["deadline"] = f"raised: {type(exc).__name__}: {exc}"[:300]
        (out / "rank0.json").write_text(json.dumps(result))
        (out / "release").touch()
        os._exit(0)  # the abandoned collective must not block interpreter shutdown
    (out / "rank1.json").write_text(json.dumps(result))
    _wait_for(out / "release", 60)
    os._exit(0)


def test_all_gather_data_proto_two_gloo_ranks(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(rank, port, str(tmp_path)), daemon=True) for rank in range(WORLD)]
    for p in procs:
        p.start()
    try:
        end = time.monotonic() + JOIN_DEADLINE_S
        for p in procs:
            p.join(timeout=max(0.1, end - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    results = {}
    for rank in range(WORLD):
        f = tmp_path / f"rank{rank}.json"
        assert f.exists(), f"rank {rank} produced no result (exit code {procs[rank].exitcode})"
        results[rank] = json.loads(f.read_text())
    for rank, r in results.items():
        assert r["returned_none"] and r["len"] == 5
        assert r["ids_first_col"] == [0, 0, 0, 1, 1]
        assert r["old_log_probs"] == [0.0, 1.0, 2.0, 10.0, 11.0]
        assert r["sample_id"] == ["r0-0", "r0-1", "r0-2", "r1-0", "r1-1"]
        assert r["reward_model"] == [{"rank": 0}] * 3 + [{"rank": 1}] * 2
        assert r["meta"] == {"local_rank": rank}  # meta_info stays local
        assert r["dtypes"] == {"input_ids": "torch.int64", "old_log_probs": "torch.float32", "policy_version": "torch.int64"}
    assert results[0]["deadline"].startswith("raised"), results[0]["deadline"]
