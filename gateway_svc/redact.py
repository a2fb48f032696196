"""Secrets in a submitted job spec: never stored for display, never returned.

A spec may carry a password: ``queues.password``, or one inside a URL
(``redis://:PASSWORD@host:6379/0``). The gateway keeps the spec it shows (job store,
``GET /v1/jobs/{id}`` over REST and gRPC, the dashboard) with each such value replaced by
``***`` (:func:`redact_spec`, :func:`redact_overrides`), and the real values only in
``RUNS_DIR/<job id>/secrets.json`` (mode 0600) until the job is launched, when
:func:`restore` puts them back into the spec the launcher writes to the job's run dir
(mode 0600 as well). Better still, name an environment variable with ``queues.password_env``:
then the spec carries no secret at all.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REDACTED = "***"
SECRETS_FILE = "secrets.json"
#: Keys whose value is a secret wherever they appear in the spec.
SECRET_KEYS = frozenset({"password", "api_key", "token", "secret"})
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)([^@\s/]+)(@)")


def redact_text(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` URL in it hidden."""
    return _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)


def redact_spec(node: Any, path: str = "") -> tuple[Any, dict[str, Any]]:
    """(the spec with secrets replaced by ``***``, {dotted path: real value}) of a parsed spec."""
    found: dict[str, Any] = {}

    def walk(n: Any, where: str) -> Any:
        if isinstance(n, dict):
            out = {}
            for k, v in n.items():
                sub = f"{where}.{k}" if where else str(k)
                if str(k).lower() in SECRET_KEYS and isinstance(v, str) and v:
                    found[sub] = v
                    out[k] = REDACTED
                else:
                    out[k] = walk(v, sub)
            return out
        if isinstance(n, list):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(n)]
        if isinstance(n, str) and (shown := redact_text(n)) != n:
            found[where] = n
            return shown
        return n

    return walk(node, path), found


def redact_overrides(overrides: Sequence[str]) -> list[str]:
    """``a.b=c`` overrides as shown: a secret key's value and a URL's password hidden."""
    out = []
    for item in overrides:
        key, eq, value = item.partition("=")
        if eq and key.strip().rsplit(".", 1)[-1].lower() in SECRET_KEYS and value:
            out.append(f"{key}={REDACTED}")
        else:
            out.append(redact_text(item))
    return out


def _set(node: Any, dotted: str, value: Any) -> None:
    parts = re.findall(r"[^.\[\]]+|\[\d+\]", dotted)
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        key: Any = int(part[1:-1]) if part.startswith("[") else part
        if last:
            node[key] = value
        else:
            node = node[key]


def restore(spec: dict[str, Any], found: dict[str, Any]) -> dict[str, Any]:
    """Put the real values of :func:`redact_spec` back into ``spec`` (in place; returned)."""
    for dotted, value in found.items():
        _set(spec, dotted, value)
    return spec


def write_secrets(path: Path, found: dict[str, Any]) -> None:
    """``found`` to ``path``, readable by the gateway's user only (created 0600, never wider)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), 0o600)
        json.dump(found, fh)


def read_secrets(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


__all__ = ["REDACTED", "SECRETS_FILE", "read_secrets", "redact_overrides", "redact_spec", "redact_text",
           "restore", "write_secrets"]
