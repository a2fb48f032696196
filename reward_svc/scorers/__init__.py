"""Built-in rule-based scorers and verl's ``default_compute_score`` dispatcher.

Every scorer is pure Python, trusted, and cheap, so the service runs them in-process in
batches. ``default_compute_score`` picks one by ``data_source`` (verl's names plus
meshrl's synthetic tasks):

| data_source | scorer |
| --- | --- |
| ``openai/gsm8k``, ``gsm8k``, ``meshrl/gsm8k`` | :mod:`.gsm8k` (``#### N``, strict by default) |
| ``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``, ``HuggingFaceH4/MATH-500``, ``math``, ``meshrl/math`` | :mod:`.math_boxed` |
| ``countdown`` (TinyZero: every number exactly once), ``meshrl/countdown`` (at most once) | :mod:`.countdown` |
| ``arith``, ``meshrl/arith`` | :mod:`.arith` (``#### N`` else the last integer) |

Unknown data sources raise ``NotImplementedError`` (as verl does); the reward manager
records that as the sample's error.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from reward_svc.scorers import arith, countdown, gsm8k, math_boxed
from services.registry import SCORERS

#: data_source -> scorer taking (solution_str, ground_truth, **kwargs).
BUILTIN_SCORERS: dict[str, Callable[..., float]] = {
    "openai/gsm8k": gsm8k.compute_score,
    "gsm8k": gsm8k.compute_score,
    "meshrl/gsm8k": gsm8k.compute_score,
    "lighteval/MATH": math_boxed.compute_score,
    "DigitalLearningGmbH/MATH-lighteval": math_boxed.compute_score,
    "HuggingFaceH4/MATH-500": math_boxed.compute_score,
    "math": math_boxed.compute_score,
    "meshrl/math": math_boxed.compute_score,
    "countdown": partial(countdown.compute_score, use_all=True),
    "meshrl/countdown": countdown.compute_score,
    "arith": arith.compute_score,
    "meshrl/arith": arith.compute_score,
}
SCORERS.attach(lambda: BUILTIN_SCORERS)  # so the job spec's checks know what is added here


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> float:
    """Score one response with the built-in scorer for ``data_source`` (verl's signature).

    ``kwargs`` are passed to the scorer (e.g. ``method="flexible"`` for GSM8K,
    ``use_all=False`` for countdown). Returns a float.
    """
    scorer = BUILTIN_SCORERS.get(data_source)
    if scorer is None:
        raise NotImplementedError(f"no built-in reward function for data_source={data_source!r}")
    return float(scorer(solution_str, ground_truth, **kwargs))


__all__ = ["BUILTIN_SCORERS", "default_compute_score"]
