"""The ``math_verify`` scorer (Hugging Face's math-verify) on GSM8K / MATH style answers,
and bench/verifiers.py, which compares it with the hand-written scorers on labelled cases."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from reward_svc.scorers import default_compute_score, math_verify_score

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("response", "truth", "want"),
    [
        ("#### 72", "72", 1.0),
        ("so the answer is \\boxed{72}.", "72", 1.0),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{\\frac{\\sqrt{3}}{3}}", "\\frac{1}{\\sqrt{3}}", 1.0),
        ("\\boxed{\\{1,2,3\\}}", "\\{3,2,1\\}", 1.0),
        ("The answer is $\\frac{1}{2}$.", "\\boxed{\\frac{1}{2}}", 1.0),
        ("\\boxed{(2,5)}", "[2,5)", 0.0),
        ("\\boxed{\\frac{1}{3}}", "0.33", 0.0),
        ("#### 27", "72", 0.0),
        ("no answer at all", "72", 0.0),
    ],
)
def test_scores(response: str, truth: str, want: float) -> None:
    assert math_verify_score.compute_score(response, truth) == want
    assert default_compute_score("math_verify/any", response, truth) == want


def test_scores_off_the_main_thread_as_the_reward_service_calls_it() -> None:
    out: list[float] = []
    t = threading.Thread(target=lambda: out.append(math_verify_score.compute_score("\\boxed{2\\sqrt{2}}", "\\sqrt{8}")))
    t.start()
    t.join(timeout=120)
    assert out == [1.0]


def test_an_unreadable_ground_truth_is_an_error_not_a_zero() -> None:
    with pytest.raises(ValueError, match="ground truth"):
        math_verify_score.compute_score("\\boxed{1}", "")


def test_the_labelled_cases_are_well_formed() -> None:
    cases = json.loads((ROOT / "bench" / "verifier_cases.json").read_text())
    assert len(cases) >= 40
    for c in cases:
        assert set(c) == {"style", "response", "truth", "right", "note"} and c["style"] in ("gsm8k", "math")
        assert isinstance(c["right"], bool)


@pytest.mark.timeout(600)
def test_bench_verifiers_prints_the_comparison() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "verifiers.py")], capture_output=True, text=True,
                       timeout=500, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"verifiers cases=(\d+) disagree=(\d+) hand_acc=([\d.]+) math_verify_acc=([\d.]+)", last)
    assert m, last
    assert int(m.group(2)) == sum(1 for line in r.stdout.splitlines() if line.startswith(("gsm8k ", "math ")))
