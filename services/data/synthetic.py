"""Built-in synthetic tasks, written in verl's row schema (see docs/contracts.md).

``meshrl/arith``: ``"12+7="`` -> ``"19"``. Small enough for a tiny model to learn on a
laptop CPU, hard enough that a random policy scores near zero.

``meshrl/countdown``: reach a target from a few numbers with + - * / (each number at most
once); the ground truth is a JSON string ``{"target": int, "numbers": [...]}``.
"""

from __future__ import annotations

import json
import random
from typing import Any

ARITH_SOURCE = "meshrl/arith"
COUNTDOWN_SOURCE = "meshrl/countdown"


def arith_rows(
    n: int, *, seed: int = 0, max_operand: int = 20, ops: str = "+-", split: str = "train", terms: int = 2
) -> list[dict[str, Any]]:
    """``n`` arithmetic prompts ``"a<op>b="`` with operands in ``[0, max_operand]``.

    With ``terms > 2`` the prompt chains more operands (``"3+1+4="``, evaluated left to right)
    and ``extra_info["solution"]`` spells the worked steps (``"3+1=4,4+4=8"``): the scorer
    still takes the last integer, so a policy that writes the steps is scored on the result,
    and the warm start teaches the format from the solution. Longer answers make generation a
    real share of a step, as in reasoning RL.
    """
    if n <= 0 or max_operand < 1 or not ops or set(ops) - set("+-*") or not 2 <= terms <= 16:
        raise ValueError(f"bad arith parameters: n={n} max_operand={max_operand} ops={ops!r} terms={terms} "
                         "(ops from '+-*', terms 2..16)")
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b, op = rng.randint(0, max_operand), rng.randint(0, max_operand), rng.choice(ops)
        result = _apply(a, op, b)
        content, extra = f"{a}{op}{b}=", {"split": split, "index": i, "a": a, "b": b, "op": op}
        if terms > 2:
            steps, expr = [f"{a}{op}{b}={result}"], f"{a}{op}{b}"
            for _ in range(terms - 2):
                c, op2 = rng.randint(0, max_operand), rng.choice(ops)
                steps.append(f"{result}{op2}{c}={_apply(result, op2, c)}")
                expr, result = f"{expr}{op2}{c}", _apply(result, op2, c)
            content = f"{expr}="
            extra = {"split": split, "index": i, "terms": terms, "solution": ",".join(steps)}
        rows.append(
            {
                "data_source": ARITH_SOURCE,
                "prompt": [{"role": "user", "content": content}],
                "ability": "arithmetic",
                "reward_model": {"style": "rule", "ground_truth": str(result)},
                "extra_info": extra,
            }
        )
    return rows


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def countdown_rows(
    n: int, *, seed: int = 0, num_numbers: int = 3, max_number: int = 20, split: str = "train"
) -> list[dict[str, Any]]:
    """``n`` countdown puzzles, each solvable by construction (the target is built from a
    random expression over the numbers)."""
    if n <= 0 or not 2 <= num_numbers <= 6 or max_number < 2:
        raise ValueError(f"bad countdown parameters: n={n} num_numbers={num_numbers} max_number={max_number}")
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        nums = [rng.randint(1, max_number) for _ in range(num_numbers)]
        target = nums[0]
        for x in nums[1:]:
            op = rng.choice("+-*")
            target = target + x if op == "+" else target - x if op == "-" else target * x
        shown = nums[:]
        rng.shuffle(shown)
        content = (
            f"Using the numbers {shown}, each at most once, with + - * / and parentheses, "
            f"make {target}. Give the expression in <answer></answer>."
        )
        rows.append(
            {
                "data_source": COUNTDOWN_SOURCE,
                "prompt": [{"role": "user", "content": content}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": json.dumps({"target": target, "numbers": shown})},
                "extra_info": {"split": split, "index": i},
            }
        )
    return rows


TASKS = {"arith": arith_rows, "countdown": countdown_rows}
