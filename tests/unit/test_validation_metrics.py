"""Validation metrics: exact k-subset expectations checked against brute-force enumeration."""

from __future__ import annotations

import itertools
import random

import pytest

from controller_svc.validation_metrics import best_at_k, ks, pass_at_k, validation_metrics, worst_at_k


def _brute(scores, k, f):
    subsets = list(itertools.combinations(scores, k))
    return sum(f(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("seed", range(5))
def test_k_estimates_equal_the_average_over_all_subsets(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 7)
    scores = [rng.choice([0.0, 0.5, 1.0, rng.random()]) for _ in range(n)]
    binary = [float(rng.random() < 0.4) for _ in range(n)]
    for k in range(1, n + 1):
        assert best_at_k(scores, k) == pytest.approx(_brute(scores, k, max))
        assert worst_at_k(scores, k) == pytest.approx(_brute(scores, k, min))
        assert pass_at_k(binary, k) == pytest.approx(_brute(binary, k, lambda s: float(any(s))))


def test_metric_names_per_data_source():
    assert ks(1) == [1] and ks(4) == [1, 2, 4] and ks(6) == [1, 2, 4, 6]
    m = validation_metrics({"meshrl/arith": [[1, 0, 0, 0], [1, 1, 1, 1]], "lighteval/MATH": [[0.5], [0.0]]})
    assert m["val/test_score/meshrl/arith"] == pytest.approx(5 / 8) == m["val/meshrl/arith/mean@4"]
    assert m["val/meshrl/arith/pass@1"] == pytest.approx(5 / 8)
    assert m["val/meshrl/arith/pass@4"] == 1.0 == m["val/meshrl/arith/best@4"]
    assert m["val/meshrl/arith/worst@4"] == 0.5
    assert m["val/meshrl/arith/pass@2"] == pytest.approx((0.5 + 1.0) / 2)
    assert m["val/meshrl/arith/num_prompts"] == 2
    assert m["val/test_score/lighteval/MATH"] == 0.25
    assert not any(k.startswith("val/lighteval/MATH/pass@") for k in m)  # 0.5 is not a binary score
    assert not any(k.startswith("val/lighteval/MATH/best@") for k in m)  # n = 1
