"""Errors raised by :mod:`services.protocol`.

verl signals misuse of ``DataProto`` with ``assert`` statements, so callers (and verl's own
tests) catch :class:`AssertionError`.  meshrl raises :class:`DataProtoError`, which is both an
``AssertionError`` (verl compatibility) and a ``ValueError`` (the usual "bad input" type), and
is raised explicitly so it survives ``python -O``.
"""

from __future__ import annotations


class DataProtoError(AssertionError, ValueError):
    """A DataProto operation got inconsistent input (sizes, keys, types or meta values)."""


def require(condition: object, message: str) -> None:
    """Raise :class:`DataProtoError` with ``message`` unless ``condition`` is truthy."""
    if not condition:
        raise DataProtoError(message)
