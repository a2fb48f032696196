"""bench/wire.py runs end to end (tiny size) and prints the exact last line the issue asks
for; the figures themselves are not asserted (tests never assert wall-clock speed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_bench_wire_small_prints_the_ratio_line():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "wire.py"), "--small", "--reps", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=True,
    ).stdout
    last = out.strip().splitlines()[-1]
    m = re.fullmatch(r"wire ratio_vs_memcpy=(\d+\.\d+) ratio_vs_pickle=(\d+\.\d+) gbps=(\d+\.\d+)", last)
    assert m, last
    assert all(float(x) > 0 for x in m.groups())
