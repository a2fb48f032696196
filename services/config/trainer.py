"""Trainer configuration blocks, with verl's key names.

``ActorConfig`` (verl ``actor_rollout_ref.actor``), ``CriticConfig`` (``critic``),
``RefConfig`` (``actor_rollout_ref.ref``), ``AlgorithmConfig`` (``algorithm``) and
``TrainerConfig`` (``trainer``). The trainer service runs from its view of the job
(``services.config.views.TrainerView``), which carries these blocks unchanged.

Batch sizes follow verl: ``ppo_mini_batch_size`` counts *prompts* (it is multiplied by
``rollout_n`` and divided by the data-parallel world size on each rank);
``ppo_micro_batch_size_per_gpu`` counts *samples* per forward/backward on one rank.
Imports only pydantic.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from services.config.base import StrictModel

LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KLType = Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full", "k1+", "k2+", "k3+", "low_var_kl+"]


class OptimConfig(StrictModel):
    """AdamW with linear warmup then a constant (or cosine) learning rate (verl ``actor.optim``)."""

    lr: float = Field(1e-6, gt=0, le=1.0, description="peak learning rate")
    lr_warmup_steps: int = Field(
        -1, ge=-1, le=10_000_000, description="optimizer steps of linear warmup; -1 uses lr_warmup_steps_ratio"
    )
    lr_warmup_steps_ratio: float = Field(
        0.0, ge=0.0, le=1.0, description="warmup as a fraction of total optimizer steps (when lr_warmup_steps=-1)"
    )
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="cosine schedule floor as a fraction of lr")
    warmup_style: Literal["constant", "cosine"] = Field(
        "constant", description="schedule after warmup: constant lr, or cosine decay to min_lr_ratio*lr"
    )
    weight_decay: float = Field(0.01, ge=0.0, le=10.0, description="AdamW decoupled weight decay")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW (beta1, beta2), each in [0, 1)")
    eps: float = Field(1e-8, gt=0, le=1.0, description="AdamW epsilon")

    @model_validator(mode="after")
    def _betas_ok(self) -> "OptimConfig":
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must each be in [0, 1), got {self.betas}")
        return self


FloatDtype = Literal["float32", "bfloat16", "float16"]


class MixedPrecisionConfig(StrictModel):
    """FSDP2 mixed precision (verl ``fsdp_config.mixed_precision``): the parameters, their
    gradients and the optimizer state stay in ``model.dtype`` (the master copy); each layer
    computes in ``param_dtype`` and gradients are reduced across ranks in ``reduce_dtype``."""

    param_dtype: FloatDtype = Field("bfloat16", description="dtype of the gathered parameters each layer computes in")
    reduce_dtype: FloatDtype = Field("float32", description="dtype gradients are reduce-scattered in")


class FSDPConfig(StrictModel):
    """FSDP2 wrapping options (verl ``actor.fsdp_config``)."""

    reshard_after_forward: bool = Field(
        True, description="free gathered parameters after each layer's forward (less memory, one more all-gather)"
    )
    mixed_precision: MixedPrecisionConfig | None = Field(
        None,
        description="compute in param_dtype over a model.dtype master copy (null: compute in model.dtype); "
        "set, the model is wrapped in FSDP2 even on one rank, since FSDP2 does the casts",
    )


class PolicyLossConfig(StrictModel):
    """Which registered policy loss to use (verl ``actor.policy_loss``)."""

    loss_mode: str = Field("vanilla", min_length=1, description="name in core_algos' policy-loss registry")


class ActorCheckpointConfig(StrictModel):
    """What each checkpoint holds (verl ``actor.checkpoint``)."""

    save_contents: list[Literal["model", "optimizer", "extra", "hf_model"]] = Field(
        default_factory=lambda: ["model", "optimizer", "extra"],
        description="model, optimizer and extra (lr schedule, RNG, data position) are always saved: a checkpoint "
        "resumes exactly; add hf_model to also write global_step_N/huggingface (config, tokenizer, safetensors, as "
        "`meshrl export` does)",
    )

    @model_validator(mode="after")
    def _complete(self) -> "ActorCheckpointConfig":
        missing = [c for c in ("model", "optimizer", "extra") if c not in self.save_contents]
        if missing:
            raise ValueError(f"save_contents lacks {missing}: meshrl checkpoints always hold model, optimizer and "
                             "extra (exact resume); list them, plus hf_model for a Hugging Face copy")
        return self


class ActorConfig(StrictModel):
    """The policy being trained (verl ``actor_rollout_ref.actor``)."""

    strategy: Literal["fsdp2"] = Field("fsdp2", description="parallelism: FSDP2 fully_shard per decoder layer")
    ppo_mini_batch_size: int = Field(
        256, ge=1, description="prompts per optimizer step (x rollout_n samples, split across DP ranks)"
    )
    ppo_micro_batch_size_per_gpu: int = Field(
        1, ge=1, description="samples per forward/backward on one rank (gradient accumulation below a mini-batch)"
    )
    use_dynamic_bsz: bool = Field(
        False, description="pack micro-batches by token budget (ppo_max_token_len_per_gpu) instead of a fixed count"
    )
    ppo_max_token_len_per_gpu: int = Field(
        16384, ge=1, description="token budget of one micro-batch on one rank when use_dynamic_bsz"
    )
    log_prob_micro_batch_size_per_gpu: int = Field(
        8, ge=1, description="samples per no-grad forward when recomputing log-probs"
    )
    log_prob_max_token_len_per_gpu: int = Field(
        16384, ge=1, description="token budget per no-grad forward when use_dynamic_bsz"
    )
    recompute_old_log_prob: Literal["always", "stale"] = Field(
        "always",
        description="'always' (verl): the trainer recomputes the old log-probs of every row before the update; "
        "'stale': rows its current weights generated take the replica's log-probs (rollout.calculate_log_probs, "
        "processed at the sampling temperature) and only rows of older versions are recomputed -- one no-grad "
        "forward pass less on on-policy rows, at the cost of the replica-vs-trainer difference in those rows "
        "(training/rollout_probs_diff_*, ~1e-6 in fp32). A batch that judges a canary candidate is always recomputed",
    )
    ppo_epochs: int = Field(1, ge=1, le=100, description="passes over each training batch")
    shuffle: bool = Field(False, description="shuffle samples before splitting into mini-batches")
    clip_ratio: float = Field(0.2, gt=0, le=10.0, description="PPO clip epsilon (both sides unless overridden)")
    clip_ratio_low: float | None = Field(None, gt=0, le=10.0, description="lower clip epsilon; None = clip_ratio")
    clip_ratio_high: float | None = Field(None, gt=0, le=10.0, description="upper clip epsilon; None = clip_ratio")
    clip_ratio_c: float = Field(3.0, gt=1.0, le=1000.0, description="dual-clip constant c (> 1) for negative advantages")
    loss_agg_mode: LossAggMode = Field("token-mean", description="how token losses are reduced to one number")
    policy_loss: PolicyLossConfig = Field(default_factory=PolicyLossConfig, description="policy loss choice")
    use_kl_loss: bool = Field(False, description="add a KL(actor || ref) term to the loss (GRPO style)")
    kl_loss_coef: float = Field(0.001, ge=0.0, le=100.0, description="weight of the KL loss term")
    kl_loss_type: KLType = Field("low_var_kl", description="KL estimator of the KL loss")
    entropy_coeff: float = Field(0.0, ge=-10.0, le=10.0, description="weight of the entropy bonus (subtracted)")
    grad_clip: float = Field(1.0, gt=0, le=1e6, description="max global gradient L2 norm")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="optimizer and lr schedule")
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward to save memory")
    fsdp_config: FSDPConfig = Field(default_factory=FSDPConfig, description="FSDP2 wrapping options")
    checkpoint: ActorCheckpointConfig = Field(
        default_factory=ActorCheckpointConfig, description="what each checkpoint holds (hf_model: a Hugging Face copy)"
    )

    @property
    def clip_low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def clip_high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high


class CriticConfig(StrictModel):
    """The value model, used when ``algorithm.adv_estimator`` is ``gae`` (verl ``critic``)."""

    enable: bool | None = Field(None, description="None = on exactly when adv_estimator needs values (gae)")
    model_path: str | None = Field(None, description="value model checkpoint; None = the policy's")
    ppo_mini_batch_size: int = Field(256, ge=1, description="prompts per critic optimizer step")
    ppo_micro_batch_size_per_gpu: int = Field(1, ge=1, description="samples per forward/backward on one rank")
    use_dynamic_bsz: bool = Field(False, description="pack micro-batches by token budget")
    ppo_max_token_len_per_gpu: int = Field(32768, ge=1, description="token budget per micro-batch")
    forward_micro_batch_size_per_gpu: int = Field(8, ge=1, description="samples per no-grad value forward")
    ppo_epochs: int = Field(1, ge=1, le=100, description="passes over each batch")
    cliprange_value: float = Field(0.5, gt=0, le=1000.0, description="value clipping range")
    loss_agg_mode: LossAggMode = Field("token-mean", description="how token value losses are reduced")
    grad_clip: float = Field(1.0, gt=0, le=1e6, description="max global gradient L2 norm")
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-5), description="critic optimizer")


class RefConfig(StrictModel):
    """The frozen reference policy (verl ``actor_rollout_ref.ref``)."""

    log_prob_micro_batch_size_per_gpu: int = Field(8, ge=1, description="samples per ref forward")


class KLCtrlConfig(StrictModel):
    """KL-in-reward coefficient controller (verl ``algorithm.kl_ctrl``)."""

    type: Literal["fixed", "adaptive"] = Field("fixed", description="fixed coefficient or adaptive (Ziegler et al.)")
    kl_coef: float = Field(0.001, ge=0.0, le=100.0, description="(initial) KL coefficient")
    horizon: int = Field(10000, ge=1, description="adaptive controller horizon")
    target_kl: float = Field(0.1, gt=0, le=100.0, description="adaptive controller target KL")


class OffPolicyConfig(StrictModel):
    """Correction for samples generated by an older policy, using ``rollout_log_probs``.

    ``none``: plain PPO against recomputed old log-probs. ``tis``: multiply the token loss by
    the truncated importance weight ``min(exp(old - rollout), cap)``. ``decoupled``: decoupled
    PPO -- the recomputed ``old_log_probs`` are the proximal policy, and the behaviour
    importance weight ``min(exp(old - rollout), cap)`` scales the clipped objective.
    """

    mode: Literal["none", "tis", "decoupled"] = Field("none", description="off-policy correction")
    cap: float = Field(2.0, gt=0, le=1e4, description="upper bound of the importance weight")


class AlgorithmConfig(StrictModel):
    """Advantage estimation and KL-in-reward (verl ``algorithm``)."""

    adv_estimator: str = Field("grpo", min_length=1, description="name in core_algos' advantage registry")
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="discount factor (gae, reinforce++)")
    lam: float = Field(1.0, ge=0.0, le=1.0, description="GAE lambda")
    norm_adv_by_std_in_grpo: bool = Field(True, description="divide GRPO advantages by the group std (false = Dr.GRPO)")
    use_kl_in_reward: bool = Field(False, description="subtract a KL penalty from token rewards")
    kl_penalty: KLType = Field("kl", description="KL estimator of the in-reward penalty")
    kl_ctrl: KLCtrlConfig = Field(default_factory=KLCtrlConfig, description="in-reward KL coefficient controller")
    off_policy: OffPolicyConfig = Field(default_factory=OffPolicyConfig, description="off-policy correction")


class TrainerConfig(StrictModel):
    """The training loop (verl ``trainer``) and meshrl's service settings."""

    total_steps: int = Field(1, ge=1, le=100_000_000, description="optimizer-step rounds (policy versions) to run")
    save_freq: int = Field(
        -1, ge=-1, le=100_000_000,
        description="checkpoint every N steps; -1 = only on SIGTERM/end. Exact resume after a trainer crash "
        "needs N > 0 (acks then follow checkpoints; docs/supervision.md)",
    )
    default_local_dir: str = Field("checkpoints", min_length=1, description="checkpoint directory")
    resume: Literal["auto", "disable"] = Field("auto", description="auto: continue from the latest checkpoint if any")
    max_ckpt_to_keep: int = Field(2, ge=1, le=1000, description="older checkpoints are deleted")
    seed: int = Field(1, ge=0, description="seed of model init noise, shuffles and dropout")
    logger: list[str] = Field(
        default_factory=lambda: ["console"],
        description="where step and validation metrics go: console, jsonl (run_dir/metrics.jsonl), tensorboard, "
        "wandb (offline unless WANDB_MODE says otherwise), mlflow (local store run_dir/mlruns unless "
        "MLFLOW_TRACKING_URI); the extra backends need `pip install meshrl[loggers]`",
    )
    project_name: str = Field("meshrl", min_length=1, max_length=128, description="wandb project / MLflow experiment")
    experiment_name: str | None = Field(None, max_length=128, description="run name in the loggers; None = the job name")
    test_freq: int = Field(
        -1, ge=-1, le=100_000_000,
        description="validate every N steps (and after the last) on data.val_files with rollout.val_kwargs; -1 = never",
    )
    val_before_train: bool = Field(True, description="validate the starting policy before the first step (needs val_files)")
    collective_timeout_s: float = Field(300.0, gt=0, le=86_400, description="deadline of every collective")
    batch_wait_timeout_s: float = Field(
        3600.0, gt=0, le=1e7, description="how long intake waits for a full batch before reporting a timeout"
    )
    metrics_file: str | None = Field(
        None, description="append one JSON line per committed step (step, version, applied, metrics) to this file"
    )
    stop_on_nonfinite: int = Field(
        10, ge=1, le=1_000_000, description="abort after this many consecutive steps skipped for a NaN/inf loss"
    )
