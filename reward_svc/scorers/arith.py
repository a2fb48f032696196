"""Exact-match scoring for meshrl's synthetic arithmetic task (``meshrl/arith``).

Task format (the control plane's ``arith`` dataset, verl parquet layout):

* prompt: an integer expression such as ``"Compute 17 + 5 * 3."``;
* ``reward_model.ground_truth``: the exact integer value as a string, e.g. ``"32"``;
* the response states its answer either as ``#### 32`` (GSM8K style; takes precedence,
  last marker wins) or as the integer after the last ``=`` sign (``... = 32``).

The extracted token must be an integer (optional sign, thousands commas allowed); a
trailing ``.0`` is accepted (``32.0`` == ``32``). Score 1.0 if it equals the ground
truth, ``format_score`` (default 0.0) if an integer was found but differs, else 0.0.
"""

from __future__ import annotations

import re

from reward_svc.scorers._extract import after_last_hashes, clip_tail

_INT_RE = re.compile(r"^\s*([+-]?\d[\d,]*)(?:\.0+)?(?![\d.])")


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
    """The integer answer of an arith response (``#### N`` first, else after the last ``=``)."""
    text = clip_tail(solution_str)
    tail = after_last_hashes(text)
    if tail is not None:
        return _leading_int(tail)
    eq = text.rfind("=")
    if eq < 0:
        return None
    return _leading_int(text[eq + 1 :].lstrip().lstrip("$"))


def compute_score(solution_str: str, ground_truth: object, format_score: float = 0.0, score: float = 1.0) -> float:
    """1.0 (``score``) for the exact integer, ``format_score`` for a wrong integer, else 0.0."""
    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    truth = _leading_int(str(ground_truth))
    if truth is None:
        raise ValueError(f"arith ground_truth must be an integer, got {ground_truth!r}")
    return float(score) if answer == truth else float(format_score)
