"""verl's dynamic micro-batching API (``use_dynamic_bsz``) over DataProto.

``prepare_dynamic_batch(data, max_token_len)`` splits a batch into micro-batches of at
most about ``max_token_len`` valid tokens each (token count = ``attention_mask`` row
sum), with the token sums balanced across micro-batches; ``restore_dynamic_batch``
puts per-micro-batch results (log-probs, values, entropies) back in the original row
order. With a data-parallel group, every rank uses the same number of micro-batches (the
maximum over ranks), since FSDP needs every rank to run the same collectives.

The packing itself is :mod:`trainer_svc.seqlen` (first-fit count, then greedy
longest-first balancing); this module only gives it verl's names and signatures:
``get_seqlen_balanced_partitions``, ``rearrange_micro_batches``,
``prepare_dynamic_batch``, ``restore_dynamic_batch``, ``get_reverse_idx``.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Sequence
from itertools import chain
from typing import Optional

import torch
import torch.distributed as dist
from tensordict import TensorDict

from services.protocol import DataProto
from trainer_svc.seqlen import balanced_partitions, num_micro_batches

__all__ = [
    "get_reverse_idx",
    "get_seqlen_balanced_partitions",
    "prepare_dynamic_batch",
    "rearrange_micro_batches",
    "restore_dynamic_batch",
]

#: Deadline of the micro-batch-count agreement across data-parallel ranks.
AGREE_TIMEOUT = datetime.timedelta(seconds=120)


def get_seqlen_balanced_partitions(seqlen_list: Sequence[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Indices ``0..n-1`` in ``k_partitions`` lists with near-equal sums of ``seqlen_list``
    (each list sorted; with ``equal_size`` all lists have ``n / k`` entries)."""
    return balanced_partitions(seqlen_list, k_partitions, equal_size=equal_size)


def _agree(count: int, rows: int, dp_group: Optional[dist.ProcessGroup]) -> tuple[int, int]:
    """(max of ``count``, min of ``rows``) over the ranks of ``dp_group`` (the local values
    without a group). The all-reduce runs asynchronously and is waited on with
    :data:`AGREE_TIMEOUT`, so a dead rank raises instead of hanging."""
    if dp_group is None or not dist.is_initialized() or dist.get_world_size(dp_group) == 1:
        return count, rows
    value = torch.tensor([count, -rows], dtype=torch.int64)
    work = dist.all_reduce(value, op=dist.ReduceOp.MAX, group=dp_group, async_op=True)
    try:
        finished = work.wait(timeout=AGREE_TIMEOUT)
    except RuntimeError as exc:  # gloo reports a missed deadline by raising
        raise TimeoutError(f"micro-batch count agreement failed within {AGREE_TIMEOUT}: {exc}") from exc
    if finished is False:
        raise TimeoutError(f"micro-batch count agreement timed out after {AGREE_TIMEOUT}")
    return int(value[0].item()), -int(value[1].item())


def rearrange_micro_batches(
    batch: TensorDict,
    max_token_len: int,
    dp_group: Optional[dist.ProcessGroup] = None,
    num_batches_divided_by: Optional[int] = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: Optional[int] = None,
) -> tuple[list[TensorDict], list[list[int]]]:
    """Split a TensorDict ``[B, ...]`` into token-budgeted micro-batches.

    Args:
        batch: needs ``attention_mask`` ``[B, L]``; every row must hold at most
            ``max_token_len`` valid tokens.
        max_token_len: token budget of one micro-batch.
        dp_group: data-parallel group; with ``same_micro_num_in_dp`` every rank ends up
            with the same number of micro-batches: the largest count any rank needs, but
            never more than the fewest rows any rank holds (then micro-batches may exceed
            the budget — ranks normally hold equal row counts, see ``ShardPlan``).
        num_batches_divided_by: round the count up to a multiple of this (e.g. pipeline
            stages).
        min_num_micro_batch: lower bound on the count.

    Returns:
        ``(micro_batches, batch_idx_list)``: micro-batch ``i`` holds rows
        ``batch_idx_list[i]`` (ascending) of ``batch``. The count never exceeds ``B``.

    Raises:
        ValueError: a row longer than ``max_token_len``, or no ``attention_mask``.
    """
    if "attention_mask" not in batch.keys():
        raise ValueError("dynamic micro-batching needs an attention_mask column")
    lengths = [int(x) for x in batch["attention_mask"].sum(dim=-1).tolist()]
    if lengths and max(lengths) > max_token_len:
        raise ValueError(
            f"a sequence has {max(lengths)} tokens, more than max_token_len={max_token_len}; "
            "raise max_token_len (ppo_max_token_len_per_gpu) to at least the longest sequence"
        )
    count = num_micro_batches(lengths, max_token_len)
    if min_num_micro_batch is not None:
        count = max(count, int(min_num_micro_batch))
    rows = len(lengths)
    if num_batches_divided_by:
        count = -(-count // num_batches_divided_by) * num_batches_divided_by
    if same_micro_num_in_dp:
        count, rows = _agree(count, rows, dp_group)
    count = min(count, rows)
    if count == 0:
        return [], []
    batch_idx_list = balanced_partitions(lengths, count, equal_size=False)
    micro = [batch[torch.tensor(idx, dtype=torch.long)] for idx in batch_idx_list]
    return micro, batch_idx_list


def prepare_dynamic_batch(
    data: DataProto,
    max_token_len: int,
    dp_group: Optional[dist.ProcessGroup] = None,
    num_batches_divided_by: Optional[int] = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: Optional[int] = None,
) -> tuple[list[DataProto], list[list[int]]]:
    """Split a DataProto into token-budgeted micro-batches (see
    :func:`rearrange_micro_batches`); non-tensor columns follow their rows and each
    micro-batch gets a copy of ``meta_info``.

    Returns:
        ``(micro_batches, batch_idx_list)``.
    """
    tensors, batch_idx_list = rearrange_micro_batches(
        data.batch,
        max_token_len=max_token_len,
        dp_group=dp_group,
        num_batches_divided_by=num_batches_divided_by,
        same_micro_num_in_dp=same_micro_num_in_dp,
        min_num_micro_batch=min_num_micro_batch,
    )
    micro_batches = []
    for part, idx in zip(tensors, batch_idx_list):
        non_tensors = {key: value[idx] for key, value in data.non_tensor_batch.items()}
        micro_batches.append(
            DataProto.from_dict(
                tensors=dict(part.items()), non_tensors=non_tensors, meta_info=copy.deepcopy(data.meta_info)
            )
        )
    return micro_batches, batch_idx_list


def get_reverse_idx(idx_map: Sequence[int]) -> list[int]:
    """The inverse permutation: ``out[idx_map[i]] = i``.

    Raises:
        ValueError: ``idx_map`` is not a permutation of ``0..n-1``.
    """
    n = len(idx_map)
    if sorted(idx_map) != list(range(n)):
        raise ValueError("batch_idx_list must cover every row exactly once")
    reverse = [0] * n
    for position, original in enumerate(idx_map):
        reverse[original] = position
    return reverse


def restore_dynamic_batch(data: torch.Tensor, batch_idx_list: list[list[int]]) -> torch.Tensor:
    """Undo :func:`prepare_dynamic_batch`'s reordering.

    Args:
        data: ``[B, ...]`` the micro-batch results concatenated in micro-batch order.
        batch_idx_list: the list returned by :func:`prepare_dynamic_batch`.

    Returns:
        ``[B, ...]`` with row ``i`` the result for original row ``i``.
    """
    indices = list(chain.from_iterable(batch_idx_list))
    if data.shape[0] != len(indices):
        raise ValueError(f"data has {data.shape[0]} rows but batch_idx_list covers {len(indices)}")
    return data[torch.tensor(get_reverse_idx(indices), dtype=torch.long)]
