"""The trainer's loop calls its promotion policy's hooks, always the same ones (one real
rank, a tiny model, synthetic batches): what next before each batch, the step's control,
the judging hook inside every step, what follows the step, and the policy's own keys in
``/status`` and the metrics line. A command of the policy's (offer the same weights under the
next version number) is run by the loop."""

from __future__ import annotations

import json
from pathlib import Path

JOB = str(Path(__file__).with_name("promotion_loop_job.py"))


def test_the_loop_calls_the_policys_hooks_every_step(tiny_model, tmp_path):
    from trainer_svc.launch import spawn_ranks

    spec = {"model": {"path": tiny_model}, "data": {"train_batch_size": 2}, "rollout": {"n": 2},
            "actor": {"ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_gpu": 4},
            "trainer": {"total_steps": 2, "save_freq": -1, "default_local_dir": str(tmp_path / "ckpt"),
                        "metrics_file": str(tmp_path / "metrics.jsonl")}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    code = spawn_ranks([JOB, str(tmp_path / "spec.json"), str(tmp_path / "out")], 1, threads=1, timeout_s=300)
    assert code == 0
    res = json.loads((tmp_path / "out" / "result.json").read_text())
    assert res["code"] == 0 and res["worker_policy_is_the_loops"]
    # v0 -> v1 by the policy's "again" (no step), then two steps: v2, v3
    assert res["calls"] == [
        "next_command v0",
        "next_command v1", "wait_resumed", "step_control", "judge", "after_step v2",
        "next_command v2", "wait_resumed", "step_control", "judge", "after_step v3",
    ]
    assert res["versions"] == [2, 3] and res["policy_saw"] == [2, 3]
    assert res["status"]["recorded"] == len(res["calls"]) and res["status"]["version"] == 3
