"""Exact-match scoring for meshrl's synthetic arithmetic task (``meshrl/arith``).

Task format (the control plane's ``arith`` dataset, verl parquet layout):

* prompt: an integer expression such as ``"Compute 17 + 5 * 3."``;
* ``reward_model.ground_truth``: the exact integer value as a string, e.g. ``"32"``;
* the response states its answer as the number itself: the scorer takes the integer right
  after the last ``####`` marker when there is one (GSM8K style), else the **last integer**
  in the response (so ``"32"``, ``"17+5*3 = 32"`` and ``"... so 32."`` all answer 32).

Integers may carry a sign and thousands commas; a trailing ``.0`` is accepted
(``32.0`` == ``32``), other decimals are not integers and are skipped. Score 1.0 if it equals the ground
truth, ``format_score`` (default 0.0) if an integer was found but differs, else 0.0.
"""

from __future__ import annotations

import re

from reward_svc.scorers._extract import after_last_hashes, clip_tail

_INT_RE = re.compile(r"^\s*([+-]?\d[\d,]*)(?:\.0+)?(?!\d|\.\d)")
_ALL_INTS_RE = re.compile(r"(?<![\d.])(-?\d+(?:,\d{3})*)(?:\.0+)?(?!\d|\.\d)")


def _leading_int(text: str) -> int | None:
    m = _INT_RE.match(text)
    if not m:
        return None
    digits = m.group(1).replace(",", "")
    try:
        return int(digits)
    except ValueError:
        return None


def extract_answer(solution_str: str) -> int | None:
    """The integer answer of an arith response (``#### N`` first, else the last integer)."""
    text = clip_tail(solution_str)
    tail = after_last_hashes(text)
    if tail is not None:
        return _leading_int(tail.lstrip("$"))
    found = _ALL_INTS_RE.findall(text)
    return int(found[-1].replace(",", "")) if found else None


def compute_score(solution_str: str, ground_truth: object, format_score: float = 0.0, score: float = 1.0) -> float:
    """1.0 (``score``) for the exact integer, ``format_score`` for a wrong integer, else 0.0."""
    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    truth = _leading_int(str(ground_truth))
    if truth is None:
        raise ValueError(f"arith ground_truth must be an integer, got {ground_truth!r}")
    return float(score) if answer == truth else float(format_score)
