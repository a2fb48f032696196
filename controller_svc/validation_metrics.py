"""Validation scores per data source: mean, mean@n, best@k, worst@k and pass@k.

Input: for each data source, the scores of each validation prompt's ``n`` samples.
Estimates over ``k`` of the ``n`` samples are exact expectations over all k-subsets
(no bootstrap, so the numbers do not move between identical runs):

* ``best@k``  = E[max of k samples]  = sum_i s_(i) C(i-1, k-1) / C(n, k)   (s sorted ascending)
* ``worst@k`` = E[min of k samples]  = sum_i s_(i) C(n-i, k-1) / C(n, k)
* ``pass@k``  = 1 - C(n-c, k) / C(n, k), c = correct samples (the unbiased estimator of
  Chen et al. 2021), reported only when every score of the source is 0 or 1.

Metric names (``<ds>`` is the data source, e.g. ``meshrl/arith``)::

    val/test_score/<ds>        mean score over all samples (verl's headline name)
    val/<ds>/mean@<n>          the same mean, named with the sample count
    val/<ds>/best@<k>, val/<ds>/worst@<k>      for k = 2, 4, 8, ... < n, and n (when n > 1)
    val/<ds>/pass@<k>          for k = 1, 2, 4, ... and n, binary scores only
    val/<ds>/num_prompts       prompts scored
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import comb


def ks(n: int) -> list[int]:
    """1, 2, 4, ... below n, and n itself."""
    out, k = [], 1
    while k < n:
        out.append(k)
        k *= 2
    return [*out, n]


def best_at_k(scores: Sequence[float], k: int) -> float:
    s = sorted(scores)
    n = len(s)
    return sum(v * comb(i, k - 1) for i, v in enumerate(s)) / comb(n, k)


def worst_at_k(scores: Sequence[float], k: int) -> float:
    s = sorted(scores)
    n = len(s)
    return sum(v * comb(n - 1 - i, k - 1) for i, v in enumerate(s)) / comb(n, k)


def pass_at_k(scores: Sequence[float], k: int) -> float:
    n, c = len(scores), sum(1 for v in scores if v >= 0.5)
    return 1.0 - comb(n - c, k) / comb(n, k)


def validation_metrics(groups: Mapping[str, Sequence[Sequence[float]]]) -> dict[str, float]:
    """Metrics of ``{data_source: [[score of each sample] per prompt]}`` (see module doc).
    Prompts with different sample counts are estimated at the smallest count of their source."""
    out: dict[str, float] = {}
    for ds in sorted(groups):
        prompts = [list(g) for g in groups[ds] if len(g)]
        if not prompts:
            continue
        flat = [v for g in prompts for v in g]
        n = min(len(g) for g in prompts)
        mean = sum(flat) / len(flat)
        out[f"val/test_score/{ds}"] = mean
        out[f"val/{ds}/mean@{n}"] = mean
        out[f"val/{ds}/num_prompts"] = float(len(prompts))
        binary = all(v in (0.0, 1.0) for v in flat)
        for k in ks(n):
            if k > 1:
                out[f"val/{ds}/best@{k}"] = sum(best_at_k(g, k) for g in prompts) / len(prompts)
                out[f"val/{ds}/worst@{k}"] = sum(worst_at_k(g, k) for g in prompts) / len(prompts)
            if binary:
                out[f"val/{ds}/pass@{k}"] = sum(pass_at_k(g, k) for g in prompts) / len(prompts)
    return out
