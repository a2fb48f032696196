"""Shared answer-extraction helpers for the built-in scorers.

All helpers take and return plain ``str`` (or ``None`` when nothing was found); none of
them evaluates code. Regex work is bounded: callers clip very long responses to their
tail first (the answer of a reasoning trace is at its end), as verl does.
"""

from __future__ import annotations

import re

#: Only the last this-many characters of a response are searched for an answer marker.
CLIP_CHARS = 1000

_HASH_RE = re.compile(r"####\s*([^\n]*)")


def clip_tail(text: str, n: int = CLIP_CHARS) -> str:
    """The last ``n`` characters of ``text`` (all of it when shorter)."""
    return text if len(text) <= n else text[-n:]


def after_last_hashes(text: str) -> str | None:
    """The rest of the line after the last ``####`` marker, stripped; ``None`` if absent."""
    found = _HASH_RE.findall(text)
    return found[-1].strip() if found else None


def last_tag(text: str, tag: str) -> str | None:
    """The content of the last ``<tag>...</tag>`` pair in ``text``, or ``None``."""
    close = f"</{tag}>"
    end = text.rfind(close)
    if end < 0:
        return None
    start = text.rfind(f"<{tag}>", 0, end)
    if start < 0:
        return None
    return text[start + len(tag) + 2 : end]
