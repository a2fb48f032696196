"""The benchmarks that need no whole job still run: each at its smallest settings, asserting
only that it prints its contract line (figures are never asserted: tests do not time things).

A benchmark nobody runs rots silently (``bench/weights.py`` once failed for weeks: its
receiver no longer authenticated). The benchmarks that start whole meshrl jobs or TRL are
listed in ``JOB_BENCHMARKS``: their smoke runs would cost CI several minutes each, so for now
they are run by hand (docs/performance.md); the first test keeps the two lists complete.
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

#: script -> (arguments, contract line, marks)
CASES = {
    "train.py": (["--layers", "1", "--hidden", "64", "--groups", "2", "--n", "2", "--prompt", "8", "--response", "4",
                  "--micro", "2", "--reps", "1"],
                 r"train ratio_vs_torch=\S+ tokens_per_s=\S+", ()),
    "lora_train.py": (["--groups", "2", "--n", "2", "--prompt", "8", "--response", "4", "--mini", "2", "--micro", "2",
                       "--reps", "1", "--rank", "4"],
                      r"lora_train cpu_ratio=\S+ full_s=\S+ lora_s=\S+ trainable=\S+", ()),
    "weights.py": (["--gb", "0.01", "--tensor-mb", "1", "--rounds", "2"],
                   r"weights ratio_vs_tcp=\S+ seconds_per_gb=\S+", ()),
    "reward.py": (["--samples", "400", "--group", "4", "--procs", "1", "--distinct", "20"],
                  r"reward ratio_vs_inline=\S+ samples_per_s=\S+", ()),
    "decode_bound.py": (["--batch", "2", "--context", "4", "--reps", "1", "--threads", "1"],
                        r"decode_bound tokens_per_s=\S+ gflops=\S+ hf_step_tokens_per_s=\S+", ()),
    "queues.py": (["--big-mb", "2", "--big-n", "2", "--small-n", "4", "--msgs", "200"],
                  r"queues redis_ratio_vs_tcp=\S+ embedded_ratio_vs_tcp=\S+ redis_msgs_per_s_1kb=\S+",
                  (pytest.mark.redis,)),
}
#: benchmarks whose smoke run lives in another test file
ELSEWHERE = {"wire.py": "tests/unit/test_wire_bench.py", "verifiers.py": "tests/unit/test_math_verify_scorer.py"}
#: need a CUDA GPU (scripts/gpu_check.sh runs it on one; its checks are the ``gpu`` tests' and more)
GPU_BENCHMARKS = {"gpu_check.py"}
#: benchmarks that run whole jobs (vLLM replicas, trainers) or TRL: no CI smoke run yet
JOB_BENCHMARKS = {"rollout.py", "agent.py", "weights_e2e.py", "async_vs_sync.py", "vs_trl.py", "ray_launcher.py",
                  "quickstart_seeds.py", "trainer_kills.py", "canary.py", "fleet.py", "fleet_timeline.py"}


def test_every_benchmark_is_listed():
    scripts = {p.name for p in BENCH.glob("*.py") if not p.name.startswith("_")}
    listed = set(CASES) | set(ELSEWHERE) | (JOB_BENCHMARKS & scripts) | (GPU_BENCHMARKS & scripts)
    assert scripts == listed, f"not listed here: {sorted(scripts - listed)}; listed but gone: {sorted(listed - scripts)}"


@pytest.mark.parametrize("script", [pytest.param(s, marks=CASES[s][2]) for s in CASES])
def test_benchmark_prints_its_contract_line(script):
    args, line, _ = CASES[script]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert re.search(rf"^{line}$", proc.stdout, re.M), f"{script} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}"
