"""GSM8K-style scoring: the final answer follows ``####``.

Semantics follow verl's ``gsm8k`` scorer:

* ``strict``: the answer is the number right after the last ``#### `` marker
  (thousands commas and ``$`` removed); no marker → no answer.
* ``flexible``: the answer is the last number anywhere in the response
  (ignoring lone ``.`` tokens).

``compute_score`` returns ``score`` (default 1.0) when the extracted answer equals the
ground truth string, ``format_score`` (default 0.0) when an answer was found but is
wrong, and 0.0 when no answer was found. The last 300 characters of the response are
searched, as verl does, so a huge response cannot make the regex slow.
"""

from __future__ import annotations

import re
from typing import Literal

_CLIP = 300
_STRICT_RE = re.compile(r"#### (-?[0-9.,]+)")
_FLEX_RE = re.compile(r"(-?[0-9.,]+)")


def extract_solution(solution_str: str, method: Literal["strict", "flexible"] = "strict") -> str | None:
    """Extract the final answer string of a GSM8K-style response, or ``None``."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    text = solution_str[-_CLIP:] if len(solution_str) > _CLIP else solution_str
    if method == "strict":
        found = _STRICT_RE.findall(text)
        if not found:
            return None
        return found[-1].replace(",", "").replace("$", "")
    for candidate in reversed(_FLEX_RE.findall(text)):
        if candidate not in ("", ".", ",", "-"):
            return candidate.replace(",", "")
    return None


def _canon_truth(ground_truth: object) -> str:
    """The ground truth as a string, commas removed (GSM8K labels are plain integers)."""
    return str(ground_truth).strip().replace(",", "")


def compute_score(
    solution_str: str,
    ground_truth: object,
    method: Literal["strict", "flexible"] = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """Score one response: ``score`` if correct, ``format_score`` if wrong, 0.0 if no answer."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return float(score) if answer == _canon_truth(ground_truth) else float(format_score)
