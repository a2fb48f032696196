"""A calculator tool: exact integer/rational arithmetic on ``+ - * / ( )``.

The expression is evaluated by the safe parser the countdown scorer uses too
(:mod:`services.safe_arith`: no ``eval``, bounded length and nesting).
Schema name ``calc``, one argument ``expr``.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from rollout_svc.tools.base import Tool
from services.safe_arith import evaluate


class Calculator(Tool):
    schema = {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expr": {"type": "string", "description": "the expression, e.g. 347*28"}},
                "required": ["expr"],
            },
        },
    }

    def execute(self, instance_id: str, arguments: dict[str, Any], **kwargs: Any) -> str:
        expr = arguments.get("expr") if isinstance(arguments, dict) else None
        if not isinstance(expr, str):
            raise ValueError("argument 'expr' must be a string")
        value = evaluate(expr).value
        if isinstance(value, Fraction):
            return str(value.numerator) if value.denominator == 1 else f"{float(value):.6g}"
        return str(value)
