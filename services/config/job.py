"""The job spec: one YAML file describes a whole meshrl job.

Key names follow verl where verl has one (``data.train_batch_size``, ``rollout.n``,
``algorithm.adv_estimator``, ``actor.optim.lr`` ...). Resources (how many replicas, ranks,
which devices) live in ``services:``, apart from behaviour (STYLE.md #9). Every block is
strict: an unknown key fails loudly, naming it.

    spec = load_job("examples/quickstart.yaml", ["actor.optim.lr=1e-5", "rollout.n=4"])
    print(dump_job(spec))

A bad spec raises :class:`JobSpecError`, whose message lists every problem as
``<dotted.path>: <what is wrong>``, before anything starts.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from services.config.base import StrictModel
from services.config.restart import RestartConfig


class JobSpecError(ValueError):
    """The job spec is invalid; the message names each bad field and the problem."""


class ModelConfig(StrictModel):
    """The policy's starting checkpoint (verl: ``actor_rollout_ref.model``)."""

    path: str = Field(description="HuggingFace model directory (or hub id where a hub is reachable)")
    tokenizer_path: str | None = Field(None, description="tokenizer directory; defaults to `path`")
    trust_remote_code: bool = Field(False, description="allow the checkpoint's own modelling code to run")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="parameter dtype for training and generation (float32 on CPU)"
    )


class DataConfig(StrictModel):
    """Prompts (verl: ``data.*``)."""

    train_files: list[str] = Field(
        min_length=1, description="training prompts: verl-style parquet, JSON lines, JSON or datasets save_to_disk dirs"
    )
    val_files: list[str] = Field(default_factory=list, description="validation prompts (same formats); see trainer.test_freq")
    prompt_key: str = Field("prompt", description="column holding the chat messages")
    chat_template: str | None = Field(
        None, description="Jinja chat template (text, or a .jinja file) applied to prompts; None = the tokenizer's own",
    )
    max_prompt_length: int = Field(512, ge=1, le=1_048_576, description="longest prompt, in tokens")
    max_response_length: int = Field(512, ge=1, le=1_048_576, description="longest response, in tokens")
    train_batch_size: int = Field(ge=1, description="prompts per training step (each sampled rollout.n times)")
    truncation: Literal["error", "left", "right", "middle"] = Field(
        "error", description="what to do with a prompt over max_prompt_length that was not filtered"
    )
    filter_overlong_prompts: bool = Field(True, description="drop prompts over max_prompt_length at load time")
    shuffle: bool = Field(True, description="shuffle the prompt order each epoch")
    seed: int = Field(0, ge=0, description="seed of the prompt order")

    @field_validator("train_files", "val_files", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v


class ReplicaSet(StrictModel):
    """How many processes of one service, and where they run."""

    replicas: int = Field(1, ge=0, le=1024, description="number of processes of this service")
    device: Literal["cpu", "cuda"] = Field("cpu", description="device the service computes on")


class TrainerResources(StrictModel):
    """The trainer's ranks (one FSDP2 data-parallel group)."""

    nproc: int = Field(1, ge=1, le=4096, description="trainer ranks (torchrun --nproc_per_node)")
    device: Literal["cpu", "cuda"] = Field("cpu", description="cpu uses gloo, cuda uses nccl")


class ServicesConfig(StrictModel):
    """Resources, kept apart from the algorithm (STYLE.md #9)."""

    rollout: ReplicaSet = Field(default_factory=ReplicaSet, description="vLLM rollout replicas")
    reward: ReplicaSet = Field(default_factory=ReplicaSet, description="reward workers")
    trainer: TrainerResources = Field(default_factory=TrainerResources, description="trainer ranks")
    host: str = Field("127.0.0.1", description="address the job's services bind and meet on")
    base_port: int = Field(0, ge=0, le=65000, description="first port of the job's range; 0 picks free ports")
    restart: RestartConfig = Field(default_factory=RestartConfig, description="restart policy, liveness and stall deadlines")


class AsyncConfig(StrictModel):
    """How far rollouts may run ahead of the trainer (docs/architecture.md, async rules)."""

    mode: Literal["async", "sync"] = Field(
        "async",
        description="async: generation, scoring and training overlap, bounded by max_staleness; sync: the "
        "synchronous baseline (verl's loop) -- one batch is fed only once every replica serves the trainer's "
        "current version, then scored and trained, nothing overlaps; needs max_staleness=0",
    )
    max_staleness: int = Field(
        1, ge=0, le=1000, description="train only on samples with version >= current - max_staleness; 0 = on-policy"
    )

    @model_validator(mode="after")
    def _sync_is_on_policy(self) -> "AsyncConfig":
        if self.mode == "sync" and self.max_staleness != 0:
            raise ValueError(
                f"max_staleness={self.max_staleness} with mode=sync: a synchronous job trains on-policy only "
                "(set async.max_staleness=0)"
            )
        return self


_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


class JobSpecBase(StrictModel):
    """Fields every job has; :class:`JobSpec` adds the service blocks."""

    name: str = Field(description="job name: lowercase letters, digits and '-', at most 63 characters")
    model: ModelConfig = Field(description="the policy checkpoint")
    data: DataConfig = Field(description="prompts")
    services: ServicesConfig = Field(default_factory=ServicesConfig, description="resources")
    async_: AsyncConfig = Field(default_factory=AsyncConfig, alias="async", description="staleness bounds")

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError("must be lowercase letters, digits and '-', start alphanumeric, at most 63 characters")
        return v


# ---------------------------------------------------------------------------------------------------------------
# Loading, overrides and error messages


def _parse_scalar(text: str) -> Any:
    """``a.b=c`` right-hand sides are YAML: ``1`` -> int, ``true`` -> bool, ``[1,2]`` -> list."""
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply OmegaConf-style ``a.b.c=value`` overrides to a nested dict (in place; returned)."""
    for item in overrides:
        if "=" not in item:
            raise JobSpecError(f"override {item!r}: expected KEY=VALUE with a dotted KEY, e.g. actor.optim.lr=1e-6")
        key, _, value = item.partition("=")
        parts = key.strip().lstrip("+").split(".")
        if not all(parts):
            raise JobSpecError(f"override {item!r}: empty key segment in {key!r}")
        node = raw
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            elif not isinstance(nxt, dict):
                raise JobSpecError(f"override {item!r}: {'.'.join(parts[: i + 1])} is a value, not a block")
            node = nxt
        node[parts[-1]] = _parse_scalar(value)
    return raw


def format_validation_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "<job>"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            from services.config.schema_doc import unknown_key_message

            msg = unknown_key_message(job_spec_class(), tuple(err["loc"]))
        lines.append(f"  {loc}: {msg}")
    return "invalid job spec:\n" + "\n".join(lines)


def job_spec_class() -> type[StrictModel]:
    """The full spec class (imported lazily so this module stays importable alone)."""
    from services.config.spec import JobSpec

    return JobSpec


def parse_job(raw: dict[str, Any], overrides: Sequence[str] = ()) -> StrictModel:
    """Validate a raw mapping (plus overrides) into the job spec, or raise JobSpecError."""
    if not isinstance(raw, dict):
        raise JobSpecError(f"a job spec is a mapping at the top level, got {type(raw).__name__}")
    raw = apply_overrides(copy.deepcopy(raw), overrides)
    try:
        return job_spec_class().model_validate(raw)
    except ValidationError as exc:
        raise JobSpecError(format_validation_error(exc)) from None


def load_job(path: str | Path, overrides: Sequence[str] = ()) -> StrictModel:
    """Read a YAML job spec, apply overrides, validate. Relative data/model paths are
    resolved against the spec file's directory."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise JobSpecError(f"job spec {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise JobSpecError(f"{path}: not valid YAML: {exc}") from None
    spec = parse_job(raw if raw is not None else {}, overrides)
    return resolve_paths(spec, path.parent)


def resolve_paths(spec: Any, base: Path) -> Any:
    """Make the spec's file paths absolute, relative to ``base`` (the spec's directory)."""

    def fix(p: str) -> str:
        q = Path(p).expanduser()
        if q.is_absolute() or not (base / q).exists():
            return str(q) if q.is_absolute() else p
        return str((base / q).resolve())

    spec.model.path = fix(spec.model.path)
    if spec.model.tokenizer_path:
        spec.model.tokenizer_path = fix(spec.model.tokenizer_path)
    spec.data.train_files = [fix(p) for p in spec.data.train_files]
    spec.data.val_files = [fix(p) for p in spec.data.val_files]
    return spec


def dump_job(spec: StrictModel) -> str:
    """The resolved spec as YAML (aliases such as ``async`` used, defaults included)."""
    return yaml.safe_dump(spec.model_dump(mode="json", by_alias=True), sort_keys=False)
