"""`meshrl run` on this machine (embedded broker, real vLLM replica, reward worker, FSDP2
trainer): a job whose service crashes. A short job end to end (its plots, views, checkpoints
and the replica's weight loads) is checked on test_run_validation's job, which is one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.procs import all_proc_stats
from tests.fixtures.jobs import make_arith_parquet

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]


def _children_of(pid: int) -> list[int]:
    return [st.pid for st in all_proc_stats() if st.ppid == pid]


@pytest.fixture(scope="module")
def arith_data(tmp_path_factory):
    return make_arith_parquet(tmp_path_factory.mktemp("arith"), train_size=64)


def _run(tmp_path, model, data, *overrides, timeout=600):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        # options first, overrides last (verl's habit): overrides may come anywhere
        [sys.executable, "-m", "meshrl_cli", "run", str(REPO / "examples/quickstart.yaml"),
         "--run-dir", str(run_dir), f"model.path={model}", "--no-progress", f"data.train_files={data}",
         "data.val_files=[]", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.n=4",
         "trainer.total_steps=2", *overrides],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    return proc, run_dir


def test_a_crashing_service_stops_the_job_and_names_it(tmp_path, tiny_model, arith_data):
    # A custom reward function that fails to import: the reward worker refuses to start.
    broken = tmp_path / "broken_reward.py"
    broken.write_text("raise ImportError('this reward module is broken')\n")
    proc, run_dir = _run(tmp_path, tiny_model, arith_data,
                         f"reward.custom_reward_function.path={broken}", timeout=600)
    assert proc.returncode == 1
    assert "reward-0 exited with code" in proc.stdout
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed" and "reward-0" in status["detail"]
