"""``JobSpec``: the whole job, composed from each block's own model.

Lives apart from :mod:`services.config.job` (loading, overrides, errors) so the blocks'
owners can evolve their models independently; this file only wires them together and
checks what spans blocks. Imports only pydantic and the block modules.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from services.config.job import JobSpecBase
from services.config.queues import EmbeddedQueueConfig, QueueConfig
from services.config.reward import RewardConfig
from services.config.rollout import RolloutConfig
from services.config.trainer import ActorConfig, AlgorithmConfig, CriticConfig, RefConfig, TrainerConfig
from services.config.weights import WeightChannelConfig


class JobSpec(JobSpecBase):
    """A whole meshrl job (see docs/ and examples/quickstart.yaml)."""

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
        if self.algorithm.adv_estimator in ("grpo", "rloo", "grpo_passk") and self.rollout.n < 2:
            problems.append(f"algorithm.adv_estimator={self.algorithm.adv_estimator} needs rollout.n >= 2 (a group)")
        if problems:
            raise ValueError("; ".join(problems))
        return self
