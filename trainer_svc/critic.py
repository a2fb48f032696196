"""The value model on FSDP2: ``compute_values`` and ``update_critic`` (verl's dp_critic).

The critic is a HuggingFace token-classification model with one output; the value of
response token ``t`` is read at the position that predicts it (``[:, -R-1:-1]``), as verl
does. Values are float32 ``[B, R]``, zero outside ``response_mask``. The loss is verl's
clipped value loss, normalised over the whole mini-batch across ranks (like the actor).
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from services.config.trainer import CriticConfig
from services.protocol import DataProto
from trainer_svc import core_algos
from trainer_svc.actor import DataParallelUpdater, all_reduce, micro_batch_indices
from trainer_svc.fsdp import clip_grad_norm

logger = logging.getLogger(__name__)


def forward_values(module: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Values ``[B, R]`` (float32) of the response positions."""
    r = batch["responses"].shape[1]
    out = module(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    )
    return out.logits[:, -r - 1 : -1, 0].float()


class DataParallelPPOCritic(DataParallelUpdater):
    """The critic of one data-parallel rank.

    ``mini_batch_size`` is in samples per rank (like the actor's). The lr schedule is stepped
    by the caller once per training step (verl).
    """

    def __init__(
        self,
        config: CriticConfig,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        mini_batch_size: int,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__(config, module, optimizer, mini_batch_size, group)

    def _batch(self, data: DataProto, idx: list[int], keys) -> dict[str, torch.Tensor]:
        index = torch.tensor(idx, dtype=torch.long)
        dev = next(iter(self.module.parameters())).device
        return {k: data.batch[k][index].to(dev) for k in keys}

    @torch.no_grad()
    def compute_values(self, data: DataProto) -> torch.Tensor:
        """Values ``[B, R]`` float32 under the current critic, masked by ``response_mask`` (collective)."""
        c = self.config
        self.module.eval()
        parts = micro_batch_indices(
            data, self.group, c.forward_micro_batch_size_per_gpu, c.use_dynamic_bsz, c.ppo_max_token_len_per_gpu
        )
        n, r = len(data), data.batch["responses"].shape[1]
        values = torch.zeros(n, r, dtype=torch.float32)
        keys = ("input_ids", "attention_mask", "position_ids", "responses")
        for idx in parts:
            values[idx] = forward_values(self.module, self._batch(data, idx, keys)).cpu()
        if "response_mask" in data.batch.keys():
            values = values * data.batch["response_mask"].to(values.dtype)
        return values

    def update_critic(self, data: DataProto) -> dict[str, float]:
        """Clipped value-loss updates over mini-batches / micro-batches / ``ppo_epochs``.

        Needs ``values`` (at rollout time) and ``returns``. A non-finite loss or gradient
        norm skips that optimizer step (counted in ``critic/skipped_steps``).
        """
        c = self.config
        keys = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask", "values", "returns")
        self.module.train()
        sums = {"critic/vf_loss": 0.0, "critic/vf_clipfrac": 0.0, "critic/grad_norm": 0.0}
        steps = skipped = 0
        for _ in range(c.ppo_epochs):
            for mini in data.split(self.mini_batch_size):
                mask_all = mini.batch["response_mask"]
                counts = torch.tensor([mask_all.sum().item(), (mask_all.sum(-1) > 0).sum().item()], dtype=torch.float64)
                all_reduce(counts, self.group)
                ginfo = {"dp_size": self.world_size, "batch_num_tokens": float(counts[0]), "global_batch_size": float(counts[1])}
                parts = micro_batch_indices(
                    mini, self.group, c.ppo_micro_batch_size_per_gpu, c.use_dynamic_bsz, c.ppo_max_token_len_per_gpu
                )
                self.optimizer.zero_grad(set_to_none=True)
                loss_sum, clip_sum, finite = 0.0, 0.0, True
                for idx in parts:
                    mb = self._batch(mini, idx, keys)
                    vpreds = forward_values(self.module, mb)
                    vf_loss, vf_clipfrac = core_algos.compute_value_loss(
                        vpreds=vpreds, returns=mb["returns"], values=mb["values"], response_mask=mb["response_mask"],
                        cliprange_value=c.cliprange_value, loss_agg_mode=c.loss_agg_mode, **ginfo,
                    )
                    finite = finite and bool(torch.isfinite(vf_loss.detach()))
                    vf_loss.backward()
                    loss_sum += float(vf_loss.detach())
                    clip_sum += float(vf_clipfrac) / len(parts)
                grad_norm = clip_grad_norm(self.module, c.grad_clip)
                flag = torch.tensor([0.0 if finite else 1.0])
                all_reduce(flag, self.group)
                if flag.item() > 0 or not torch.isfinite(grad_norm):
                    logger.error("critic: non-finite loss/grad norm; skipping this optimizer step")
                    self.optimizer.zero_grad(set_to_none=True)
                    skipped += 1
                else:
                    self.optimizer.step()
                    steps += 1
                vec = torch.tensor([loss_sum, clip_sum], dtype=torch.float64)
                all_reduce(vec, self.group)
                vec /= self.world_size
                sums["critic/vf_loss"] += float(vec[0])
                sums["critic/vf_clipfrac"] += float(vec[1])
                sums["critic/grad_norm"] += float(grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        total = max(1, steps + skipped)
        out = {k: v / total for k, v in sums.items()}
        out["critic/skipped_steps"] = float(skipped)
        out["critic/optimizer_steps"] = float(steps)
        return out
