"""The frozen reference policy: the starting checkpoint, sharded like the actor, no optimizer.

``compute_ref_log_prob`` returns ``ref_log_prob`` (float32 ``[B, R]``) for the KL loss
(``actor.use_kl_loss``) or the KL-in-reward penalty (``algorithm.use_kl_in_reward``).
"""

from __future__ import annotations

import torch

from services.config.trainer import ActorConfig, RefConfig
from services.protocol import DataProto
from trainer_svc.actor import DataParallelPPOActor


class ReferencePolicy:
    """Wraps a frozen (FSDP2-sharded) copy of the initial policy."""

    def __init__(self, module: torch.nn.Module, actor_cfg: ActorConfig, ref_cfg: RefConfig, group=None) -> None:
        for p in module.parameters():
            p.requires_grad_(False)
        cfg = actor_cfg.model_copy(update={"log_prob_micro_batch_size_per_gpu": ref_cfg.log_prob_micro_batch_size_per_gpu})
        self._scorer = DataParallelPPOActor(cfg, module, None, mini_batch_size=1, group=group)
        self.module = module

    def compute_ref_log_prob(self, data: DataProto) -> torch.Tensor:
        """Log-probs of ``responses`` under the reference weights, ``[B, R]`` float32 (collective)."""
        log_probs, _ = self._scorer.compute_log_prob(data, calculate_entropy=False)
        return log_probs
