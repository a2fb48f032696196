"""Secrets in a submitted job spec: never stored for display, never returned.

A value is a secret when its key names one -- ``password``, ``token``, ``secret``, ``key``,
``authorization`` or ``credential`` anywhere in the key, case-insensitive, at any depth
(``queues.password``, ``openai_api_key``, ``hf_token``, ``aws_secret_access_key``,
``headers.Authorization``) -- except keys that name a path, a file, an environment
variable or a count (``tokenizer_path``, ``tls_key_file``, ``password_env``,
``max_tokens_per_turn``, ``prompt_key``: :data:`NOT_SECRET`). In free text (a string
value, an override, an event, a log line) the password of a ``scheme://user:PASSWORD@host``
URL, ``Bearer TOKEN`` and ``<secret key>=VALUE`` / ``<secret key>: VALUE`` are hidden too.

The gateway keeps the spec it shows (job store, ``GET /v1/jobs/{id}`` over REST and gRPC,
lists, events, the dashboard) with each such value replaced by ``***``
(:func:`redact_spec`, :func:`redact_overrides`, :func:`redact_text`), and the real values
only in ``RUNS_DIR/<job id>/secrets.json`` (mode 0600) until the job is launched, when
:func:`restore` puts them back into the spec the launcher writes to the job's run dir
(mode 0600 as well); a job cancelled before its launch has its secrets.json deleted.
Better still, name an environment variable with ``queues.password_env``: then the spec
carries no secret at all.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

REDACTED = "***"
SECRETS_FILE = "secrets.json"
_SECRET_WORDS = r"password|passwd|token|secret|key|authorization|credential"
_SECRET_KEY = re.compile(_SECRET_WORDS, re.I)
#: Keys that contain a secret word but hold no secret: paths, files, env var names, counts,
#: column names.
NOT_SECRET = re.compile(
    r"(_path|_paths|_file|_files|_dir|_env|_ids|_id|_len|_length|_per_gpu|_per_turn|_column|_columns)$"
    r"|tokenizer|tokens|^prompt_key$|^reward_fn_key$|_key_?len", re.I)
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)([^@\s/]+)(@)")
_BEARER = re.compile(r"(\b(?:Bearer|Basic|Token)\s+)([A-Za-z0-9._~+/=-]{4,})", re.I)
_KEY_VALUE = re.compile(
    r"""(?P<key>[A-Za-z0-9_.-]*(?:""" + _SECRET_WORDS + r""")[A-Za-z0-9_-]*)(?P<sep>["']?\s*[:=]\s*["']?)"""
    r"""(?P<value>[^\s"',;&}\])]+)""", re.I)


def is_secret_key(key: Any) -> bool:
    """Does a spec key name a secret (see the module docstring)?"""
    k = str(key)
    return bool(_SECRET_KEY.search(k)) and not NOT_SECRET.search(k)


def redact_text(text: str) -> str:
    """``text`` with every URL password, ``Bearer`` token and ``secret_key=value`` hidden."""
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)

    def kv(m: re.Match) -> str:
        key = m.group("key").rsplit(".", 1)[-1]
        if not is_secret_key(key) or m.group("value") in (REDACTED, "Bearer", "Basic", "Token"):
            return m.group(0)
        return m.group("key") + m.group("sep") + REDACTED

    return _KEY_VALUE.sub(kv, text)


def redact_value(value: Any) -> Any:
    """Any parsed value (mapping, list, scalar) with its secrets hidden (nothing recorded)."""
    return redact_spec(value)[0]


def redact_spec(node: Any, path: str = "") -> tuple[Any, dict[str, Any]]:
    """(the spec with secrets replaced by ``***``, {dotted path: real value}) of a parsed spec."""
    found: dict[str, Any] = {}

    def walk(n: Any, where: str) -> Any:
        if isinstance(n, dict):
            out = {}
            for k, v in n.items():
                sub = f"{where}.{k}" if where else str(k)
                if is_secret_key(k) and _has_value(v):
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


def _has_value(v: Any) -> bool:
    return v not in (None, "", [], {}) and not isinstance(v, bool)


def redact_overrides(overrides: Sequence[str]) -> list[str]:
    """``a.b=c`` overrides as shown: a secret key's value hidden, secrets inside a YAML value
    (``a.extra={api_key: X}``) hidden, and the free-text patterns of :func:`redact_text`."""
    out = []
    for item in overrides:
        key, eq, value = item.partition("=")
        if eq and is_secret_key(key.strip().rsplit(".", 1)[-1]) and value:
            out.append(f"{key}={REDACTED}")
            continue
        if eq and value.strip()[:1] in ("{", "["):
            try:
                parsed = yaml.safe_load(value)
            except (yaml.YAMLError, ValueError, RecursionError):
                parsed = None
            if isinstance(parsed, (dict, list)):
                shown, found = redact_spec(parsed)
                if found:
                    value = yaml.safe_dump(shown, default_flow_style=True, width=1 << 20).strip()
        out.append(redact_text(f"{key}{eq}{value}"))
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
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), 0o600)
        json.dump(found, fh)


def read_secrets(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


__all__ = ["NOT_SECRET", "REDACTED", "SECRETS_FILE", "is_secret_key", "read_secrets", "redact_overrides",
           "redact_spec", "redact_text", "redact_value", "restore", "write_secrets"]
