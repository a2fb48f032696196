"""A fleet's spec, and what a job must agree on to attach to it (docs/fleet.md).

A fleet is a named set of rollout replicas of one base model, started once and kept warm;
adapter jobs (``model.lora_rank > 0``) attach to it with ``services.rollout.fleet: NAME``
instead of starting replicas of their own. The fleet fixes what one vLLM engine fixes for
every request it batches: the base model and its dtype, the largest adapter rank, the
longest prompt and response, the engine's sizes. A job fixes the rest per request: its
adapter, its sampling settings, its queues and its weight channel.

    name: smol                       # [a-z0-9][a-z0-9-]*, unique on the machine
    model:                           # the base model every job's adapter sits on
      path: runs/smollm2/model
      lora_rank: 16                  # the largest adapter rank a job may bring
    rollout:                         # the engine: lengths are the longest a job may use
      prompt_length: 192
      response_length: 96
    replicas: 1                      # replicas at start
    max_jobs: 4                      # adapter slots per replica: jobs served at once
    scaling:                         # optional: replicas follow the jobs' backlog (docs/fleet.md)
      min_replicas: 1
      max_replicas: 3

Imports only pydantic and the config package.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from services.config.base import StrictModel
from services.config.job import CPUS_HELP, FLEET_NAME, CpuList, Device, ModelConfig, RayLauncherConfig, RayRequest
from services.config.lora import vllm_max_lora_rank
from services.config.restart import RestartConfig
from services.config.rollout import RolloutConfig

NAME_PATTERN = FLEET_NAME  # a directory and a metric label


class FleetRayConfig(RayLauncherConfig):
    """``services.ray`` of a fleet with ``services.launcher: ray``: the job spec's Ray block
    (the cluster, the placement timeout, the namespace) and what each replica asks Ray for.
    Each replica has a placement group of its own (one bundle), created when it starts and
    removed when it is drained, so ``strategy`` has nothing to arrange: only ``PACK`` (the
    default) is accepted; spread replicas over nodes with ``replica.resources`` or ``replica.labels``."""

    replica: RayRequest = Field(default_factory=RayRequest, description="what each replica asks Ray for (its "
                                "placement group's one bundle): num_cpus (default: the length of services.cpus, "
                                "else 1), custom resources, node labels; a cuda replica also asks one GPU")

    @field_validator("strategy")
    @classmethod
    def _one_bundle(cls, v: str) -> str:
        if v != "PACK":
            raise ValueError(f"services.ray.strategy={v}: a fleet places each replica in a placement group of its own "
                             "(one bundle), so there is nothing to pack or spread; place replicas with "
                             "services.ray.replica.resources or services.ray.replica.labels")
        return v


class FleetResources(StrictModel):
    """Where the fleet's replicas run and answer."""

    host: str = Field("127.0.0.1", min_length=1, description="address every replica binds its servers to")
    device: Device = Field("cpu", description="device vLLM runs on")
    cpus: CpuList = Field(None, description=CPUS_HELP + "; shared by the fleet's replicas")
    metrics_port: int = Field(0, ge=0, le=65535, description="the fleet process's /metrics (replicas, backlog, "
                              "scaling decisions); 0 picks a free one (in fleet.json)")
    launcher: Literal["local", "ray"] = Field(
        "local", description="where the replicas run: local = child processes of the fleet's process; ray = one Ray "
        "actor per replica on a Ray cluster (services.ray; the fleet's process is the Ray driver; docs/fleet.md, "
        "'On Ray')")
    ray: FleetRayConfig = Field(default_factory=FleetRayConfig, description="the Ray cluster and what each replica "
                                "asks it for (services.launcher=ray)")


class FleetScaling(StrictModel):
    """How many replicas a fleet runs as its jobs' backlog changes (``scaling``; docs/fleet.md,
    "Scaling"). Without ``max_replicas`` above ``min_replicas`` the fleet keeps ``replicas``."""

    min_replicas: int | None = Field(None, ge=1, le=1024, description="fewest replicas (default: replicas)")
    max_replicas: int | None = Field(None, ge=1, le=1024, description="most replicas (default: replicas)")
    interval_s: float = Field(2.0, gt=0, le=3600, description="seconds between two readings of the jobs' signals")
    up_backlog: float = Field(
        16.0, ge=0, description="prompt groups not generated yet (queued, or leased and generating; summed over "
        "the jobs) per serving replica at or above which a replica is added, once it held for up_after_s")
    down_backlog: float = Field(
        4.0, ge=0, description="at or below this backlog per replica, with no trainer waiting for samples, a "
        "replica is drained, once it held for down_after_s")
    up_after_s: float = Field(6.0, ge=0, le=86_400, description="the backlog stays high this long before a replica is added")
    down_after_s: float = Field(20.0, ge=0, le=86_400, description="the backlog stays low this long before a replica is drained")
    cooldown_s: float = Field(20.0, ge=0, le=86_400, description="at most one change of the replica count per this "
                              "many seconds (no flapping)")
    drain_timeout_s: float = Field(60.0, gt=0, le=3600, description="a draining replica that has not exited after "
                                   "this long is killed (what it leased returns to its job's queue)")

    @model_validator(mode="after")
    def _thresholds(self) -> "FleetScaling":
        if self.down_backlog >= self.up_backlog:
            raise ValueError(f"scaling.down_backlog ({self.down_backlog:g}) must be below scaling.up_backlog "
                             f"({self.up_backlog:g}): the gap between them keeps the fleet from flapping")
        return self

    def bounds(self, replicas: int) -> tuple[int, int]:
        lo = self.min_replicas if self.min_replicas is not None else replicas
        hi = self.max_replicas if self.max_replicas is not None else max(replicas, lo)
        return lo, hi


class FleetSpec(StrictModel):
    """A named set of warm rollout replicas for one base model (see module doc)."""

    name: str = Field(pattern=f"^{NAME_PATTERN}$", description="the fleet's name; jobs attach with "
                      "services.rollout.fleet: NAME")
    model: ModelConfig = Field(description="the base model; model.lora_rank is the largest adapter rank a job may bring")
    rollout: RolloutConfig = Field(description="the vLLM engine of every replica; prompt_length and response_length "
                                   "are the longest a job may use")
    replicas: int = Field(1, ge=1, le=1024, description="rollout replica processes at start, each one vLLM engine")
    max_jobs: int = Field(4, ge=1, le=256, description="adapter slots per replica: how many jobs it serves at once")
    services: FleetResources = Field(default_factory=FleetResources,
                                     description="host, device, CPUs, metrics port and launcher (local or ray)")
    restart: RestartConfig = Field(default_factory=RestartConfig, description="restart policy of the replicas")
    scaling: FleetScaling = Field(default_factory=FleetScaling, description="replicas added and drained on the "
                                  "jobs' backlog, between min_replicas and max_replicas")

    @field_validator("name")
    @classmethod
    def _no_newline(cls, v: str) -> str:
        import re

        if not re.fullmatch(NAME_PATTERN, v):
            raise ValueError(f"fleet name {v!r} must match {NAME_PATTERN}")
        return v

    @model_validator(mode="after")
    def _adapters(self) -> "FleetSpec":
        if self.model.lora_rank <= 0:
            raise ValueError("model.lora_rank must be > 0 on a fleet: it is the largest adapter rank a job may bring "
                             "(a fleet serves adapter jobs)")
        for key in ("prompt_length", "response_length"):
            if getattr(self.rollout, key) is None:
                raise ValueError(f"rollout.{key} is required on a fleet: the longest a job may use")
        if self.rollout.multi_turn.enable:
            raise ValueError("rollout.multi_turn: a fleet serves single-turn generation only (tools run in a job's "
                             "own replicas)")
        lo, hi = self.scaling.bounds(self.replicas)
        if not lo <= self.replicas <= hi:
            raise ValueError(f"replicas ({self.replicas}) must lie within scaling.min_replicas ({lo}) and "
                             f"scaling.max_replicas ({hi})")
        return self

    def resolve_paths(self, base: Path) -> None:
        self.model.resolve_paths(base)

    @property
    def elastic(self) -> bool:
        """The replica count follows the backlog (max_replicas above min_replicas)."""
        lo, hi = self.scaling.bounds(self.replicas)
        return hi > lo

    def replica_names(self) -> list[str]:
        """Every replica the fleet may run, ``rollout-0`` .. ``rollout-<max_replicas - 1>``: a job
        hands the fleet its view for each, so a replica that joins later finds the job there."""
        return [f"rollout-{i}" for i in range(self.scaling.bounds(self.replicas)[1])]

    @property
    def max_lora_rank(self) -> int:
        """The adapter rank vLLM is started with (the smallest it allows at or above ``model.lora_rank``)."""
        return vllm_max_lora_rank(self.model.lora_rank)


def attach_problems(fleet: FleetSpec, view: Any) -> list[str]:
    """Why the job whose rollout view is ``view`` cannot attach to ``fleet`` (one line each,
    naming the job's key); empty when it can."""
    out = []
    m, r = view.model, view.rollout
    if not m.lora_rank:
        out.append(f"services.rollout.fleet: fleet {fleet.name!r} serves adapter jobs only: set model.lora_rank > 0 "
                   "(a full fine-tuning job starts its own replicas)")
    elif m.lora_rank > fleet.max_lora_rank:
        out.append(f"model.lora_rank ({m.lora_rank}) exceeds the largest rank fleet {fleet.name!r} serves "
                   f"({fleet.max_lora_rank})")
    if _same_path(m.path) != _same_path(fleet.model.path):
        out.append(f"model.path {m.path!r} is not fleet {fleet.name!r}'s base model {fleet.model.path!r}")
    if _same_path(m.tokenizer) != _same_path(fleet.model.tokenizer):
        out.append(f"model.tokenizer_path {m.tokenizer!r} is not fleet {fleet.name!r}'s tokenizer")
    for key in ("prompt_length", "response_length"):
        mine, theirs = getattr(r, key), getattr(fleet.rollout, key)
        if mine is not None and mine > theirs:
            out.append(f"data.max_{key} ({mine}) exceeds fleet {fleet.name!r}'s rollout.{key} ({theirs})")
    if r.multi_turn.enable:
        out.append("rollout.multi_turn.enable: a fleet serves single-turn generation only")
    weights = getattr(view, "weights", None)
    if weights is not None and weights.rollout.mode == "canary":
        out.append("weights.rollout.mode=canary: a fleet's replicas serve every job's promoted version only "
                   "(run the canary on the job's own replicas)")
    return out


def _same_path(p: str | None) -> str | None:
    return os.path.realpath(p) if p and os.path.exists(p) else p
