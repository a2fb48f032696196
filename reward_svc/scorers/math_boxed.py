r"""Boxed math answers (MATH / lighteval style): ``\boxed{...}`` extraction and equivalence.

Extraction takes the LAST ``\boxed{...}`` (or ``\fbox{...}``) with balanced braces, or the
``\boxed 5`` short form. Normalisation (:func:`normalize`) makes equal answers equal strings:

* drop ``\left``/``\right``, spacing commands (``\!``, ``\,``, ``\;``, ``\:``, ``\ ``),
  ``$``, ``^\circ``/``^{\circ}``, ``\%``/``%``, ``\displaystyle``, and all whitespace;
* ``\dfrac``/``\tfrac`` → ``\frac``; ``\frac12`` → ``\frac{1}{2}``; ``\sqrt2`` → ``\sqrt{2}``;
* drop a trailing unit in ``\text{...}``/``\mbox{...}`` (``5\text{ cm}`` → ``5``) and unwrap
  a whole-answer ``\text{...}``; drop a short ``x=`` left-hand side;
* a trailing ``.`` and thousands separators in plain numbers are removed.

Equivalence (:func:`is_equiv`): equal normalised strings, or both sides parse as exact
rational numbers (``3``, ``-2.50``, ``3.0``, ``\frac{1}{2}``, ``-\frac{3}{4}``, ``1/2``) with
the same value. Score: 1.0 if equivalent, else 0.0 (verl's MATH scorer semantics).
"""

from __future__ import annotations

import re
from fractions import Fraction

from reward_svc.scorers._extract import clip_tail

_BOX_CMDS = ("\\boxed", "\\fbox")
_SPACING = ("\\!", "\\,", "\\;", "\\:", "\\ ", "\\quad", "\\qquad", "\\displaystyle")
_TEXT_UNIT_RE = re.compile(r"\\(?:text|mbox|mathrm)\{[^{}]*\}$")
_TEXT_WRAP_RE = re.compile(r"^\\(?:text|mbox|textbf|mathrm)\{([^{}]*)\}$")
_FRAC_SHORT_RE = re.compile(r"\\frac(\d)(\d)")
_FRAC_HALF_RE = re.compile(r"\\frac\{([^{}]*)\}(\d)")
_SQRT_SHORT_RE = re.compile(r"\\sqrt(\w)")
_LHS_RE = re.compile(r"^[a-zA-Z]\w{0,2}=")
_THOUSANDS_RE = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_DECIMAL_RE = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)$")
_FRAC_RE = re.compile(r"^([+-]?)\\frac\{([+-]?\d+)\}\{([+-]?\d+)\}$")
_SLASH_RE = re.compile(r"^([+-]?\d+)/([+-]?\d+)$")


def last_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}``/``\fbox{...}`` (balanced braces), or ``None``."""
    text = clip_tail(text, 4000)
    start = max(text.rfind(cmd) for cmd in _BOX_CMDS)
    if start < 0:
        return None
    cmd = next(c for c in _BOX_CMDS if text.startswith(c, start))
    i = start + len(cmd)
    if i < len(text) and text[i] == " ":  # "\boxed 5" short form: up to the next "$" or space
        rest = text[i + 1 :]
        m = re.match(r"[^\s$]+", rest)
        return m.group(0) if m else None
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None  # unbalanced


def normalize(answer: str) -> str:
    """Canonical string form of a math answer (see module doc)."""
    s = answer.strip()
    s = s.replace("\n", "").replace("\\left", "").replace("\\right", "")
    for cmd in _SPACING:
        s = s.replace(cmd, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\%", "").replace("%", "").replace("\\$", "").replace("$", "")
    s = s.strip()
    s = _TEXT_UNIT_RE.sub("", s).strip() or s
    m = _TEXT_WRAP_RE.match(s)
    if m:
        s = m.group(1)
    s = s.replace(" ", "")
    s = s.rstrip(".") if not s.endswith("..") else s
    s = _FRAC_SHORT_RE.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_HALF_RE.sub(r"\\frac{\1}{\2}", s)
    s = _SQRT_SHORT_RE.sub(r"\\sqrt{\1}", s)
    if _LHS_RE.match(s) and s.count("=") == 1:
        s = s.split("=", 1)[1]
    if _THOUSANDS_RE.match(s):
        s = s.replace(",", "")
    if s.startswith("."):
        s = "0" + s
    return s


def to_fraction(s: str) -> Fraction | None:
    """Exact value of a normalised plain number / ``\\frac{a}{b}`` / ``a/b``, else ``None``."""
    if len(s) > 64:
        return None
    try:
        if _DECIMAL_RE.match(s):
            return Fraction(s)
        m = _FRAC_RE.match(s)
        if m:
            value = Fraction(int(m.group(2)), int(m.group(3)))
            return -value if m.group(1) == "-" else value
        m = _SLASH_RE.match(s)
        if m:
            return Fraction(int(m.group(1)), int(m.group(2)))
    except (ValueError, ZeroDivisionError):
        return None
    return None


def is_equiv(a: str | None, b: str | None) -> bool:
    """True if two raw answers are the same after normalisation (or the same number)."""
    if a is None or b is None:
        return False
    na, nb = normalize(a), normalize(b)
    if na == nb:
        return True
    fa, fb = to_fraction(na), to_fraction(nb)
    return fa is not None and fa == fb


def compute_score(solution_str: str, ground_truth: object) -> float:
    r"""1.0 if the last ``\boxed{}`` answer is equivalent to the ground truth, else 0.0.

    A ground truth that itself contains ``\boxed{}`` is unwrapped first.
    """
    truth = str(ground_truth)
    boxed_truth = last_boxed(truth)
    if boxed_truth is not None:
        truth = boxed_truth
    return 1.0 if is_equiv(last_boxed(solution_str), truth) else 0.0
