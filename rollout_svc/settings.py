"""What one replica reads from the (resolved) job spec file. No torch/vLLM imports.

A replica needs only a few blocks of the job spec, each validated strictly by its own
model: ``model`` (path, dtype), ``data.max_prompt_length`` / ``data.max_response_length``
(defaults of ``rollout.prompt_length`` / ``rollout.response_length``), ``rollout``,
``queues`` (optional: without it the replica serves direct gRPC calls only) and ``weights``
(optional: without it the replica keeps its starting weights). Other blocks of the job
spec are ignored here (the control plane validates the whole spec).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from services.config.rollout import RolloutConfig


class SettingsError(ValueError):
    """The config file cannot drive a replica (the message names the key)."""


@dataclass
class ReplicaSettings:
    model: str
    dtype: str
    tokenizer: str | None
    trust_remote_code: bool
    rollout: RolloutConfig
    queues: Any | None  # services.config.queues.QueueConfig
    weights: Any | None  # services.config.weights.WeightChannelConfig


def _block(raw: dict, key: str) -> dict:
    val = raw.get(key) or {}
    if not isinstance(val, dict):
        raise SettingsError(f"{key}: expected a mapping, got {type(val).__name__}")
    return val


def settings_from_dict(raw: dict[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> ReplicaSettings:
    """Build :class:`ReplicaSettings` from a job-spec mapping (``a.b=c`` overrides applied)."""
    from pydantic import ValidationError

    from services.config.job import ModelConfig, apply_overrides

    if not isinstance(raw, dict):
        raise SettingsError("the config file must hold a mapping")
    raw = apply_overrides(raw, overrides)
    def check(key: str, fn):
        try:
            return fn(_block(raw, key))
        except ValidationError as exc:
            lines = [f"  {key}.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
            raise SettingsError(f"invalid {key} block:\n" + "\n".join(lines)) from exc

    model = check("model", ModelConfig.model_validate)
    rollout = check("rollout", RolloutConfig.model_validate)
    data = _block(raw, "data")
    if rollout.prompt_length is None:
        rollout.prompt_length = int(data.get("max_prompt_length", 512))
    if rollout.response_length is None:
        rollout.response_length = int(data.get("max_response_length", 512))
    queues = weights = None
    if raw.get("queues"):
        from services.config.queues import parse_queue_config

        queues = check("queues", parse_queue_config)
    if raw.get("weights"):
        from services.config.weights import WeightChannelConfig

        weights = check("weights", WeightChannelConfig.model_validate)
    return ReplicaSettings(model=model.path, dtype=model.dtype, tokenizer=model.tokenizer_path,
                           trust_remote_code=model.trust_remote_code, rollout=rollout, queues=queues, weights=weights)


def _resolve(p: str | None, base: Path) -> str | None:
    """A relative path that exists next to the config file is made absolute (as load_job does);
    anything else (absolute paths, hub ids) is kept."""
    if p is None:
        return None
    q = Path(p).expanduser()
    if q.is_absolute():
        return str(q)
    return str((base / q).resolve()) if (base / q).exists() else p


def load_settings(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> ReplicaSettings:
    """Read a YAML job spec (or a rollout-only file with the same block names)."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SettingsError(f"cannot read {path}: {exc}") from exc
    s = settings_from_dict(raw or {}, overrides)
    base = Path(path).parent
    s.model, s.tokenizer = _resolve(s.model, base), _resolve(s.tokenizer, base)
    return s
