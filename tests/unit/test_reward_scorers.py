"""Built-in scorers, from worked examples (verl's gsm8k/math semantics, TinyZero countdown)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from reward_svc.scorers import BUILTIN_SCORERS, arith, countdown, default_compute_score, gsm8k, math_boxed
from services.safe_arith import ArithError, evaluate


# ---------------------------------------------------------------- GSM8K
@pytest.mark.parametrize(
    ("text", "method", "want"),
    [
        ("Natalia sold 48 clips in April... 48 + 24 = 72\n#### 72", "strict", "72"),
        ("#### 1,234", "strict", "1234"),
        ("first #### 3 then #### -5", "strict", "-5"),
        ("the answer is 72", "strict", None),
        ("####72", "strict", None),  # verl's strict pattern needs the space
        ("the answer is 72", "flexible", "72"),
        ("it costs 1,000 dollars. done.", "flexible", "1000"),
        ("no digits here", "flexible", None),
    ],
)
def test_gsm8k_extract(text, method, want):
    assert gsm8k.extract_solution(text, method=method) == want


def test_gsm8k_scores_and_format_score():
    assert gsm8k.compute_score("so #### 72", "72") == 1.0
    assert gsm8k.compute_score("so #### 71", "72") == 0.0
    assert gsm8k.compute_score("so #### 71", "72", format_score=0.1) == 0.1
    assert gsm8k.compute_score("no marker 72", "72", format_score=0.1) == 0.0
    assert gsm8k.compute_score("no marker 72", "72", method="flexible") == 1.0
    assert gsm8k.compute_score("#### 1,000", "1,000") == 1.0
    with pytest.raises(ValueError, match="strict"):
        gsm8k.extract_solution("x", method="fuzzy")


def test_gsm8k_only_searches_the_tail():
    long = "#### 5 " + "x" * 1000
    assert gsm8k.extract_solution(long) is None


# ---------------------------------------------------------------- boxed math
@pytest.mark.parametrize(
    ("text", "want"),
    [
        (r"so \boxed{42}.", "42"),
        (r"\boxed{1} then \boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"\boxed{a{b}c}", "a{b}c"),
        (r"\fbox{7}", "7"),
        (r"$\boxed 5$", "5"),
        (r"\boxed{unbalanced", None),
        ("no box", None),
    ],
)
def test_last_boxed(text, want):
    assert math_boxed.last_boxed(text) == want


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (r"\dfrac{1}{2}", r"\frac12"),
        (r"\tfrac{3}{4}", "3/4"),
        ("0.5", r"\frac{1}{2}"),
        ("3.0", "3"),
        ("3.", "3"),
        (r"\left( 1, 2 \right)", "(1,2)"),
        (r"5\text{ cm}", "5"),
        (r"\text{yes}", "yes"),
        ("10\\%", "10"),
        ("90^\\circ", "90"),
        ("x = 4", "4"),
        ("1,000", "1000"),
        (r"-\frac{3}{4}", "-0.75"),
        (r"\sqrt2", r"\sqrt{2}"),
        (".5", "0.5"),
        (r"\$12", "12"),
    ],
)
def test_math_equivalent(a, b):
    assert math_boxed.is_equiv(a, b)


@pytest.mark.parametrize(("a", "b"), [("3", "4"), (r"\frac{1}{3}", "0.33"), ("x+1", "x+2"), (None, "1")])
def test_math_not_equivalent(a, b):
    assert not math_boxed.is_equiv(a, b)


def test_math_compute_score():
    assert math_boxed.compute_score(r"thus $\boxed{\dfrac{1}{2}}$", r"\frac{1}{2}") == 1.0
    assert math_boxed.compute_score(r"thus $\boxed{\dfrac{1}{3}}$", r"\frac{1}{2}") == 0.0
    assert math_boxed.compute_score("no box 1/2", "1/2") == 0.0
    assert math_boxed.compute_score(r"\boxed{2}", r"The answer is $\boxed{2}$") == 1.0


# ---------------------------------------------------------------- safe arithmetic
def test_safe_arith_values_and_numbers():
    ev = evaluate("(6 - 2) * 6")
    assert ev.value == 24 and ev.numbers == [6, 2, 6]
    assert evaluate("7/2").value * 2 == 7  # exact fractions
    assert evaluate("-3 + +4").value == 1
    assert evaluate("2*(3+(4-1))").value == 12


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os').system('true')",
        "2**10",
        "1/0",
        "(1+2",
        "1+2)",
        "",
        "1 2",
        "(" * 40 + "1" + ")" * 40,
        "-" * 40 + "1",
        "1" * 20,
        "1+" * 200 + "1",
        "open('x')",
        "3.5 + 1",
    ],
)
def test_safe_arith_rejects(expr):
    with pytest.raises(ArithError):
        evaluate(expr)


def test_safe_arith_rejects_non_str():
    with pytest.raises(ArithError):
        evaluate(12)  # type: ignore[arg-type]


# ---------------------------------------------------------------- countdown
GT = {"target": 24, "numbers": [6, 2, 6]}


def test_countdown_worked_examples():
    assert countdown.compute_score("<answer>(6 - 2) * 6</answer>", GT) == 1.0
    assert countdown.compute_score("<answer>(6 - 2) * 6 = 24</answer>", GT) == 1.0
    assert countdown.compute_score("<answer>6 × 2 × 2</answer>", GT) == 0.1  # 2 used twice
    assert countdown.compute_score("<answer>6 * 2 + 6</answer>", GT) == 0.1  # well-formed, 18
    assert countdown.compute_score("<answer>six times four</answer>", GT) == 0.0  # not arithmetic
    assert countdown.compute_score("", GT) == 0.0
    assert countdown.compute_score("#### (6-2)*6", json.dumps(GT)) == 1.0
    assert countdown.compute_score("thinking...\n(6-2)*6", GT) == 1.0  # last line
    assert countdown.compute_score("<answer>__import__('os')</answer>", GT) == 0.0


def test_countdown_at_most_vs_exactly_once():
    gt = {"target": 12, "numbers": np.array([6, 2, 5])}  # parquet gives numpy arrays
    assert countdown.compute_score("<answer>6 * 2</answer>", gt) == 1.0  # meshrl: at most once
    assert countdown.compute_score("<answer>6 * 2</answer>", gt, use_all=True) == 0.1  # TinyZero: all
    assert default_compute_score("countdown", "<answer>6 * 2</answer>", gt) == 0.1
    assert default_compute_score("meshrl/countdown", "<answer>6 * 2</answer>", gt) == 1.0
    with pytest.raises(ValueError, match="target"):
        countdown.compute_score("<answer>1</answer>", {"numbers": [1]})


# ---------------------------------------------------------------- arith
@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("19", 19),
        ("12+7=19", 19),
        ("The answer is -3.", -3),
        ("#### 19\nsome trailing 5", 19),
        ("1,234", 1234),
        ("19.0", 19),
        ("19.5", None),
        ("nothing", None),
    ],
)
def test_arith_extract(text, want):
    assert arith.extract_answer(text) == want


def test_arith_scores():
    assert arith.compute_score("12+7=19", "19") == 1.0
    assert arith.compute_score("12+7=18", "19") == 0.0
    assert arith.compute_score("12+7=18", "19", format_score=0.1) == 0.1
    assert arith.compute_score("-3", "-3") == 1.0
    with pytest.raises(ValueError, match="integer"):
        arith.compute_score("3", "three")


# ---------------------------------------------------------------- dispatcher
def test_dispatch_by_data_source():
    assert default_compute_score("openai/gsm8k", "#### 7", "7") == 1.0
    assert default_compute_score("lighteval/MATH", r"\boxed{7}", "7") == 1.0
    assert default_compute_score("DigitalLearningGmbH/MATH-lighteval", r"\boxed{7.0}", "7") == 1.0
    assert default_compute_score("meshrl/arith", "3+4=7", "7") == 1.0
    assert default_compute_score("openai/gsm8k", "7", "7", method="flexible") == 1.0
    assert isinstance(default_compute_score("openai/gsm8k", "#### 7", "7"), float)
    assert {"openai/gsm8k", "lighteval/MATH", "countdown", "meshrl/arith", "meshrl/countdown"} <= set(BUILTIN_SCORERS)
    with pytest.raises(NotImplementedError, match="unknown/source"):
        default_compute_score("unknown/source", "x", "y")
