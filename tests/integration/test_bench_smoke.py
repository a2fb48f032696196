"""Every benchmark in ``bench/`` still runs: each one at its smallest settings, asserting only
that it prints its contract line (the figures are not asserted: tests never assert speed).

A benchmark nobody runs rots silently (a receiver that no longer authenticates, a flag that
moved); these runs catch that. The settings are the smallest that still go through every
code path of the script, so the whole module costs a few minutes. The benchmarks that start
vLLM get the session's tiny model where they take ``--model``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"

#: script -> (arguments, contract line, marks). ``{model}``: the tiny model; ``{tmp}``: a scratch dir.
CASES = {
    "train.py": (["--layers", "1", "--hidden", "64", "--groups", "2", "--n", "2", "--prompt", "8", "--response", "4",
                  "--micro", "2", "--reps", "1"],
                 r"train ratio_vs_torch=\S+ tokens_per_s=\S+", ()),
    "weights.py": (["--gb", "0.01", "--tensor-mb", "1", "--rounds", "2"],
                   r"weights ratio_vs_tcp=\S+ seconds_per_gb=\S+", ()),
    "reward.py": (["--samples", "400", "--group", "4", "--procs", "1", "--distinct", "20"],
                  r"reward ratio_vs_inline=\S+ samples_per_s=\S+", ()),
    "queues.py": (["--big-mb", "2", "--big-n", "2", "--small-n", "4", "--msgs", "200"],
                  r"queues redis_ratio_vs_tcp=\S+ embedded_ratio_vs_tcp=\S+ redis_msgs_per_s_1kb=\S+",
                  (pytest.mark.redis,)),
    "rollout.py": (["--model", "{model}", "--prompts", "8", "--n", "2", "--response-length", "4", "--repeats", "1",
                    "--settle", "0"],
                   r"rollout ratio_vs_vllm=\S+ tokens_per_s=\S+ weight_load_s=\S+", (pytest.mark.vllm,)),
    "agent.py": (["--model", "{model}", "--trajectories", "4", "--turn-tokens", "8", "--repeats", "1",
                  "--settle", "0"],
                 r"agent ratio_vs_single_turn=\S+ trajectories_per_s=\S+", (pytest.mark.vllm,)),
    "weights_e2e.py": (["--sizes", "10m", "--replicas", "1", "--rounds", "2", "--workdir", "{tmp}"],
                       r"weights_e2e .*", (pytest.mark.vllm,)),
    "async_vs_sync.py": (["--steps", "2", "--batch", "4", "--n", "2", "--response", "8", "--warm-steps", "5",
                          "--modes", "sync,async-s1", "--workdir", "{tmp}"],
                         r"async_vs_sync throughput_ratio=\S+ time_to_target_ratio=\S+ final_reward_async=\S+ "
                         r"final_reward_sync=\S+", (pytest.mark.vllm,)),
    "vs_trl.py": (["--steps", "2", "--val", "8", "--warm-steps", "5", "--workdir", "{tmp}"],
                  r"vs_trl time_to_target_ratio=\S+ s_per_step_ratio=\S+ first_step_ratio=\S+", (pytest.mark.vllm,)),
    "ray_launcher.py": (["--steps", "2", "--batch", "4", "--n", "2", "--response", "8", "--workdir", "{tmp}"],
                        r"ray_launcher ratio_vs_local=\S+ .*", (pytest.mark.vllm,)),
    "quickstart_seeds.py": (["--seeds", "0", "--out", "{tmp}", "trainer.total_steps=2", "data.val_files=[]"],
                            r"quickstart_seeds min_reward_end=\S+ mean_reward_end=\S+ runs_at_target=\d+/1 rewards=\S+",
                            (pytest.mark.vllm,)),
    "trainer_kills.py": (["--runs", "1", "--kill-at", "2", "--out", "{tmp}"],
                         r"trainer_kills finished=\d+/1 max_in_flight=\S+ seconds_min=\S+ seconds_max=\S+ load=\S+",
                         (pytest.mark.vllm,)),
}
#: benchmarks whose smoke run lives elsewhere
ELSEWHERE = {"wire.py": "tests/unit/test_wire_bench.py", "verifiers.py": "tests/unit/test_math_verify_scorer.py"}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_every_benchmark_has_a_smoke_run():
    scripts = {p.name for p in BENCH.glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(CASES) | set(ELSEWHERE), "a benchmark without a smoke run (or a stale entry here)"


@pytest.mark.parametrize("script", [pytest.param(s, marks=CASES[s][2]) for s in CASES])
def test_benchmark_prints_its_contract_line(script, tiny_model, tmp_path):
    args, line, _ = CASES[script]
    argv = [a.format(model=tiny_model, tmp=tmp_path / "work") for a in args]
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1")
    proc = subprocess.run([sys.executable, str(BENCH / script), *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1100)
    out = proc.stdout + proc.stderr
    assert re.search(rf"^{line}$", proc.stdout, re.M), f"{script} exited {proc.returncode}:\n{out[-4000:]}"
