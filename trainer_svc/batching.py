"""Turning experience groups into one training batch, and dealing it to DP ranks.

``collate_groups`` re-pads groups produced at different lengths to one shape (prompts
left-padded, responses right-padded) and concatenates them. ``ShardPlan`` pads the batch
to a multiple of the world size, balances valid tokens across ranks (every rank gets the
same number of rows), and maps per-rank results back to the original row order.
Padding rows get an all-zero ``response_mask`` so they contribute no loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from services.protocol import DataProto
from trainer_svc.seqlen import balanced_partitions

#: Columns shaped ``[B, prompt_len + response_len]`` (prompt part left-padded).
SEQ_KEYS = ("input_ids", "attention_mask", "position_ids")
#: Columns shaped ``[B, prompt_len]``.
PROMPT_KEYS = ("prompts",)


def _pad_group(d: DataProto, p_len: int, r_len: int, pad_id: int) -> DataProto:
    batch = d.batch
    r0 = batch["responses"].shape[1]
    p0 = batch["input_ids"].shape[1] - r0
    if p0 == p_len and r0 == r_len:
        return d
    lp, rp = p_len - p0, r_len - r0
    tensors: dict[str, torch.Tensor] = {}
    for key in batch.keys():
        t = batch[key]
        if key in SEQ_KEYS:
            prompt, resp = t[:, :p0], t[:, p0:]
            if key == "input_ids":
                fill = pad_id
                left = torch.full((t.shape[0], lp), fill, dtype=t.dtype)
                right = torch.full((t.shape[0], rp), fill, dtype=t.dtype)
            elif key == "attention_mask":
                left = torch.zeros((t.shape[0], lp), dtype=t.dtype)
                right = torch.zeros((t.shape[0], rp), dtype=t.dtype)
            else:  # position_ids: zeros on the left, continuing counts on the right
                left = torch.zeros((t.shape[0], lp), dtype=t.dtype)
                last = t[:, -1:] if t.shape[1] else torch.zeros((t.shape[0], 1), dtype=t.dtype)
                right = last + torch.arange(1, rp + 1, dtype=t.dtype).unsqueeze(0)
            tensors[key] = torch.cat([left, prompt, resp, right], dim=1)
        elif key in PROMPT_KEYS:
            tensors[key] = torch.cat([torch.full((t.shape[0], lp), pad_id, dtype=t.dtype), t], dim=1)
        elif t.dim() >= 2 and t.shape[1] == r0:
            pad = torch.zeros((t.shape[0], rp, *t.shape[2:]), dtype=t.dtype)
            if key == "responses":
                pad.fill_(pad_id)
            tensors[key] = torch.cat([t, pad], dim=1)
        else:
            tensors[key] = t
    return DataProto.from_dict(tensors=tensors, non_tensors=dict(d.non_tensor_batch), meta_info=dict(d.meta_info))


def collate_groups(groups: Sequence[DataProto], pad_id: int = 0) -> DataProto:
    """Concatenate experience groups, re-padding them to the longest prompt and response.

    Every group needs ``input_ids``/``attention_mask``/``position_ids`` ``[n, P+R]`` and
    ``responses`` ``[n, R]``; other ``[n, R, ...]`` columns are right-padded with zeros.
    ``meta_info`` of the result is that of the first group.
    """
    if not groups:
        raise ValueError("collate_groups needs at least one group")
    for g in groups:
        missing = [k for k in (*SEQ_KEYS, "responses") if k not in g.batch.keys()]
        if missing:
            raise ValueError(f"experience group lacks {missing}")
    r_len = max(g.batch["responses"].shape[1] for g in groups)
    p_len = max(g.batch["input_ids"].shape[1] - g.batch["responses"].shape[1] for g in groups)
    padded = [_pad_group(g, p_len, r_len, pad_id) for g in groups]
    meta = dict(padded[0].meta_info)
    stripped = [DataProto(batch=g.batch, non_tensor_batch=g.non_tensor_batch, meta_info={}) for g in padded]
    out = DataProto.concat(stripped)
    out.meta_info = meta
    return out


@dataclass
class ShardPlan:
    """How a batch of ``n`` real rows is laid out over ``world`` ranks.

    ``order[j]`` is the (padded) row index placed at position ``j``; rank ``r`` owns
    positions ``r*per_rank .. (r+1)*per_rank``. Rows ``>= n`` are padding.
    """

    n: int
    world: int
    order: list[int]

    @property
    def per_rank(self) -> int:
        return len(self.order) // self.world

    @classmethod
    def build(cls, data: DataProto, world: int, balance: bool = True) -> "ShardPlan":
        n = len(data)
        total = -(-n // world) * world
        lengths = data.batch["attention_mask"].sum(-1).tolist()
        lengths += [lengths[i % n] for i in range(total - n)]
        if balance and world > 1:
            parts = balanced_partitions(lengths, world, equal_size=True)
            order = [i for p in parts for i in p]
        else:
            order = list(range(total))
        return cls(n=n, world=world, order=order)

    def local(self, data: DataProto, rank: int) -> DataProto:
        """This rank's rows (padding rows are copies with ``response_mask`` zeroed)."""
        idx = self.order[rank * self.per_rank : (rank + 1) * self.per_rank]
        real = [i % self.n for i in idx]
        out = data.select_idxs(torch.tensor(real, dtype=torch.long))
        is_pad = torch.tensor([i >= self.n for i in idx])
        if bool(is_pad.any()) and "response_mask" in out.batch.keys():
            mask = out.batch["response_mask"].clone()
            mask[is_pad] = 0
            out.batch["response_mask"] = mask
        return out

    def gather(self, local: torch.Tensor, group) -> torch.Tensor:
        """All-gather each rank's ``[per_rank, ...]`` result; return ``[n, ...]`` in original order."""
        import torch.distributed as dist

        if self.world > 1:
            parts = [torch.empty_like(local) for _ in range(self.world)]
            dist.all_gather(parts, local.contiguous(), group=group)
            full = torch.cat(parts, dim=0)
        else:
            full = local
        out = torch.empty((len(self.order), *full.shape[1:]), dtype=full.dtype)
        out[torch.tensor(self.order, dtype=torch.long)] = full
        return out[: self.n]
