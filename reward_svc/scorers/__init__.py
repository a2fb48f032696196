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
| ``math_verify``, ``math_verify/<any>`` | :mod:`.math_verify_score` (Hugging Face's math-verify) |
| ``reasoning_gym/<task>`` | :mod:`.reasoning_gym_score` (the task's own ``score_answer``) |

``<family>/<any>`` names (:data:`SCORER_FAMILIES`) let one scorer serve many data sources,
so validation still reports each source (each reasoning-gym task, each dataset checked
with math-verify) on its own. :func:`find_scorer` looks a data source up: its exact name
first, then its family. Unknown data sources raise ``NotImplementedError`` (as verl does);
the reward manager records that as the sample's error.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from reward_svc.scorers import arith, countdown, gsm8k, math_boxed, math_verify_score, reasoning_gym_score
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
    "math_verify": math_verify_score.compute_score,
}
SCORERS.attach(lambda: BUILTIN_SCORERS)  # so the job spec's checks know what is added here

#: ``<family>/`` prefix -> scorer of every data source named ``<family>/<anything>``.
SCORER_FAMILIES: dict[str, Callable[..., float]] = {
    "math_verify/": math_verify_score.compute_score,
    "reasoning_gym/": reasoning_gym_score.compute_score,
}


def find_scorer(data_source: str) -> Callable[..., float] | None:
    """The built-in scorer of ``data_source`` (exact name, then family), or ``None``."""
    scorer = BUILTIN_SCORERS.get(data_source)
    if scorer is not None:
        return scorer
    family, sep, rest = data_source.partition("/")
    return SCORER_FAMILIES.get(family + sep) if sep and rest else None


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
    scorer = find_scorer(data_source)
    if scorer is None:
        raise NotImplementedError(f"no built-in reward function for data_source={data_source!r}")
    return float(scorer(solution_str, ground_truth, **kwargs))


__all__ = ["BUILTIN_SCORERS", "SCORER_FAMILIES", "default_compute_score", "find_scorer"]
