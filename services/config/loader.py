"""The one config loader: YAML files, ``a.b=c`` overrides, path resolution, error messages.

Every config file meshrl reads -- a job spec or one service's view -- goes through
:func:`load_model`: read the YAML mapping, apply the overrides, validate it with a strict
model, and on failure raise :class:`ConfigError` whose message lists every problem as
``<dotted.path>: <what is wrong> (<what to do>)``. Imports only pydantic and yaml.

    view = load_model(TrainerView, "run/config/trainer.yaml", ["actor.optim.lr=1e-5"], what="trainer view")
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from services.config.schema_doc import unknown_key_message

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config (job spec or service view) is invalid; the message names each bad key."""


# Keys that used to live elsewhere (or were read by nothing): an old or misplaced key gets
# the one place it lives now, instead of a bare "unknown key". Resources (processes,
# devices, ports, threads) live under services.*, behaviour in the algorithm blocks.
MOVED_KEYS: dict[str, str] = {
    "trainer.nproc": "services.trainer.nproc",
    "trainer.device": "services.trainer.device",
    "trainer.torch_threads": "services.trainer.torch_threads",
    "trainer.metrics_port": "services.trainer.metrics_port",
    "trainer.metrics_host": "services.host",
    "trainer.max_staleness": "async.max_staleness",
    "rollout.host": "services.host",
    "rollout.grpc_port": "services.rollout.grpc_port",
    "rollout.metrics_port": "services.rollout.metrics_port",
    "rollout.device": "services.rollout.device",
    "reward.host": "services.host",
    "reward.grpc_port": "services.reward.grpc_port",
    "reward.metrics_port": "services.reward.metrics_port",
    "reward.device": "services.reward.device",
    "reward.reward_model.device": "services.reward.device",
    "actor.temperature": "rollout.temperature",
    "max_staleness": "async.max_staleness",
    "services.base_port": "services.<service>.*_port",
}


def _parse_scalar(text: str) -> Any:
    """``a.b=c`` right-hand sides are YAML: ``1`` -> int, ``true`` -> bool, ``[1,2]`` -> list."""
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def is_override(arg: str) -> bool:
    """True for a command-line word of the form ``a.b=c`` (not an option)."""
    return not arg.startswith("-") and "=" in arg and bool(arg.partition("=")[0].strip())


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply OmegaConf-style ``a.b.c=value`` overrides to a nested dict (in place; returned)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected KEY=VALUE with a dotted KEY, e.g. actor.optim.lr=1e-6")
        key, _, value = item.partition("=")
        parts = key.strip().lstrip("+").split(".")
        if not all(parts):
            raise ConfigError(f"override {item!r}: empty key segment in {key!r}")
        node = raw
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            elif not isinstance(nxt, dict):
                raise ConfigError(f"override {item!r}: {'.'.join(parts[: i + 1])} is a value, not a block")
            node = nxt
        node[parts[-1]] = _parse_scalar(value)
    return raw


def format_validation_error(exc: ValidationError, what: str = "job spec", model: type[BaseModel] | None = None) -> str:
    """``invalid <what>:`` then one ``  dotted.path: problem`` line per error (an unknown key
    of ``model`` gets a did-you-mean from the block it is in)."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            home = MOVED_KEYS.get(loc)
            if home is not None:
                msg = f"not a key here (each setting has one home): set {home} instead"
            elif model is not None:
                msg = unknown_key_message(model, tuple(err["loc"]))
            else:
                msg = "unknown key (`meshrl config` lists every key)"
        # a check across blocks has no location; its message names the keys itself
        lines += [f"  {loc}: {msg}"] if loc else [f"  {part}" for part in msg.split("; ")]
    return f"invalid {what}:\n" + "\n".join(lines)


def read_mapping(path: str | Path, what: str = "config") -> dict[str, Any]:
    """The YAML mapping in ``path`` (empty file -> {}), or ConfigError saying what is wrong
    (other OSErrors -- a directory, no permission -- propagate: callers report them in one line)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a {what} is a mapping at the top level, got {type(raw).__name__}")
    return raw


def validate(cls: type[M], raw: Any, overrides: Sequence[str] = (), what: str = "config") -> M:
    """``cls`` validated from ``raw`` plus ``overrides`` (the caller's mapping is not changed)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"a {what} is a mapping at the top level, got {type(raw).__name__}")
    raw = apply_overrides(copy.deepcopy(raw), overrides)
    try:
        return cls.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, what, cls)) from None


def resolve_path(p: str | None, base: Path) -> str | None:
    """A relative path that exists under ``base`` (the config file's directory) becomes
    absolute; absolute paths are kept; anything else (a hub id, a file to be written) is
    returned unchanged."""
    if p is None:
        return None
    q = Path(p).expanduser()
    if q.is_absolute():
        return str(q)
    return str((base / q).resolve()) if (base / q).exists() else p


def load_model(cls: type[M], path: str | Path, overrides: Sequence[str] = (), what: str = "config") -> M:
    """Read ``path`` (YAML), apply overrides, validate as ``cls``. Relative file paths in the
    result are resolved against the file's directory when the model has ``resolve_paths``."""
    model = validate(cls, read_mapping(path, what), overrides, what=f"{what} ({path})")
    fix = getattr(model, "resolve_paths", None)
    if callable(fix):
        fix(Path(path).resolve().parent)
    return model


def dump_model(model: BaseModel) -> str:
    """The model as YAML (aliases such as ``async`` used, defaults included)."""
    return yaml.safe_dump(model.model_dump(mode="json", by_alias=True), sort_keys=False)
