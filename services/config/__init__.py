"""The job spec and the services' views of it: typed, bounded, documented; no torch/vLLM imports.

    base.py      StrictModel (extra="forbid")
    loader.py    the one loader: YAML, `a.b=c` overrides, path resolution, error messages
    job.py       JobSpec: every setting once (resources under `services:`), load_job/parse_job/dump_job
    views.py     TrainerView, RolloutView, RewardView, FeederView: each service's whole config,
                 cut out of the job once (the TAKES table); meshrl views / meshrl run write them
    queues.py    QueueConfig (redis / embedded)
    weights.py   WeightChannelConfig
    rollout.py   RolloutConfig (verl's `rollout.*` keys)
    reward.py    RewardConfig (verl's `reward_model.*` / custom_reward_function keys)
    trainer.py   ActorConfig, CriticConfig, RefConfig, AlgorithmConfig, TrainerConfig (verl's keys)
"""

from services.config.base import StrictModel

__all__ = ["StrictModel"]
