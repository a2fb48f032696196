"""Sequence-length balancing: split samples into groups of similar total token counts.

Used twice: to deal a training batch to data-parallel ranks so every rank gets about the
same number of valid tokens (and exactly the same number of rows), and to pack
micro-batches under a token budget (``use_dynamic_bsz``). Pure functions over lists of
ints; no torch.distributed here.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def balanced_partitions(lengths: Sequence[int], k: int, *, equal_size: bool) -> list[list[int]]:
    """Partition indices ``0..len(lengths)-1`` into ``k`` lists with near-equal length sums.

    Greedy longest-first: each index (longest first) goes to the partition with the
    smallest sum so far. With ``equal_size`` every partition gets exactly
    ``len(lengths) // k`` indices (``len(lengths)`` must divide by ``k``). Each partition
    is returned sorted, so the original order is kept inside it. Deterministic: ties break
    on the lower index.
    """
    n = len(lengths)
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    if equal_size and n % k:
        raise ValueError(f"{n} items cannot be split into {k} equal partitions")
    if n < k:
        raise ValueError(f"cannot make {k} non-empty partitions of {n} items")
    cap = n // k if equal_size else n
    order = sorted(range(n), key=lambda i: (-int(lengths[i]), i))
    # Heap key (sum, count, partition): an empty partition always sorts first, so none stays empty.
    heap = [(0, 0, p) for p in range(k)]
    parts: list[list[int]] = [[] for _ in range(k)]
    for i in order:
        total, count, p = heapq.heappop(heap)
        parts[p].append(i)
        if count + 1 < cap:
            heapq.heappush(heap, (total + int(lengths[i]), count + 1, p))
    for part in parts:
        part.sort()
    return parts


def num_micro_batches(lengths: Sequence[int], max_token_len: int) -> int:
    """How many micro-batches of at most ``max_token_len`` tokens the greedy packer needs
    (at least 1; a single sample over the budget gets a micro-batch of its own)."""
    if not lengths:
        return 0
    bins: list[int] = []
    for length in sorted((int(x) for x in lengths), reverse=True):
        for j, used in enumerate(bins):
            if used + length <= max_token_len:
                bins[j] += length
                break
        else:
            bins.append(length)
    return len(bins)


def pack_micro_batches(lengths: Sequence[int], max_token_len: int, min_count: int = 1) -> list[list[int]]:
    """Indices grouped into micro-batches of about ``max_token_len`` tokens each.

    The count is ``max(min_count, first-fit count)`` (callers raise ``min_count`` to the
    max over data-parallel ranks so every rank runs the same number of forward passes);
    sums are then balanced with :func:`balanced_partitions`. Never more micro-batches
    than samples.
    """
    k = max(min_count, num_micro_batches(lengths, max_token_len))
    k = min(k, len(lengths))
    return balanced_partitions(lengths, k, equal_size=False)
