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
    replicas: 1
    max_jobs: 4                      # adapter slots per replica: jobs served at once

Imports only pydantic and the config package.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from services.config.base import StrictModel
from services.config.job import CPUS_HELP, FLEET_NAME, CpuList, Device, ModelConfig
from services.config.lora import vllm_max_lora_rank
from services.config.restart import RestartConfig
from services.config.rollout import RolloutConfig

NAME_PATTERN = FLEET_NAME  # a directory and a metric label


class FleetResources(StrictModel):
    """Where the fleet's replicas run and answer."""

    host: str = Field("127.0.0.1", min_length=1, description="address every replica binds its servers to")
    device: Device = Field("cpu", description="device vLLM runs on")
    cpus: CpuList = Field(None, description=CPUS_HELP + "; shared by the fleet's replicas")


class FleetSpec(StrictModel):
    """A named set of warm rollout replicas for one base model (see module doc)."""

    name: str = Field(pattern=f"^{NAME_PATTERN}$", description="the fleet's name; jobs attach with "
                      "services.rollout.fleet: NAME")
    model: ModelConfig = Field(description="the base model; model.lora_rank is the largest adapter rank a job may bring")
    rollout: RolloutConfig = Field(description="the vLLM engine of every replica; prompt_length and response_length "
                                   "are the longest a job may use")
    replicas: int = Field(1, ge=1, le=1024, description="rollout replica processes, each one vLLM engine")
    max_jobs: int = Field(4, ge=1, le=256, description="adapter slots per replica: how many jobs it serves at once")
    services: FleetResources = Field(default_factory=FleetResources, description="host, device and CPUs")
    restart: RestartConfig = Field(default_factory=RestartConfig, description="restart policy of the replicas")

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
        return self

    def resolve_paths(self, base: Path) -> None:
        self.model.resolve_paths(base)

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
