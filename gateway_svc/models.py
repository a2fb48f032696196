"""Pydantic bodies of the gateway's REST API (they are its published OpenAPI schema)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

JobStateName = Literal["pending", "running", "paused", "succeeded", "failed", "cancelled"]


class JobSubmit(BaseModel):
    """``POST /v1/jobs`` as JSON. (Send ``application/yaml`` instead to post the YAML file
    itself, with overrides as repeated ``override`` query parameters.)"""

    model_config = ConfigDict(extra="forbid")

    spec: str | dict[str, Any] = Field(
        description="the job spec: YAML text, or the same structure as a JSON object (see `meshrl validate`)"
    )
    overrides: list[str] = Field(
        default_factory=list, max_length=256, description="OmegaConf-style `a.b=c` overrides applied to the spec"
    )


class ReplicaWeights(BaseModel):
    """One rollout replica on the weight plane."""

    served_version: int | None = Field(None, description="policy version the replica serves now")
    role: Literal["all", "canary", "promoted"] = Field(
        description="canary: loads candidate versions first; promoted: serves the promoted version only; "
        "all: weights.rollout.mode=all (every replica gets every version)"
    )


class WeightsEvent(BaseModel):
    """One step of the canary gate's timeline."""

    ts: float = Field(description="unix seconds")
    version: int = Field(description="the policy version it is about")
    kind: Literal["promoted", "rejected", "candidate", "held_back", "paused", "resumed"]
    reason: str = Field("", description="why (for a rejection: the bounds that failed)")
    measurements: dict[str, float] = Field(
        default_factory=dict, description="what the decision measured (logprob_gap, error_rate, samples, ...)"
    )


class JobWeights(BaseModel):
    """The job's weight plane (``weights.rollout``, docs/weights.md): which version each
    replica serves, and with the canary gate the promoted / candidate versions and decisions."""

    mode: Literal["all", "canary"] = Field(description="weights.rollout.mode")
    promoted: int | None = Field(None, description="the version every non-canary replica is to serve")
    candidate: int | None = Field(None, description="canary mode: the version under test at the canaries")
    paused: str | None = Field(None, description="canary mode: why the rollout is paused after a rejection")
    replicas: dict[str, ReplicaWeights] = Field(default_factory=dict, description="replica -> version and role")
    events: list[WeightsEvent] = Field(
        default_factory=list, description="canary mode: the newest promotions, rejections, ..., oldest first"
    )


class JobProgress(BaseModel):
    """What the job driver last reported (``status.json``); every field may be missing."""

    model_config = ConfigDict(extra="allow")

    step: int | None = Field(None, description="optimizer steps done")
    total_steps: int | None = Field(None, description="trainer.total_steps")
    reward_mean: float | None = Field(None, description="mean training reward of the last step")
    staleness: float | None = Field(None, description="mean policy-version lag of the last batch")
    tokens_per_s: float | None = Field(None, description="generated tokens per second")
    loss: float | None = Field(None, description="total actor loss of the last step")
    kl: float | None = Field(None, description="KL of the last step (actor/kl_loss if used, else actor/ppo_kl)")
    entropy: float | None = Field(None, description="mean token entropy (nats) of the last step")
    grad_norm: float | None = Field(None, description="gradient norm before clipping of the last step")
    val_score: float | None = Field(None, description="mean validation score, when the job validates")
    logprob_diff: float | None = Field(None, description="mean |p_rollout - p_trainer| of the last batch")
    queues: dict[str, int] | None = Field(None, description="stream name -> depth")
    restarts: dict[str, int] | None = Field(None, description="service -> times its supervisor restarted it")
    ledger: dict[str, int] | None = Field(
        None, description="the job's sample ledger: stage (fed, generated, scored, trained, ...) -> samples"
    )
    ledger_stages: dict[str, int] | None = Field(
        None, description="the queue's per-sample ledger: latest stage (queued, generated, scored, trained, ...) "
        "-> samples, over the newest `queues.ledger_max_entries` samples"
    )
    stalled: bool | None = Field(None, description="the job made no progress past services.restart.stall_warn_s")
    weights: JobWeights | None = Field(None, description="the weight plane: per replica its version and role")


class Job(BaseModel):
    """A job as the gateway knows it."""

    id: str = Field(description="job id: `<name>-<8 hex>`")
    name: str = Field(description="the spec's `name`")
    state: JobStateName = Field(description="lifecycle state")
    detail: str = Field(description="human-readable: progress, or why it failed")
    exit_code: int | None = Field(description="the job driver's exit code once it has exited (if known)")
    launcher: str = Field(description="launcher that runs it (`local`, `ray`, `deployment`)")
    overrides: list[str] = Field(description="the overrides it was submitted with")
    created_at: float = Field(description="unix seconds")
    updated_at: float = Field(description="unix seconds")
    progress: JobProgress = Field(description="latest progress")
    spec: str | None = Field(None, description="the resolved spec (YAML); only in `GET /v1/jobs/{id}`")


class JobList(BaseModel):
    jobs: list[Job] = Field(description="newest first")


class MetricPoint(JobProgress):
    ts: float = Field(description="unix seconds when the gateway saw this progress")


class JobMetrics(BaseModel):
    """A job's metric series, for curves (the dashboard polls this)."""

    id: str
    name: str
    state: JobStateName
    progress: JobProgress
    points: list[MetricPoint] = Field(description="oldest first; pass the last `ts` as `since` to get only new ones")


class ErrorBody(BaseModel):
    detail: str | list[Any] = Field(description="what was wrong; for a bad spec every bad field as `path: problem`")


class JobEvent(BaseModel):
    ts: float = Field(description="unix seconds")
    kind: str = Field(
        description="submitted | queued | started | paused | resumed | cancelled | restarted | finished; "
        "with the canary gate also version_promoted | version_rejected | rollout_paused | rollout_resumed"
    )
    detail: str = Field(description="what happened: the restarted service, the final state and why, ...")


class JobEvents(BaseModel):
    """A job's lifecycle, oldest first."""

    id: str
    state: JobStateName
    events: list[JobEvent] = Field(description="oldest first; pass the last `ts` as `since` to get only new ones")


FleetStateName = Literal["starting", "ready", "stopping", "stopped", "failed"]


class FleetSubmit(BaseModel):
    """``POST /v1/fleets`` as JSON. (Send ``application/yaml`` instead to post the fleet's YAML
    file itself, with overrides as repeated ``override`` query parameters.)"""

    model_config = ConfigDict(extra="forbid")

    spec: str | dict[str, Any] = Field(
        description="the fleet spec (name, model, rollout, replicas, max_jobs; docs/fleet.md): YAML text, or the "
        "same structure as a JSON object"
    )
    overrides: list[str] = Field(
        default_factory=list, max_length=256, description="`a.b=c` overrides applied to the spec"
    )


class FleetReplica(BaseModel):
    """One rollout replica of a fleet, as the fleet last reported it."""

    alive: bool = Field(description="its process runs")
    ready: bool = Field(description="it answered ready since its last start")
    restarts: int = Field(description="times the fleet restarted it")
    metrics: str | None = Field(None, description="its /health /ready /metrics URL")
    pid: int | None = Field(None, description="its process id")
    phase: Literal["off", "starting", "serving", "draining"] | None = Field(
        None, description="off (not running: an elastic fleet may start it), starting, serving, draining (leaving "
        "on a scale-down); null from a fleet that reports none"
    )


class FleetScalingBounds(BaseModel):
    min: int
    max: int


class FleetScaling(BaseModel):
    """How many replicas the fleet runs and why (its last reading; docs/fleet.md, "Scaling")."""

    min: int | None = Field(None, description="fewest replicas")
    max: int | None = Field(None, description="most replicas")
    desired: int | None = Field(None, description="replicas starting or serving")
    policy: str | None = Field(None, description="the scaling policy (backlog)")
    signals: dict[str, float] = Field(
        default_factory=dict, description="what it decided on: serving, changing, jobs, backlog, backlog_per_replica, "
        "trainer_wait (0..1), dropped_stale_per_s, tokens_per_s"
    )
    requested: FleetScalingBounds | None = Field(
        None, description="bounds asked for (`PATCH /v1/fleets/{name}`, `meshrl fleet scale`); the fleet takes them "
        "at its next reading (then `min`/`max` show them)"
    )


class FleetScale(BaseModel):
    """``PATCH /v1/fleets/{name}``: a running fleet's replica bounds (a bound left out stays)."""

    model_config = ConfigDict(extra="forbid")

    min_replicas: int | None = Field(None, ge=1, le=1024, description="fewest replicas")
    max_replicas: int | None = Field(None, ge=1, le=1024, description="most replicas (at most the spec's "
                                     "scaling.max_replicas)")
    replicas: int | None = Field(None, ge=1, le=1024, description="exactly this many (min = max); not with the others")


class FleetEvent(BaseModel):
    """One scaling decision of the fleet (a line of its events.jsonl)."""

    model_config = ConfigDict(populate_by_name=True)

    ts: float = Field(description="unix seconds")
    action: str = Field(description="add | remove")
    reason: str = Field(description="backlog_high | backlog_low | idle | below_min | above_max")
    replicas: list[str] = Field(default_factory=list, description="the replicas started or drained")
    from_: int | None = Field(None, alias="from", description="replicas before")
    to: int | None = Field(None, description="replicas after")
    signals: dict[str, float] = Field(default_factory=dict, description="the signals it decided on")


class FleetEvents(BaseModel):
    """A fleet's scaling decisions, oldest first."""

    name: str
    state: str
    events: list[FleetEvent] = Field(description="oldest first; pass the last `ts` as `since` to get only new ones")


class FleetJobReport(BaseModel):
    """One replica's report on one attached job."""

    state: str = Field(description="attached | refused | detached | failed")
    detail: str = Field("", description="why it refused, detached or failed")
    served_version: int | None = Field(None, description="the job's adapter version it serves (reported again as "
                                       "it loads a new one)")
    metrics: str | None = Field(None, description="host:port where it serves the job's /metrics")
    pid: int | None = Field(None, description="the replica's process id")
    time: float | None = Field(None, description="unix seconds of the report")


class Fleet(BaseModel):
    """A fleet of warm rollout replicas run by the gateway (docs/fleet.md)."""

    name: str = Field(description="the fleet's name; jobs attach with services.rollout.fleet: NAME")
    state: FleetStateName = Field(description="lifecycle state")
    detail: str = Field("", description="why it failed (with the end of its log), or what it is doing")
    pid: int | None = Field(None, description="the fleet's process id")
    model: str | None = Field(None, description="the base model every job's adapter sits on")
    max_jobs: int | None = Field(None, description="adapter slots per replica")
    max_lora_rank: int | None = Field(None, description="the largest adapter rank a job may bring")
    replicas: dict[str, FleetReplica] = Field(default_factory=dict, description="replica name -> its state")
    jobs: dict[str, dict[str, FleetJobReport]] = Field(
        default_factory=dict, description="attached job id -> {replica name -> that replica's report on the job}"
    )
    scaling: FleetScaling | None = Field(None, description="bounds, replicas desired, the signals; null from a "
                                         "fleet that reports none")
    metrics: str | None = Field(None, description="host:port of the fleet process's /metrics (while it runs)")
    started_at: float | None = Field(None, description="unix seconds when the gateway started it")
    updated_at: float | None = Field(None, description="unix seconds of the fleet's last state")
    spec: str | None = Field(None, description="the resolved spec (YAML); only in `GET /v1/fleets/{name}`")


class FleetList(BaseModel):
    fleets: list[Fleet] = Field(description="by name")
