"""The trainer loop's Prometheus metrics (rank 0's registry)."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_GAUGES = {
    "actor/loss": ("meshrl_trainer_loss", "total actor loss of the last step"),
    "actor/pg_loss": ("meshrl_trainer_pg_loss", "policy-gradient loss of the last step"),
    "actor/pg_clipfrac": ("meshrl_trainer_pg_clipfrac_ratio", "fraction of tokens whose ratio was clipped"),
    "actor/ppo_kl": ("meshrl_trainer_ppo_kl", "approx KL(old || new) over the last step"),
    "actor/entropy": ("meshrl_trainer_entropy_nats", "mean token entropy of the policy"),
    "actor/kl_loss": ("meshrl_trainer_kl_loss", "KL(actor || ref) loss term"),
    "actor/grad_norm": ("meshrl_trainer_grad_norm", "global gradient L2 norm before clipping"),
    "actor/lr": ("meshrl_trainer_learning_rate", "current actor learning rate"),
    "critic/score/mean": ("meshrl_trainer_reward_mean", "mean sequence score of the last batch"),
    "training/rollout_probs_diff_mean": (
        "meshrl_trainer_rollout_probs_diff_mean", "mean |p_rollout - p_trainer| of the sampled tokens, last batch"
    ),
    "training/rollout_probs_diff_max": (
        "meshrl_trainer_rollout_probs_diff_max", "max |p_rollout - p_trainer| of the sampled tokens, last batch"
    ),
    "training/rollout_logprob_gap_mean": (
        "meshrl_trainer_rollout_logprob_gap_mean",
        "mean |log p_trainer - log p_rollout| of the sampled tokens, last batch (what the canary gate compares)",
    ),
}


class TrainerMetrics:
    """Prometheus metrics of the trainer (rank 0's registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = self.registry = registry
        self.phase = Counter("meshrl_trainer_phase_seconds_total", "seconds spent per phase", ["phase"], registry=r)
        self.last = Gauge("meshrl_trainer_step_seconds", "duration of the last step per phase", ["phase"], registry=r)
        self.steps = Counter("meshrl_trainer_steps_total", "committed training steps", registry=r)
        self.skipped = Counter(
            "meshrl_trainer_nonfinite_steps_total", "optimizer steps skipped for a NaN/inf loss", registry=r
        )
        self.version = Gauge("meshrl_trainer_policy_version", "current policy version", registry=r)
        self.samples = Counter("meshrl_trainer_samples_total",
                               "samples consumed by committed steps (trained, or skipped as non-finite)", registry=r)
        self.tokens = Counter("meshrl_trainer_tokens_total", "tokens (prompt+response) trained on", registry=r)
        self.stale = Counter("meshrl_trainer_dropped_stale_samples_total",
                             "samples dropped for their policy version (too stale, or rejected at the canary)",
                             registry=r)
        self.rejected = Counter("meshrl_trainer_dropped_rejected_samples_total",
                                "of the dropped_stale samples: those of a version rejected at the canary", registry=r)
        self.held = Gauge("meshrl_trainer_canary_held_samples",
                          "samples of the candidate version held until it is judged", registry=r)
        self.errors = Counter("meshrl_trainer_dropped_error_samples_total",
                              "samples dropped for a rollout error (no usable response)", registry=r)
        self.failed = Counter("meshrl_trainer_failed_score_samples_total",
                              "samples trained with score 0 because the reward function failed", registry=r)
        self.staleness = Histogram(
            "meshrl_trainer_staleness_versions", "policy-version lag of trained samples",
            buckets=(0, 1, 2, 3, 4, 6, 8, 16, 32, math.inf), registry=r,
        )
        self.weight_bytes = Counter("meshrl_trainer_weight_bytes_total", "parameter bytes published", registry=r)
        self.weight_seconds = Gauge("meshrl_trainer_weight_publish_seconds", "duration of the last publish", registry=r)
        self.idle = Gauge("meshrl_trainer_idle_ratio", "fraction of wall time spent waiting for data", registry=r)
        self.gauges = {k: Gauge(name, doc, registry=r) for k, (name, doc) in _GAUGES.items()}
