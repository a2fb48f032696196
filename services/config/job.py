"""The job spec: one YAML file describes a whole meshrl job, each setting in one place.

Key names follow verl where verl has one (``data.train_batch_size``, ``rollout.n``,
``algorithm.adv_estimator``, ``actor.optim.lr`` ...). Resources -- how many processes,
which devices, which ports, how many threads -- live only under ``services:``; behaviour
lives in the algorithm blocks (``actor``, ``critic``, ``ref``, ``algorithm``, ``rollout``,
``reward``, ``trainer``, ``data``, ``async``). Every block is strict: an unknown key fails
loudly, naming it (and, for a key that moved, where it lives now).

    spec = load_job("examples/quickstart.yaml", ["actor.optim.lr=1e-5", "rollout.n=4"])
    print(dump_job(spec))

A bad spec raises :class:`JobSpecError`, whose message lists every problem as
``<dotted.path>: <what is wrong>``, before anything starts. The services never read a job
spec: the controller cuts one typed view per service out of it (:mod:`services.config.views`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, field_validator, model_validator

from services.config.base import StrictModel
from services.config.lora import ALL_LINEAR, static_problems
from services.config.loader import (
    ConfigError,
    apply_overrides,
    dump_model,
    format_validation_error,
    load_model,
    resolve_path,
    validate,
)
from services.config.queues import EmbeddedQueueConfig, QueueConfig
from services.config.restart import RestartConfig
from services.config.reward import RewardConfig
from services.config.rollout import RolloutConfig
from services.config.trainer import ActorConfig, AlgorithmConfig, CriticConfig, RefConfig, TrainerConfig
from services.config.weights import WeightChannelConfig

JobSpecError = ConfigError  # the name callers use for a bad job spec

__all__ = [
    "JobSpec", "JobSpecError", "ModelConfig", "DataConfig", "ServicesConfig", "AsyncConfig",
    "apply_overrides", "format_validation_error", "parse_job", "load_job", "dump_job", "job_spec_class",
]  # fmt: skip

Device = Literal["cpu", "cuda"]


def _cpu_list(value: str | None) -> str | None:
    from services.placement import parse_cpu_list

    if value is not None:
        parse_cpu_list(value)  # ValueError names the bad list
    return value


#: A Linux CPU list ("0", "1-3", "0,2") a service's processes are pinned to; None = all CPUs.
#: (A bare number, as YAML and a.b=c overrides read "0", is that CPU.)
CpuList = Annotated[
    str | None,
    BeforeValidator(lambda v: str(v) if isinstance(v, int) and not isinstance(v, bool) else v),
    AfterValidator(_cpu_list),
]
CPUS_HELP = "CPUs this service's processes run on, a Linux CPU list ('0', '1-3', '0,2'); null = all (docs/async.md)"


class ModelConfig(StrictModel):
    """The policy's starting checkpoint (verl: ``actor_rollout_ref.model``)."""

    path: str = Field(description="HuggingFace model directory (or hub id where a hub is reachable)")
    tokenizer_path: str | None = Field(None, description="tokenizer directory; defaults to `path`")
    trust_remote_code: bool = Field(False, description="allow the checkpoint's own modelling code to run")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description="parameter dtype the trainer trains in, and vLLM's dtype unless rollout.dtype says otherwise; "
        "float16 cannot be trained (no loss scaling): train in bfloat16/float32 and set rollout.dtype=float16",
    )

    lora_rank: int = Field(
        0, ge=0, le=4096,
        description="LoRA rank (verl's model.lora_rank): > 0 trains a PEFT LoRA adapter on target_modules with the "
        "base weights frozen, and only the adapter travels to the replicas, which serve it with vLLM's LoRA; "
        "0 = full fine-tuning (docs/lora.md)",
    )
    lora_alpha: float = Field(16.0, gt=0, le=1e6, description="LoRA scaling numerator: the update is alpha/rank * B @ A")
    target_modules: str | list[str] = Field(
        ALL_LINEAR,
        description="modules that carry the adapter: 'all-linear' (every linear layer of the decoder blocks, "
        "not the LM head) or a list of names such as [q_proj, v_proj]",
    )
    lora_adapter_path: str | None = Field(
        None, description="start from this PEFT adapter directory (adapter_config.json + weights) instead of a "
        "fresh adapter; its rank, alpha and targets must match the keys above",
    )

    @model_validator(mode="after")
    def _lora_ok(self) -> "ModelConfig":
        problems = static_problems(self.lora_rank, self.lora_alpha, self.target_modules, self.lora_adapter_path)
        if problems:  # (reported under "model:" already)
            raise ValueError("; ".join(p.removeprefix("model.") for p in problems))
        return self

    @property
    def lora(self) -> bool:
        """True when the job trains a LoRA adapter (``lora_rank > 0``)."""
        return self.lora_rank > 0

    def resolve_paths(self, base: Path) -> None:
        self.path = resolve_path(self.path, base) or self.path
        self.tokenizer_path = resolve_path(self.tokenizer_path, base)
        self.lora_adapter_path = resolve_path(self.lora_adapter_path, base)

    @property
    def tokenizer(self) -> str:
        """The tokenizer directory (``tokenizer_path``, else the model's own)."""
        return self.tokenizer_path or self.path


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

    def resolve_paths(self, base: Path) -> None:
        self.train_files = [resolve_path(p, base) or p for p in self.train_files]
        self.val_files = [resolve_path(p, base) or p for p in self.val_files]


# ---------------------------------------------------------------------------------------------------------------
# Resources: the only place processes, devices, ports and threads are set


_LABEL_VALUE = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
_LABEL = re.compile(_LABEL_VALUE)
_LABEL_PREFIX = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*")
# Ray's label selector: a value, or in(...) of values, either negated with a leading '!'
_SELECTOR = re.compile(rf"!?(?:{_LABEL_VALUE}|in\({_LABEL_VALUE}(?:, ?{_LABEL_VALUE})*\))")


class RayRequest(StrictModel):
    """What one service asks Ray for (``services.<trainer|rollout|reward>.ray``); read only
    by the Ray launcher (``services.launcher: ray``, docs/ray.md)."""

    num_cpus: float | None = Field(
        None, ge=0, le=4096,
        description="CPUs this service's actor reserves; null = the length of its `cpus` list if set, else "
        "nproc for the trainer and 1 for a replica or reward worker",
    )
    resources: dict[str, float] = Field(
        default_factory=dict, max_length=64,
        description="custom Ray resources each instance needs (e.g. {rollout: 1}): the service lands only on nodes "
        "started with them (`ray start --resources`)",
    )

    labels: dict[str, str] = Field(
        default_factory=dict, max_length=64,
        description="node labels each instance's node must have, as Ray label selectors (e.g. {pool: rollout}, "
        "{zone: 'in(a, b)'}, {market: '!spot'}): the service lands only on nodes started with matching "
        "`ray start --labels` (Ray >= 2.49)",
    )

    @field_validator("labels")
    @classmethod
    def _selectors(cls, v: dict[str, str]) -> dict[str, str]:
        for key, selector in v.items():
            name = key.rsplit("/", 1)[-1]
            prefix = key[: -len(name) - 1] if "/" in key else ""
            if not _LABEL.fullmatch(name) or (prefix and not _LABEL_PREFIX.fullmatch(prefix)):
                raise ValueError(f"label {key!r}: not a label key (letters, digits, '-', '_', '.', at most 63, "
                                 "optionally after a DNS prefix and '/')")
            if not isinstance(selector, str) or not _SELECTOR.fullmatch(selector):
                raise ValueError(f"label {key!r}: {selector!r} is not a label selector: a value, '!value', "
                                 "'in(a, b)' or '!in(a, b)'")
        return v

    @field_validator("resources")
    @classmethod
    def _custom_only(cls, v: dict[str, float]) -> dict[str, float]:
        for key, amount in v.items():
            if key in ("CPU", "GPU", "memory", "object_store_memory"):
                raise ValueError(f"{key!r} is not a custom resource: CPUs come from num_cpus, GPUs from the "
                                 "service's device (cuda)")
            if not key or amount <= 0:
                raise ValueError(f"resource {key!r}: the amount must be > 0 (got {amount})")
        return v


RAY_HELP = "what each instance asks Ray for under services.launcher=ray (docs/ray.md)"


class RayLauncherConfig(StrictModel):
    """The Ray launcher (``services.launcher: ray``): where the cluster is and how the job's
    services are placed on it (docs/ray.md)."""

    address: str | None = Field(
        None, max_length=1024,
        description="the Ray cluster: host:port of its head (GCS), ray://..., or 'auto'; null = $RAY_ADDRESS, else auto",
    )
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="placement group strategy for the job's services (one bundle per service instance)"
    )
    placement_timeout_s: float = Field(
        300.0, gt=0, le=86_400,
        description="the whole job must be placed within this long (all services or none), else it fails "
        "naming what the cluster lacks; also bounds re-placing a service whose node died",
    )
    namespace: str = Field("meshrl", min_length=1, max_length=128, description="Ray namespace of the job's actors")


class TrainerResources(StrictModel):
    """The trainer's ranks (one FSDP2 data-parallel group) and its HTTP port."""

    nproc: int = Field(1, ge=1, le=4096, description="trainer ranks (torchrun --nproc_per_node)")
    device: Device = Field("cpu", description="cpu uses gloo, cuda uses nccl (same code path)")
    torch_threads: int = Field(0, ge=0, le=1024, description="intra-op threads per rank; 0 = its CPUs / nproc")
    cpus: CpuList = Field(None, description=CPUS_HELP)
    metrics_port: int = Field(0, ge=0, le=65535, description="port of /health /ready /metrics; 0 = any free")
    ray: RayRequest = Field(default_factory=RayRequest, description=RAY_HELP + "; all ranks share one actor")


#: A fleet's name (services.rollout.fleet; docs/fleet.md): lower-case letters, digits, dashes.
FLEET_NAME = r"[a-z0-9][a-z0-9-]{0,62}"


class RolloutResources(StrictModel):
    """The vLLM replicas: how many, on which device, on which ports."""

    replicas: int = Field(1, ge=0, le=1024, description="rollout replica processes")
    device: Device = Field("cpu", description="device vLLM runs on (the replica refuses one its vLLM build lacks)")
    cpus: CpuList = Field(None, description=CPUS_HELP + "; vLLM's CPU threads are bound to them")
    grpc_port: int = Field(0, ge=0, le=65535, description="RolloutService gRPC port; 0 picks a free one")
    metrics_port: int = Field(0, ge=0, le=65535, description="/health /ready /metrics HTTP port; 0 picks a free one")
    ray: RayRequest = Field(default_factory=RayRequest, description=RAY_HELP)
    fleet: str | None = Field(
        None, pattern=f"^{FLEET_NAME}$",
        description="attach to this running fleet's warm replicas instead of starting replicas (an adapter job: "
        "model.lora_rank > 0; replicas, device and ports are then the fleet's; docs/fleet.md)",
    )


class RewardResources(StrictModel):
    """The reward workers: how many, on which device (reward model), on which ports."""

    replicas: int = Field(1, ge=0, le=1024, description="reward worker processes")
    device: Device = Field("cpu", description="device the reward model (reward.reward_model) runs on")
    cpus: CpuList = Field(None, description=CPUS_HELP)
    grpc_port: int | None = Field(0, ge=0, le=65535, description="RewardService gRPC port; 0 picks one; null = off")
    metrics_port: int = Field(0, ge=0, le=65535, description="/health /ready /metrics port; 0 picks a free one")
    ray: RayRequest = Field(default_factory=RayRequest, description=RAY_HELP)


class FeederResources(StrictModel):
    """The prompt feeder's HTTP port (``feeder_svc``, one per job)."""

    metrics_port: int = Field(0, ge=0, le=65535, description="/health /ready /metrics port; 0 picks a free one")


class ServicesConfig(StrictModel):
    """Resources, kept apart from the algorithm."""

    host: str = Field("127.0.0.1", min_length=1, description="address every service binds its gRPC/HTTP servers to")
    trainer: TrainerResources = Field(default_factory=TrainerResources, description="trainer ranks")
    rollout: RolloutResources = Field(default_factory=RolloutResources, description="vLLM rollout replicas")
    reward: RewardResources = Field(default_factory=RewardResources, description="reward workers")
    feeder: FeederResources = Field(default_factory=FeederResources, description="standalone prompt feeder")
    restart: RestartConfig = Field(default_factory=RestartConfig, description="restart policy, liveness and stall deadlines")
    launcher: Literal["local", "ray"] = Field(
        "local",
        description="where `meshrl run` starts the services: local = child processes on this machine; ray = one Ray "
        "actor per service instance on a Ray cluster (services.ray; docs/ray.md)",
    )
    ray: RayLauncherConfig = Field(default_factory=RayLauncherConfig, description="the Ray cluster and placement")


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

    max_in_flight: int | None = Field(
        None, ge=1, le=10_000_000,
        description="the feeder's admission bound in prompts unfinished at once (fed, not yet trained or dropped); "
        "null: (max_staleness + 1) * train_batch_size. Smaller keeps fewer samples waiting for the trainer "
        "(fresher, fewer dropped as stale) at the cost of less lookahead; from train_batch_size up to the default",
    )

    def max_in_flight_for(self, train_batch_size: int) -> int:
        """The feeder's admission bound: ``max_in_flight``, by default
        ``(max_staleness + 1) * train_batch_size`` prompts unfinished at once (fed and not yet
        trained or dropped)."""
        if self.max_in_flight is not None:
            return self.max_in_flight
        return (self.max_staleness + 1) * train_batch_size

    @model_validator(mode="after")
    def _sync_is_on_policy(self) -> "AsyncConfig":
        if self.mode == "sync" and self.max_staleness != 0:
            raise ValueError(
                f"max_staleness={self.max_staleness} with mode=sync: a synchronous job trains on-policy only "
                "(set async.max_staleness=0)"
            )
        return self


_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")  # fullmatch: "$" would let a trailing newline through


class JobSpec(StrictModel):
    """A whole meshrl job (see docs/contracts.md and examples/quickstart.yaml)."""

    name: str = Field(description="job name: lowercase letters, digits and '-', at most 63 characters")
    model: ModelConfig = Field(description="the policy checkpoint")
    data: DataConfig = Field(description="prompts")
    services: ServicesConfig = Field(default_factory=ServicesConfig, description="resources")
    async_: AsyncConfig = Field(default_factory=AsyncConfig, alias="async", description="staleness bound")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="generation (verl rollout.*)")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="scoring (verl reward / custom fn)")
    actor: ActorConfig = Field(default_factory=ActorConfig, description="policy updates (verl actor.*)")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="value model (PPO/GAE only)")
    ref: RefConfig = Field(default_factory=RefConfig, description="reference policy for KL")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="advantages, KL, off-policy")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="training loop and checkpoints")
    queues: QueueConfig = Field(
        default_factory=EmbeddedQueueConfig, description="stream backend: embedded (no Redis) or redis"
    )
    weights: WeightChannelConfig = Field(default_factory=WeightChannelConfig, description="the weight channel")

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not _NAME_RE.fullmatch(v):
            raise ValueError("must be lowercase letters, digits and '-', start alphanumeric, at most 63 characters")
        return v

    @model_validator(mode="after")
    def _cross_block_checks(self) -> "JobSpec":
        problems = []
        if self.actor.ppo_mini_batch_size > self.data.train_batch_size:
            problems.append(
                f"actor.ppo_mini_batch_size ({self.actor.ppo_mini_batch_size}) exceeds data.train_batch_size "
                f"({self.data.train_batch_size}); both count prompts"
            )
        elif self.data.train_batch_size % self.actor.ppo_mini_batch_size:
            problems.append(
                f"data.train_batch_size ({self.data.train_batch_size}) must be a multiple of "
                f"actor.ppo_mini_batch_size ({self.actor.ppo_mini_batch_size})"
            )
        window, batch = self.async_.max_in_flight, self.data.train_batch_size
        if window is not None and window < batch:
            problems.append(
                f"async.max_in_flight ({window}) is below data.train_batch_size ({batch}): "
                "a batch could never be admitted"
            )
        elif window is not None and window > (self.async_.max_staleness + 1) * batch:
            problems.append(
                f"async.max_in_flight ({window}) exceeds (async.max_staleness + 1) * data.train_batch_size "
                f"({(self.async_.max_staleness + 1) * batch}): the rest could only go stale (raise max_staleness)"
            )
        if self.algorithm.adv_estimator in ("grpo", "rloo", "grpo_passk") and self.rollout.n < 2:
            problems.append(f"algorithm.adv_estimator={self.algorithm.adv_estimator} needs rollout.n >= 2 (a group)")
        if self.model.dtype == "float16":
            problems.append(
                "model.dtype: float16 cannot be trained (the trainer does no loss scaling); set model.dtype=bfloat16 "
                "or float32, and rollout.dtype=float16 to generate in float16"
            )
        if self.reward.reward_model.enable is False and self.services.reward.device == "cuda":
            problems.append(
                "services.reward.device: cuda is used only by a reward model (reward.reward_model.enable=true); "
                "the rule/function scorers run on CPU"
            )
        problems += self._canary_problems() + self._fleet_problems()
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _fleet_problems(self) -> list[str]:
        """What ``services.rollout.fleet`` needs from the other blocks (the fleet itself checks
        the model, rank and lengths when the job attaches)."""
        fleet = self.services.rollout.fleet
        if fleet is None:
            return []
        out = []
        if not self.model.lora:
            out.append(f"services.rollout.fleet={fleet}: a fleet serves adapter jobs only: set model.lora_rank > 0 "
                       "(a full fine-tuning job starts its own replicas)")
        if self.services.launcher != "local":
            out.append(f"services.rollout.fleet={fleet} with services.launcher={self.services.launcher}: a job "
                       "attaches to a fleet on its own machine (services.launcher=local)")
        if self.weights.rollout.mode == "canary":
            out.append(f"services.rollout.fleet={fleet} with weights.rollout.mode=canary: a fleet's replicas serve "
                       "each job's promoted version only (run the canary on the job's own replicas)")
        if self.rollout.multi_turn.enable:
            out.append(f"services.rollout.fleet={fleet} with rollout.multi_turn.enable: a fleet serves single-turn "
                       "generation only")
        return out

    def _canary_problems(self) -> list[str]:
        """What ``weights.rollout.mode=canary`` needs from the other blocks."""
        gate = self.weights.rollout
        if gate.mode != "canary":
            return []
        out = []
        if self.async_.mode == "sync":
            out.append("weights.rollout.mode=canary with async.mode=sync: a synchronous job waits for every replica "
                       "to serve the trainer's newest version, which the promoted replicas never do; use async")
        if gate.canary_replicas >= self.services.rollout.replicas:
            out.append(f"weights.rollout.canary_replicas ({gate.canary_replicas}) must be below "
                       f"services.rollout.replicas ({self.services.rollout.replicas}): some replicas must serve the "
                       "promoted version")
        if not self.rollout.calculate_log_probs:
            out.append("weights.rollout.mode=canary compares the replicas' log-probs with the trainer's: set "
                       "rollout.calculate_log_probs=true")
        per_batch = self.data.train_batch_size * self.rollout.n
        if gate.samples_to_decide(per_batch) > per_batch:
            out.append(f"weights.rollout.promote_after_samples ({gate.promote_after_samples}) exceeds one batch "
                       f"(data.train_batch_size * rollout.n = {per_batch}): a candidate is judged within one batch")
        return out

    def resolve_paths(self, base: Path) -> None:
        """Make the spec's input file paths absolute, relative to ``base`` (the spec's directory)."""
        self.model.resolve_paths(base)
        self.data.resolve_paths(base)
        self.rollout.multi_turn.resolve_paths(base)


def parse_job(raw: dict[str, Any], overrides: Sequence[str] = ()) -> JobSpec:
    """Validate a raw mapping (plus overrides) into the job spec, or raise JobSpecError."""
    return validate(JobSpec, raw, overrides, what="job spec")


def load_job(path: str | Path, overrides: Sequence[str] = ()) -> JobSpec:
    """Read a YAML job spec, apply overrides, validate. Relative model/data paths that exist
    next to the spec file are resolved against its directory."""
    return load_model(JobSpec, path, overrides, what="job spec")


def dump_job(spec: JobSpec) -> str:
    """The resolved spec as YAML (aliases such as ``async`` used, defaults included)."""
    return dump_model(spec)


def job_spec_class() -> type[JobSpec]:
    """The job spec class (kept for callers that took it lazily when it lived in its own module)."""
    return JobSpec
