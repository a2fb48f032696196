r"""GSM8K / MATH style answers checked by Hugging Face's ``math-verify``.

The standard verifier beside the hand-written :mod:`.gsm8k` and :mod:`.math_boxed`: it
extracts the answer of a response (the last ``\boxed{}``, else LaTeX in ``$...$``, else a
plain expression or number, as math-verify's extraction configs define) and compares it
with the ground truth symbolically (sympy): ``0.5 == \frac{1}{2}``, ``\frac{\sqrt{3}}{3}
== \frac{1}{\sqrt{3}}``, sets, intervals, equations, percentages.

The ground truth is the answer itself (``72``, ``\frac{1}{2}``) or a text holding one
(``\boxed{...}``). Score: 1.0 if math-verify finds them equal, else 0.0.

Deadlines: math-verify bounds parsing and comparing with ``signal.alarm``, which works only
on a process's main thread. The sandbox workers (``reward.isolate_builtin: true``) call
scorers there, so its deadlines apply on top of the worker's own ``call_timeout_s``; the
reward service's in-process scoring runs on a thread, where the calls run without them
(responses are clipped to their tail first).
"""

from __future__ import annotations

import threading

from reward_svc.scorers._extract import clip_tail

CLIP_CHARS = 2000
TIMEOUT_S = 5


def _timeout() -> int | None:
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def parse_truth(ground_truth: object) -> list:
    """math-verify's parse of the ground truth (boxed, so a bare ``\\frac{1}{2}`` is LaTeX)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    truth = str(ground_truth).strip()
    boxed = truth if "\\boxed" in truth else f"\\boxed{{{truth}}}"
    gold = parse(boxed, extraction_config=[LatexExtractionConfig()], parsing_timeout=_timeout())
    if not gold:
        gold = parse(truth, extraction_config=[ExprExtractionConfig(), LatexExtractionConfig()],
                     parsing_timeout=_timeout())
    return gold


def parse_answer(solution_str: str) -> list:
    """math-verify's parse of a response (boxed first, then LaTeX, then a plain expression)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    return parse(clip_tail(solution_str, CLIP_CHARS),
                 extraction_config=[LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()],
                 parsing_timeout=_timeout())


def compute_score(solution_str: str, ground_truth: object) -> float:
    """1.0 if math-verify finds the response's answer equal to the ground truth, else 0.0."""
    from math_verify import verify

    gold = parse_truth(ground_truth)
    if not gold:
        raise ValueError(f"math-verify cannot read the ground truth {str(ground_truth)[:100]!r}")
    pred = parse_answer(solution_str)
    if not pred:
        return 0.0
    return 1.0 if verify(gold, pred, timeout_seconds=_timeout()) else 0.0
