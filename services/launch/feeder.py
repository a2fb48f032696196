"""The prompt feeder: turns a PromptDataset into items on the ``prompts`` stream.

Admission control (DESIGN.md, AReaL-style): at most ``max_in_flight`` prompts are fed
and not yet finished (trained or dropped), so rollouts never run more than
``max_staleness + 1`` batches ahead of the trainer. The controller tells the feeder how
many prompts have finished (it reads the trainer's counters) and the feeder tops up.

Item layout (docs/contracts.md): one DataProto per prompt, batch size 1, non-tensor
columns ``raw_prompt_ids``, ``uid``, ``sample_id`` (= uid), ``data_source``,
``reward_model``, ``extra_info``, ``index``; meta_info ``n``, ``validate``, ``epoch``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
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


@dataclass
class FeederState:
    epoch: int = 0
    cursor: int = 0  # position in the epoch's order
    fed: int = 0  # prompts put so far (all epochs)


class PromptFeeder:
    """Feeds ``dataset`` into ``queue`` (a services.queues Queue on the prompts stream)."""

    def __init__(self, dataset, queue, *, n: int, max_in_flight: int, shuffle: bool = True, seed: int = 0,
                 job: str = "job", put_batch: int = 16) -> None:
        if len(dataset) == 0:
            raise ValueError("the prompt dataset is empty (all prompts filtered as over-long?)")
        self.dataset, self.queue = dataset, queue
        self.n, self.max_in_flight = n, max_in_flight
        self.shuffle, self.seed, self.job = shuffle, seed, job
        self.put_batch = put_batch
        self.state = FeederState()
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def _next_row(self) -> tuple[dict[str, Any], int]:
        if self.state.cursor >= len(self._order):
            self.state.epoch += 1
            self.state.cursor = 0
            self._order = self._epoch_order(self.state.epoch)
        row = self.dataset[self._order[self.state.cursor]]
        self.state.cursor += 1
        return row, self.state.epoch

    async def top_up(self, finished: int, timeout: float = 30.0) -> int:
        """Put prompts until ``fed - finished`` reaches ``max_in_flight``; returns how many were put."""
        want = self.max_in_flight - (self.state.fed - finished)
        put = 0
        while want > 0:
            k = min(want, self.put_batch)
            items = []
            for _ in range(k):
                row, epoch = self._next_row()
                uid = f"{self.job}-e{epoch}-p{row['index']}"
                items.append(prompt_item(row, uid=uid, n=self.n, epoch=epoch))
            await self.queue.put(items, timeout=timeout)
            self.state.fed += k
            put += k
            want -= k
        return put


def build_feeder(spec, queue, *, log=print) -> PromptFeeder:
    """The feeder of job ``spec`` (a JobSpec) on ``queue``: the training files through
    :class:`~services.data.prompts.PromptDataset` with the job's tokenizer, admission limit
    ``(async.max_staleness + 1) * data.train_batch_size`` prompts."""
    from transformers import AutoTokenizer

    from services.data.prompts import PromptDataset

    tok = AutoTokenizer.from_pretrained(spec.model.tokenizer_path or spec.model.path,
                                        trust_remote_code=spec.model.trust_remote_code)
    ds = PromptDataset(spec.data.train_files, tok, max_prompt_length=spec.data.max_prompt_length,
                       truncation=spec.data.truncation, filter_overlong_prompts=spec.data.filter_overlong_prompts,
                       prompt_key=spec.data.prompt_key)
    if ds.num_filtered:
        log(f"filtered {ds.num_filtered} over-long prompts (data.max_prompt_length={spec.data.max_prompt_length})")
    in_flight = (spec.async_.max_staleness + 1) * spec.data.train_batch_size
    return PromptFeeder(ds, queue, n=spec.rollout.n, max_in_flight=in_flight, shuffle=spec.data.shuffle,
                        seed=spec.data.seed, job=spec.name)
