"""The job spec: typed, bounded, documented; no torch/vLLM imports (see STYLE.md #2).

One module per block, each owned by the code that consumes it:
    base.py      StrictModel (extra="forbid")
    queues.py    QueueConfig (redis / embedded)
    weights.py   WeightChannelConfig
    rollout.py   RolloutConfig (verl's `rollout.*` keys)
    reward.py    RewardConfig (verl's `reward_model.*` / custom_reward_function keys)
    trainer.py   ActorConfig, AlgorithmConfig, TrainerConfig (verl's keys)
    job.py       JobSpec: composes the blocks, `a.b=c` overrides, load/validate
"""

from services.config.base import StrictModel

__all__ = ["StrictModel"]
