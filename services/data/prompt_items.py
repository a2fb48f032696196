"""The ``prompts`` stream's item layout and the ids and order of a job's prompts.

Shared by the feeder (``feeder_svc``), the validation rounds of ``meshrl run``'s controller
and the controller's end-of-run audit, so every producer writes the same layout and the
audit can name every prompt fed from the feeder's saved position alone.

Item layout (docs/contracts.md): one DataProto per prompt, batch size 1, non-tensor columns
``raw_prompt_ids``, ``uid``, ``sample_id`` (= uid), ``data_source``, ``reward_model``,
``extra_info``, ``index``; meta_info ``n``, ``validate``, ``epoch``.

Order: epoch ``e`` visits the rows in ``epoch_order(len, shuffle, seed, e)``; the prompt at
row ``i`` of epoch ``e`` has uid ``<job>-e<e>-p<i>`` (a row's ``index`` is its position).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np


def _object_column(value: Any) -> np.ndarray:
    col = np.empty(1, dtype=object)
    col[0] = value  # never np.array([list]): that would make a 2-D int array
    return col


def prompt_item(row: dict[str, Any], *, uid: str, n: int, epoch: int, validate: bool = False):
    """One ``prompts`` stream item from a PromptDataset row."""
    from services.protocol import DataProto

    non_tensors = {
        "raw_prompt_ids": _object_column(list(row["raw_prompt_ids"])),
        "uid": _object_column(uid),
        "sample_id": _object_column(uid),
        "data_source": _object_column(row["data_source"]),
        "reward_model": _object_column(dict(row["reward_model"])),
        "extra_info": _object_column(dict(row.get("extra_info") or {})),
        "index": _object_column(int(row["index"])),
    }
    return DataProto.from_dict(non_tensors=non_tensors, meta_info={"n": n, "validate": validate, "epoch": epoch})


def prompt_uid(job: str, epoch: int, index: int) -> str:
    """The uid (and ``sample_id``) of row ``index`` fed in ``epoch`` of job ``job``."""
    return f"{job}-e{epoch}-p{index}"


def epoch_order(size: int, *, shuffle: bool, seed: int, epoch: int) -> list[int]:
    """The order in which epoch ``epoch`` visits ``size`` rows."""
    order = list(range(size))
    if shuffle:
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def fed_uids(job: str, size: int, fed: int, *, shuffle: bool, seed: int) -> Iterator[str]:
    """The uid of every one of the first ``fed`` prompts fed, in feeding order."""
    epoch, cursor, order = 0, 0, epoch_order(size, shuffle=shuffle, seed=seed, epoch=0)
    for _ in range(fed):
        if cursor >= len(order):
            epoch, cursor = epoch + 1, 0
            order = epoch_order(size, shuffle=shuffle, seed=seed, epoch=epoch)
        yield prompt_uid(job, epoch, order[cursor])
        cursor += 1
