"""How a failure of a ``meshrl`` command is told to its user: one line, no traceback.

Errors the user can fix (a bad spec, a missing or unreadable file, a port in use, a value
out of range) are shown as their message with exit code 2; anything else as
``internal error: <type>: <message>`` with exit code 1 and a hint to rerun with
``--debug``. Messages are kept on one line (multi-line messages, e.g. a list of spec
problems, are joined with ``; ``).
"""

from __future__ import annotations

import errno


def _one_line(text: str) -> str:
    parts = [p.strip() for p in str(text).splitlines() if p.strip()]
    return "; ".join(parts) if parts else ""


def _os_error(exc: OSError) -> str:
    where = f"{exc.filename}: " if exc.filename else ""
    what = exc.strerror or str(exc)
    hint = {
        errno.ENOENT: "check the path",
        errno.EISDIR: "expected a file, got a directory",
        errno.ENOTDIR: "a part of the path is not a directory",
        errno.EACCES: "check its permissions",
        errno.EADDRINUSE: "choose another port",
        errno.ENOSPC: "free some disk space",
    }.get(exc.errno or 0)
    return f"{where}{what}" + (f" ({hint})" if hint else "")


def _is_user_error(exc: BaseException) -> bool:
    if isinstance(exc, (OSError, ValueError, LookupError)):
        return True
    try:
        from pydantic import ValidationError
    except ImportError:  # pragma: no cover - pydantic is a dependency
        return False
    return isinstance(exc, ValidationError)


def _pydantic(exc: BaseException) -> str | None:
    try:
        from pydantic import ValidationError
    except ImportError:  # pragma: no cover
        return None
    if not isinstance(exc, ValidationError):
        return None
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<input>'}: {e['msg'].removeprefix('Value error, ')}"
                     for e in exc.errors())


def describe(exc: BaseException) -> tuple[str, int]:
    """(one line for the user, exit code) of ``exc``."""
    if isinstance(exc, OSError) and not type(exc).__module__.startswith(("grpc", "urllib")):
        return _os_error(exc), 2
    msg = _pydantic(exc)
    if msg is not None:
        return msg, 2
    text = _one_line(str(exc))
    if isinstance(exc, RuntimeError) and "address already in use" in text.lower():
        return f"{text} (choose another port)", 2
    if _is_user_error(exc):
        return text or type(exc).__name__, 2
    return f"internal error: {type(exc).__name__}: {text} (rerun with --debug for the traceback)", 1
