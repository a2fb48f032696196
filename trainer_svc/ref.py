"""The frozen reference policy: the starting checkpoint, sharded like the actor, no optimizer
(with LoRA: the actor's model with its adapter disabled).

``compute_ref_log_prob`` returns ``ref_log_prob`` (float32 ``[B, R]``) for the KL loss
(``actor.use_kl_loss``) or the KL-in-reward penalty (``algorithm.use_kl_in_reward``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch

from services.config.trainer import ActorConfig, RefConfig
from services.protocol import DataProto
from trainer_svc.actor import DataParallelPPOActor


class ReferencePolicy:
    """Wraps a frozen (FSDP2-sharded) copy of the initial policy -- or, with ``adapter_off``
    (LoRA), the actor's own model with its adapter switched off for each forward: the base
    weights are frozen, so that *is* the initial policy, with no second model in memory."""

    def __init__(self, module: torch.nn.Module, actor_cfg: ActorConfig, ref_cfg: RefConfig, group=None,
                 adapter_off: Callable[[], AbstractContextManager] | None = None) -> None:
        if adapter_off is None:
            for p in module.parameters():
                p.requires_grad_(False)
        cfg = actor_cfg.model_copy(update={"log_prob_micro_batch_size_per_gpu": ref_cfg.log_prob_micro_batch_size_per_gpu})
        self._scorer = DataParallelPPOActor(cfg, module, None, mini_batch_size=1, group=group)
        self.module = module
        self._adapter_off = adapter_off

    def compute_ref_log_prob(self, data: DataProto) -> torch.Tensor:
        """Log-probs of ``responses`` under the reference weights, ``[B, R]`` float32 (collective)."""
        with self._adapter_off() if self._adapter_off is not None else nullcontext():
            log_probs, _ = self._scorer.compute_log_prob(data, calculate_entropy=False)
        return log_probs
