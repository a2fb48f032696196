"""A safe arithmetic evaluator: a tiny recursive-descent parser, never ``eval``.

Shared by the countdown scorer (``reward_svc.scorers.countdown``) and the calculator tool
(``rollout_svc.tools.calculator``).

Grammar (whitespace ignored)::

    expr   := term (("+" | "-") term)*
    term   := unary (("*" | "/") unary)*
    unary  := ("+" | "-") unary | atom
    atom   := INTEGER | "(" expr ")"

``×``/``x`` are not accepted as operators; ``÷`` and ``·`` are normalised by callers if
wanted. Values are exact :class:`fractions.Fraction`; division by zero, an input longer
than ``max_len`` characters, nesting deeper than ``max_depth`` or an integer literal with
more than ``max_digits`` digits raise :class:`ArithError`. The parse is linear in the
input length and bounded, so hostile model output cannot make it slow or blow the stack.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction


class ArithError(ValueError):
    """The expression is not valid bounded integer arithmetic."""


@dataclass
class Evaluation:
    """The result of :func:`evaluate`: the exact value and the integer literals used, in order."""

    value: Fraction
    numbers: list[int] = field(default_factory=list)


class _Parser:
    def __init__(self, text: str, max_depth: int, max_digits: int) -> None:
        self.toks = self._lex(text, max_digits)
        self.pos = 0
        self.max_depth = max_depth
        self.numbers: list[int] = []

    @staticmethod
    def _lex(text: str, max_digits: int) -> list[str]:
        toks: list[str] = []
        i, n = 0, len(text)
        while i < n:
            c = text[i]
            if c.isspace():
                i += 1
            elif c in "+-*/()":
                toks.append(c)
                i += 1
            elif "0" <= c <= "9":
                j = i
                while j < n and "0" <= text[j] <= "9":
                    j += 1
                if j - i > max_digits:
                    raise ArithError(f"integer literal longer than {max_digits} digits")
                toks.append(text[i:j])
                i = j
            else:
                raise ArithError(f"unexpected character {c!r} at position {i}")
        return toks

    def _peek(self) -> str | None:
        return self.toks[self.pos] if self.pos < len(self.toks) else None

    def _next(self) -> str:
        tok = self._peek()
        if tok is None:
            raise ArithError("unexpected end of expression")
        self.pos += 1
        return tok

    def parse(self) -> Fraction:
        if not self.toks:
            raise ArithError("empty expression")
        value = self._expr(0)
        if self._peek() is not None:
            raise ArithError(f"unexpected token {self._peek()!r}")
        return value

    def _expr(self, depth: int) -> Fraction:
        if depth > self.max_depth:
            raise ArithError(f"expression nested deeper than {self.max_depth}")
        value = self._term(depth)
        while self._peek() in ("+", "-"):
            op = self._next()
            rhs = self._term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def _term(self, depth: int) -> Fraction:
        value = self._unary(depth)
        while self._peek() in ("*", "/"):
            op = self._next()
            rhs = self._unary(depth)
            if op == "*":
                value = value * rhs
            else:
                if rhs == 0:
                    raise ArithError("division by zero")
                value = value / rhs
        return value

    def _unary(self, depth: int) -> Fraction:
        tok = self._peek()
        if tok in ("+", "-"):
            self._next()
            if depth + 1 > self.max_depth:
                raise ArithError(f"expression nested deeper than {self.max_depth}")
            inner = self._unary(depth + 1)
            return inner if tok == "+" else -inner
        return self._atom(depth)

    def _atom(self, depth: int) -> Fraction:
        tok = self._next()
        if tok == "(":
            value = self._expr(depth + 1)
            if self._next() != ")":
                raise ArithError("expected ')'")
            return value
        if tok.isdigit():
            self.numbers.append(int(tok))
            return Fraction(int(tok))
        raise ArithError(f"unexpected token {tok!r}")


def evaluate(text: str, *, max_len: int = 256, max_depth: int = 32, max_digits: int = 12) -> Evaluation:
    """Evaluate ``text`` exactly; return its value and the integer literals it used.

    Raises :class:`ArithError` for anything that is not bounded +,-,*,/ integer arithmetic.
    """
    if not isinstance(text, str):
        raise ArithError(f"expression must be a str, got {type(text).__name__}")
    if len(text) > max_len:
        raise ArithError(f"expression longer than {max_len} characters")
    parser = _Parser(text, max_depth, max_digits)
    value = parser.parse()
    return Evaluation(value=value, numbers=parser.numbers)
