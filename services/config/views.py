"""One typed view per service, cut out of the job spec once, by the controller.

A view is a service's whole config: ``python -m trainer_svc --config trainer.yaml`` reads
exactly that file and nothing else (no job spec, no guessing what kind of file it got).
Views keep the job's key names (``model.path``, ``rollout.n``, ``async.max_staleness``,
``actor.*`` ...), so a key means the same thing everywhere; a view's ``resources`` block
holds that service's slice of the job's ``services`` block (plus ``services.host``).

Which job key goes to which view is declared once, as data (``TAKES``): the derivation
follows it, and ``tests/unit/test_config_views.py`` walks :class:`JobSpec` and fails if
any key reaches no view (except the few in ``CONTROLLER_ONLY``, each with its reason).

    views = derive_views(job)                # {"trainer": TrainerView, "rollout": ..., "reward": ..., "feeder": ...}
    paths = write_views(views, "run/config") # run/config/trainer.yaml ...
    view = load_view(TrainerView, "run/config/trainer.yaml", overrides)

``meshrl views JOB.yaml --out DIR`` writes the same files without running anything.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import Field, model_validator

from services.config.base import StrictModel
from services.config.job import CPUS_HELP, AsyncConfig, CpuList, DataConfig, Device, JobSpec, ModelConfig
from services.config.loader import ConfigError, load_model, read_mapping, resolve_path
from services.config.queues import QueueConfig
from services.config.reward import RewardConfig
from services.config.rollout import RolloutConfig
from services.config.trainer import ActorConfig, AlgorithmConfig, CriticConfig, RefConfig, TrainerConfig
from services.config.weights import RolloutGateConfig, WeightChannelConfig

# ---------------------------------------------------------------------------------------------------------------
# Small blocks: the part of a job block one service reads (same key names as the job's)


class TrainerData(StrictModel):
    """``data.*`` keys the trainer reads."""

    train_batch_size: int = Field(ge=1, description="prompts (groups) per training step")


class TrainerRollout(StrictModel):
    """``rollout.*`` keys the trainer reads."""

    n: int = Field(1, ge=1, le=65536, description="samples per prompt (the group size)")
    temperature: float = Field(
        1.0, ge=0.0, le=100.0, description="sampling temperature; the trainer divides logits by it (0 = greedy: by 1)"
    )


class FeederRollout(StrictModel):
    """``rollout.*`` keys the feeder reads."""

    n: int = Field(1, ge=1, le=65536, description="samples per prompt, written into each prompt item")


class TrainerProcess(StrictModel):
    """The trainer's resources (the job's ``services.trainer`` plus ``services.host``)."""

    nproc: int = Field(1, ge=1, le=4096, description="trainer ranks")
    device: Device = Field("cpu", description="cpu uses gloo, cuda uses nccl")
    torch_threads: int = Field(0, ge=0, le=1024, description="intra-op threads per rank; 0 = its CPUs / nproc")
    cpus: CpuList = Field(None, description=CPUS_HELP)
    host: str = Field("127.0.0.1", min_length=1, description="address of /health /ready /metrics")
    metrics_port: int = Field(0, ge=0, le=65535, description="port of /health /ready /metrics; 0 = any free")


class RolloutProcess(StrictModel):
    """One replica's resources (the job's ``services.rollout`` plus ``services.host``)."""

    device: Device = Field("cpu", description="device vLLM runs on; the replica refuses one its vLLM build lacks")
    cpus: CpuList = Field(None, description=CPUS_HELP + "; vLLM's CPU threads are bound to them")
    host: str = Field("127.0.0.1", min_length=1, description="address the gRPC and HTTP servers bind")
    grpc_port: int = Field(0, ge=0, le=65535, description="RolloutService gRPC port; 0 picks a free one")
    metrics_port: int = Field(0, ge=0, le=65535, description="/health /ready /metrics port; 0 picks a free one")


class RewardProcess(StrictModel):
    """One reward worker's resources (the job's ``services.reward`` plus ``services.host``)."""

    device: Device = Field("cpu", description="device the reward model runs on")
    cpus: CpuList = Field(None, description=CPUS_HELP)
    host: str = Field("127.0.0.1", min_length=1, description="address the gRPC and HTTP servers bind")
    grpc_port: int | None = Field(0, ge=0, le=65535, description="RewardService gRPC port; 0 picks one; null = off")
    metrics_port: int = Field(0, ge=0, le=65535, description="/health /ready /metrics port; 0 picks a free one")


class FeederProcess(StrictModel):
    """The standalone feeder's resources."""

    host: str = Field("127.0.0.1", min_length=1, description="address of /health /ready /metrics")
    metrics_port: int = Field(0, ge=0, le=65535, description="/health /ready /metrics port; 0 picks a free one")


class SyntheticSourceConfig(StrictModel):
    """Deterministic synthetic experience (the trainer's source when its view has no queue)."""

    prompt_len: int = Field(16, ge=1, le=65536, description="padded prompt length, tokens")
    response_len: int = Field(16, ge=1, le=65536, description="padded response length, tokens")
    seed: int = Field(0, ge=0, description="seed of the batch contents (batch k uses seed and k)")


# ---------------------------------------------------------------------------------------------------------------
# The four views


class TrainerView(StrictModel):
    """Everything ``python -m trainer_svc`` reads."""

    service: Literal["trainer"] = Field("trainer", description="which service this view drives")
    model: ModelConfig = Field(description="the policy checkpoint (and reference / critic default)")
    data: TrainerData = Field(description="batch size")
    rollout: TrainerRollout = Field(default_factory=TrainerRollout, description="group size and temperature")
    async_: AsyncConfig = Field(default_factory=AsyncConfig, alias="async", description="staleness bound")
    actor: ActorConfig = Field(default_factory=ActorConfig, description="policy")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="value model")
    ref: RefConfig = Field(default_factory=RefConfig, description="reference policy")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="advantages and KL")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="loop and checkpoints")
    resources: TrainerProcess = Field(default_factory=TrainerProcess, description="ranks, device, threads, port")
    queues: QueueConfig | None = Field(
        None, description="backend of the experience stream; null = synthetic batches (smoke runs, benchmarks)"
    )
    weights: WeightChannelConfig | None = Field(None, description="weight channel to publish on; null = do not publish")
    synthetic: SyntheticSourceConfig = Field(
        default_factory=SyntheticSourceConfig, description="shape of synthetic batches when queues is null"
    )

    @model_validator(mode="after")
    def _check(self) -> "TrainerView":
        mini, tbs = self.actor.ppo_mini_batch_size, self.data.train_batch_size
        if mini > tbs:
            raise ValueError(f"actor.ppo_mini_batch_size ({mini}) exceeds data.train_batch_size ({tbs})")
        if tbs % mini:
            raise ValueError(f"data.train_batch_size ({tbs}) must be a multiple of actor.ppo_mini_batch_size ({mini})")
        if self.model.dtype == "float16":
            raise ValueError("model.dtype: float16 cannot be trained (no loss scaling); use bfloat16 or float32")
        return self

    @property
    def canary_groups(self) -> int:
        """Canary mode: the prompt groups that hold a candidate's ``promote_after_samples``
        (:func:`canary_groups`)."""
        assert self.weights is not None
        return canary_groups(self.weights.rollout, self.data.train_batch_size, self.rollout.n)

    @property
    def use_critic(self) -> bool:
        if self.critic.enable is not None:
            return self.critic.enable
        return self.algorithm.adv_estimator == "gae"

    @property
    def use_ref(self) -> bool:
        return self.actor.use_kl_loss or self.algorithm.use_kl_in_reward

    def resolve_paths(self, base: Path) -> None:
        self.model.resolve_paths(base)
        self.critic.model_path = resolve_path(self.critic.model_path, base)


class RolloutView(StrictModel):
    """Everything ``python -m rollout_svc`` reads (one replica)."""

    service: Literal["rollout"] = Field("rollout", description="which service this view drives")
    model: ModelConfig = Field(description="the checkpoint vLLM starts from (model.dtype unless rollout.dtype)")
    rollout: RolloutConfig = Field(description="sampling, engine and replica loop; prompt/response lengths resolved")
    resources: RolloutProcess = Field(default_factory=RolloutProcess, description="device and ports")
    queues: QueueConfig | None = Field(None, description="prompts/rollouts streams; null = direct gRPC calls only")
    weights: WeightChannelConfig | None = Field(None, description="weight channel to follow; null = fixed weights")

    @model_validator(mode="after")
    def _lengths(self) -> "RolloutView":
        for key in ("prompt_length", "response_length"):
            if getattr(self.rollout, key) is None:
                raise ValueError(f"rollout.{key} is required in a rollout view (the job's data.max_{key})")
        return self

    @property
    def dtype(self) -> str:
        """The dtype vLLM runs in: ``rollout.dtype``, or ``model.dtype`` when that is ``auto``."""
        return self.model.dtype if self.rollout.dtype == "auto" else self.rollout.dtype

    def resolve_paths(self, base: Path) -> None:
        self.model.resolve_paths(base)


class RewardView(StrictModel):
    """Everything ``python -m reward_svc`` reads (one worker)."""

    service: Literal["reward"] = Field("reward", description="which service this view drives")
    reward: RewardConfig = Field(description="scorers, sandbox and streams; tokenizer_path resolved")
    resources: RewardProcess = Field(default_factory=RewardProcess, description="device (reward model) and ports")
    queues: QueueConfig | None = Field(None, description="rollouts/experience streams; null = gRPC Score only")

    @model_validator(mode="after")
    def _tokenizer(self) -> "RewardView":
        if not self.reward.tokenizer_path:
            raise ValueError("reward.tokenizer_path is required in a reward view (the job's model tokenizer)")
        return self

    def resolve_paths(self, base: Path) -> None:
        r = self.reward
        r.tokenizer_path = resolve_path(r.tokenizer_path, base)
        r.reward_model.path = resolve_path(r.reward_model.path, base)
        if r.custom_reward_function.path and r.custom_reward_function.path.endswith(".py"):
            r.custom_reward_function.path = resolve_path(r.custom_reward_function.path, base)


class FeederView(StrictModel):
    """Everything the prompt feeder (``feeder_svc``) reads."""

    service: Literal["feeder"] = Field("feeder", description="which service this view drives")
    name: str = Field(min_length=1, description="job name: the prefix of every prompt uid")
    model: ModelConfig = Field(description="the tokenizer prompts are templated with")
    data: DataConfig = Field(description="prompt files and their order")
    rollout: FeederRollout = Field(default_factory=FeederRollout, description="group size")
    async_: AsyncConfig = Field(default_factory=AsyncConfig, alias="async", description="admission bound")
    queues: QueueConfig = Field(description="the prompts stream")
    resources: FeederProcess = Field(default_factory=FeederProcess, description="HTTP port")
    trainer_metrics_url: str | None = Field(
        None, description="the trainer's /metrics (with async.mode=sync, its policy version paces the batches); "
        "null when its port is 0"
    )
    trainer_metrics_file: str | None = Field(
        None, description="the file the trainer appends a line to per committed step (trainer.metrics_file); with "
        "async.mode=sync the feeder watches it so the next batch goes out as soon as a step ends",
    )
    rollout_metrics_urls: list[str] = Field(
        default_factory=list, max_length=4096,
        description="with async.mode=sync: every replica's /metrics (a batch goes out once all serve the trainer's "
        "version); `meshrl run` fills it in",
    )
    feed_each_step: bool = Field(
        False, description="asynchronously too, watch trainer_metrics_file and top the prompts up as soon as a step "
        "ends, not a poll later: set where weights.rollout.mode is canary (a canary that has just loaded a "
        "candidate waits for prompts before it can make the samples the candidate is judged on)",
    )

    @property
    def max_in_flight(self) -> int:
        """Admission bound: ``async.max_in_flight``, by default
        ``(async.max_staleness + 1) * data.train_batch_size`` prompts."""
        return self.async_.max_in_flight_for(self.data.train_batch_size)

    def resolve_paths(self, base: Path) -> None:
        self.model.resolve_paths(base)
        self.data.resolve_paths(base)


View = TrainerView | RolloutView | RewardView | FeederView
VIEW_CLASSES: dict[str, type[StrictModel]] = {
    "trainer": TrainerView, "rollout": RolloutView, "reward": RewardView, "feeder": FeederView,
}  # fmt: skip
V = TypeVar("V", TrainerView, RolloutView, RewardView, FeederView)


# ---------------------------------------------------------------------------------------------------------------
# The canary gate's sizes, resolved once here (docs/weights.md, "How the canary sizes itself")

CANARY_GATE_VERSIONS = 2
"""Versions of staleness budget the canary gate takes beside the queue's: the promoted
replicas serve a version about two behind the trainer (a candidate is published, the canary
makes its samples, the next step judges them)."""

CANARY_JUDGE_GROUPS = 4
"""Groups of a candidate's samples judged by default: the lag-0 log-prob check needs few
(a faithful canary's gap is 0.0000, a bad version's several nats)."""


def canary_groups(gate: RolloutGateConfig, train_batch_size: int, n: int) -> int:
    """The prompt groups that hold a candidate's ``promote_after_samples`` (rounded up): what
    a canary keeps in reserve for the next candidate (``rollout.canary_reserve_groups``) and
    what the trainer's park limit leaves room for. Computed here only."""
    return -(-gate.samples_to_decide(train_batch_size * n) // n)


@dataclass(frozen=True)
class CanarySizing:
    """What canary mode runs with: the trainer's staleness budget (its view's
    ``async.max_staleness``), the feeder's admission window (``async.max_in_flight``, for
    the trainer's park limit too) and ``promote_after_samples``."""

    max_staleness: int
    max_in_flight: int
    promote_after_samples: int


def size_canary(job: JobSpec) -> CanarySizing | None:
    """The canary gate's sizes for ``job`` (None in mode ``all``); a value the user set wins.

    * window: ``async.max_in_flight``, by default ``(async.max_staleness + 1)`` batches --
      what the user's ``max_staleness`` gives, not the enlarged budget (a deeper window only
      makes the queued samples older);
    * budget: ``weights.rollout.staleness_budget``, by default the queue's share plus
      :data:`CANARY_GATE_VERSIONS`. The queue's share is ``max(async.max_staleness,
      ceil(window / train_batch_size))``: on a trainer-bound job a prompt admitted at the
      back of a full window is trained that many versions later. At the quick start's
      settings (``max_staleness: 1``, 32 prompts) that is 2 + 2 = 4 with a window of 64
      prompts: the settings measured at 0.93-0.98 of mode ``all``'s throughput;
    * ``promote_after_samples``: as set, by default :data:`CANARY_JUDGE_GROUPS` groups'
      samples, at most a batch's.
    """
    gate = job.weights.rollout
    if gate.mode != "canary":
        return None
    batch, n = job.data.train_batch_size, job.rollout.n
    window = job.async_.max_in_flight_for(batch)
    budget = gate.staleness_budget
    if budget is None:
        budget = max(job.async_.max_staleness, -(-window // batch)) + CANARY_GATE_VERSIONS
    promote = gate.promote_after_samples or min(CANARY_JUDGE_GROUPS * n, batch * n)
    return CanarySizing(max_staleness=budget, max_in_flight=window, promote_after_samples=promote)


# ---------------------------------------------------------------------------------------------------------------
# Which job key goes where: the one table


@dataclass(frozen=True)
class Take:
    """Copy the job's value at ``job`` (dotted, aliases as in YAML) to ``view`` in the view;
    ``fill``: only where the view's value is still null (a derived default)."""

    view: str
    job: str
    fill: bool = False


def _same(*paths: str) -> tuple[Take, ...]:
    return tuple(Take(p, p) for p in paths)


TAKES: dict[str, tuple[Take, ...]] = {
    "trainer": (
        *_same("model", "data.train_batch_size", "rollout.n", "rollout.temperature", "async.max_staleness",
               "async.max_in_flight",
               "actor", "critic", "ref", "algorithm", "trainer", "queues", "weights"),
        Take("resources.nproc", "services.trainer.nproc"),
        Take("resources.device", "services.trainer.device"),
        Take("resources.torch_threads", "services.trainer.torch_threads"),
        Take("resources.cpus", "services.trainer.cpus"),
        Take("resources.metrics_port", "services.trainer.metrics_port"),
        Take("resources.host", "services.host"),
    ),
    "rollout": (
        *_same("model", "rollout", "queues", "weights"),
        Take("rollout.prompt_length", "data.max_prompt_length", fill=True),
        Take("rollout.response_length", "data.max_response_length", fill=True),
        Take("resources.device", "services.rollout.device"),
        Take("resources.cpus", "services.rollout.cpus"),
        Take("resources.grpc_port", "services.rollout.grpc_port"),
        Take("resources.metrics_port", "services.rollout.metrics_port"),
        Take("resources.host", "services.host"),
    ),
    "reward": (
        *_same("reward", "queues"),
        Take("reward.tokenizer_path", "model.tokenizer_path", fill=True),
        Take("reward.tokenizer_path", "model.path", fill=True),
        Take("resources.device", "services.reward.device"),
        Take("resources.cpus", "services.reward.cpus"),
        Take("resources.grpc_port", "services.reward.grpc_port"),
        Take("resources.metrics_port", "services.reward.metrics_port"),
        Take("resources.host", "services.host"),
    ),
    "feeder": (
        *_same("name", "model", "data", "rollout.n", "async", "queues"),
        Take("resources.metrics_port", "services.feeder.metrics_port"),
        Take("resources.host", "services.host"),
        # trainer_metrics_url is built from services.host and services.trainer.metrics_port
    ),
}

# Keys no service view carries: only the controller (``meshrl run`` / the launchers) reads them.
CONTROLLER_ONLY: dict[str, str] = {
    "services.rollout.replicas": "how many rollout processes the launcher starts",
    "services.reward.replicas": "how many reward processes the launcher starts",
    **{f"services.restart.{k}": "supervision of the services by the launcher (services/supervision.py)"
       for k in ("max_restarts", "backoff_s", "backoff_max_s", "heartbeat_timeout_s", "stall_warn_s", "stall_timeout_s")},
    "services.launcher": "which launcher starts the services (services/ray_launcher/placement.py for ray)",
    "services.rollout.fleet": "the fleet whose replicas serve the job instead of its own (controller_svc/fleet_attach.py)",
    **{f"services.ray.{k}": "the Ray cluster and the job's placement group, used by the Ray launcher only"
       for k in ("address", "strategy", "placement_timeout_s", "namespace")},
    **{f"services.{svc}.ray.{k}": "the resource request of the service's Ray actor, made by the Ray launcher"
       for svc in ("trainer", "rollout", "reward") for k in ("num_cpus", "resources", "labels")},
}


def _get(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        node = node[part]
    return node


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def _lookup(tree: dict[str, Any], dotted: str) -> Any:
    try:
        return _get(tree, dotted)
    except (KeyError, TypeError):
        return None


def derive_view(job: JobSpec, service: str) -> StrictModel:
    """The view of ``service`` ("trainer", "rollout", "reward", "feeder") of ``job``."""
    if service not in TAKES:
        raise ConfigError(f"unknown service {service!r}; expected one of {sorted(TAKES)}")
    tree = job.model_dump(mode="json", by_alias=True)
    view: dict[str, Any] = {"service": service}
    for take in TAKES[service]:
        if take.fill and _lookup(view, take.view) is not None:
            continue
        _set(view, take.view, copy.deepcopy(_get(tree, take.job)))
    if service == "feeder":
        port = job.services.trainer.metrics_port
        view["trainer_metrics_url"] = f"http://{job.services.host}:{port}/metrics" if port else None
        view["feed_each_step"] = job.weights.rollout.mode == "canary"
    sized = size_canary(job)
    if sized is not None and service in ("trainer", "rollout"):
        view["weights"]["rollout"]["promote_after_samples"] = sized.promote_after_samples
    if sized is not None and service == "trainer":
        # the trainer's staleness budget has the gate's share; its window (the park limit's) is the feeder's
        view["async"].update(max_staleness=sized.max_staleness, max_in_flight=sized.max_in_flight)
    if sized is not None and service == "rollout":
        # a canary has a candidate's groups ready when it loads it (rollout_svc.replica)
        gate = RolloutGateConfig.model_validate(view["weights"]["rollout"])
        view["rollout"]["canary_reserve_groups"] = canary_groups(gate, job.data.train_batch_size, job.rollout.n)
    return VIEW_CLASSES[service].model_validate(view)


def derive_views(job: JobSpec) -> dict[str, StrictModel]:
    """All four views of ``job``, keyed by service."""
    return {name: derive_view(job, name) for name in TAKES}


def dump_view(view: StrictModel) -> str:
    return yaml.safe_dump(view.model_dump(mode="json", by_alias=True), sort_keys=False)


def write_private(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` readable by its owner only (0600): a job's spec and views
    may carry a queue password (docs/security.md)."""
    import os

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(text)
    return path


def write_view(view: StrictModel, path: str | Path) -> Path:
    return write_private(path, dump_view(view))


def write_views(views: dict[str, StrictModel], out_dir: str | Path) -> dict[str, Path]:
    """``<out_dir>/<service>.yaml`` for each view; returns the paths."""
    return {name: write_view(v, Path(out_dir) / f"{name}.yaml") for name, v in views.items()}


def load_view(cls: type[V], path: str | Path, overrides: Sequence[str] = ()) -> V:
    """The view in ``path`` (plus ``a.b=c`` overrides), or ConfigError. A file of another
    kind -- a job spec, another service's view -- is refused, saying what it is."""
    want = cls.model_fields["service"].default
    raw = read_mapping(path, f"{want} view")
    got = raw.get("service")
    if got is None and "name" in raw and ("services" in raw or "data" in raw):
        raise ConfigError(
            f"{path} is a job spec, not a {want} view: write the views with `meshrl views {path} --out DIR` "
            f"and pass DIR/{want}.yaml (`meshrl run` does this for you)"
        )
    if got is not None and got != want:
        raise ConfigError(f"{path} is the {got} service's view, not the {want} service's")
    return load_model(cls, path, overrides, what=f"{want} view")
