"""Validate a submitted job spec before anything starts.

The gateway accepts the spec as YAML text or as an already-parsed mapping, plus
``a.b=c`` overrides, and validates it with the job spec of :mod:`services.config.job`
(``parse_job``), so a bad spec is refused with the same message ``meshrl validate``
prints: every bad field as ``<dotted.path>: <problem>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from services.config.job import JobSpecError, dump_job, parse_job

MAX_SPEC_BYTES = 1 << 20
MAX_SPEC_NODES = 100_000  # values after expanding YAML aliases ("billion laughs" guard)


class SpecRejected(ValueError):
    """The spec is not acceptable; ``str(exc)`` names each bad field."""


@dataclass(frozen=True)
class ValidSpec:
    name: str
    resolved_yaml: str  # the spec with defaults filled and overrides applied


def _check_size(raw: Any) -> None:
    """Refuse specs that expand to more than MAX_SPEC_NODES values (YAML aliases can make a
    small text expand exponentially); the walk stops as soon as the bound is passed."""
    stack, seen = [raw], 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_SPEC_NODES:
            raise SpecRejected(f"spec: more than {MAX_SPEC_NODES} values once YAML aliases are expanded")
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)


def load_raw(spec: str | dict[str, Any], overrides: Sequence[str] = (), *,
             blocks: str = "name, model, data, ...", what: str = "job spec") -> dict[str, Any]:
    """The submitted spec as a mapping (YAML text parsed, size bounded) with its overrides
    type-checked; :class:`SpecRejected` naming ``spec`` or ``overrides`` otherwise. Shared by
    job and fleet specs (``blocks``/``what`` only change the message)."""
    if isinstance(spec, str):
        if len(spec.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
            raise SpecRejected(f"spec: larger than {MAX_SPEC_BYTES} bytes")
        try:
            raw = yaml.safe_load(spec)
        except yaml.YAMLError as exc:
            raise SpecRejected(f"spec: not valid YAML: {exc}") from None
        except (ValueError, RecursionError) as exc:
            raise SpecRejected(f"spec: not valid YAML: {exc}") from None
    else:
        raw = spec
    _check_size(raw)
    if not isinstance(raw, dict):
        raise SpecRejected(f"spec: a {what} is a mapping of blocks ({blocks}), got {type(raw).__name__}")
    for item in overrides:
        if not isinstance(item, str):
            raise SpecRejected(f"overrides: each override is a KEY=VALUE string, got {type(item).__name__}")
    return raw


def validate_spec(spec: str | dict[str, Any], overrides: Sequence[str] = ()) -> ValidSpec:
    """Parse and validate; raise :class:`SpecRejected` with a message naming the fields."""
    raw = load_raw(spec, overrides)
    try:
        parsed = parse_job(raw, list(overrides))
    except JobSpecError as exc:
        raise SpecRejected(str(exc)) from None
    except (TypeError, ValueError, RecursionError) as exc:  # pathological input the spec code did not foresee
        raise SpecRejected(f"spec: {exc}") from None
    return ValidSpec(name=str(parsed.name), resolved_yaml=dump_job(parsed))
