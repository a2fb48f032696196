"""Countdown scoring: combine the given numbers with + - * / to reach a target.

Ground truth (``reward_model.ground_truth``, TinyZero layout): a mapping
``{"target": int, "numbers": [int, ...]}`` (a JSON string of it is accepted too).

The response gives its expression inside the last ``<answer>...</answer>`` pair, or,
failing that, after the last ``####`` marker, or, failing that, on its last non-empty
line. A trailing ``= <number>`` is ignored, and
``×``/``÷`` are read as ``*``/``/``. The expression is checked by
:mod:`services.safe_arith` (never ``eval``).

Scores: ``score`` (1.0) when the expression is valid, uses each given number at most
once (with ``use_all=True``: exactly once, all of them -- TinyZero's ``countdown`` rule,
which the dispatcher applies for ``data_source="countdown"``) and equals the target;
``format_score`` (0.1) when the expression is well-formed arithmetic but misses the
target or misuses the numbers; 0.0 when no well-formed expression was found.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping

from reward_svc.scorers._extract import after_last_hashes, clip_tail, last_tag
from services.safe_arith import ArithError, evaluate


def extract_expression(solution_str: str) -> str | None:
    """The candidate expression of a countdown response, or ``None``."""
    text = clip_tail(solution_str)
    expr = last_tag(text, "answer")
    if expr is None:
        expr = after_last_hashes(text)
    if expr is None:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if not lines:
            return None
        expr = lines[-1]
    expr = expr.strip().replace("×", "*").replace("÷", "/").replace("−", "-")
    if "=" in expr:
        expr = expr.split("=", 1)[0]
    expr = expr.strip()
    return expr or None


def parse_ground_truth(ground_truth: object) -> tuple[int, list[int]]:
    """``(target, numbers)`` from a mapping or its JSON string; ``ValueError`` if malformed."""
    if isinstance(ground_truth, (str, bytes)):
        ground_truth = json.loads(ground_truth)
    if not isinstance(ground_truth, Mapping) or "target" not in ground_truth or "numbers" not in ground_truth:
        raise ValueError(f"countdown ground_truth must have 'target' and 'numbers', got {ground_truth!r}")
    target = int(ground_truth["target"])
    numbers = [int(n) for n in list(ground_truth["numbers"])]
    return target, numbers


def check_numbers(used: list[int], available: list[int], use_all: bool = True) -> bool:
    """True if ``used`` draws each available number at most once (exactly once if ``use_all``)."""
    need, have = Counter(used), Counter(available)
    if use_all:
        return need == have
    return all(have[n] >= k for n, k in need.items())


def compute_score(
    solution_str: str,
    ground_truth: object,
    format_score: float = 0.1,
    score: float = 1.0,
    use_all: bool = False,
) -> float:
    """``score`` if the expression reaches the target with the given numbers, else see module doc."""
    target, numbers = parse_ground_truth(ground_truth)
    expr = extract_expression(solution_str)
    if expr is None:
        return 0.0
    try:
        result = evaluate(expr)
    except ArithError:
        return 0.0
    if not check_numbers(result.numbers, numbers, use_all=use_all):
        return float(format_score)
    return float(score) if result.value == target else float(format_score)
