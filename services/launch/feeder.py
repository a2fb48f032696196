"""The prompt feeder: turns a PromptDataset into items on the ``prompts`` stream.

Admission control (docs/architecture.md, "The async rules"): at most ``max_in_flight`` prompts are fed
and not yet finished (trained or dropped), so rollouts never run more than
``max_staleness + 1`` batches ahead of the trainer. The controller tells the feeder how
many prompts have finished (it reads the trainer's counters) and the feeder tops up.

Position: with a ``state_path`` the feeder's position (epoch, cursor, prompts fed) is
written there after every put and read back at start, so a resumed job feeds the prompts
not fed yet, in order, instead of starting the data over (whose ids the queue would drop
as already seen, while admission control counted them in flight).

Item layout (docs/contracts.md): one DataProto per prompt, batch size 1, non-tensor
columns ``raw_prompt_ids``, ``uid``, ``sample_id`` (= uid), ``data_source``,
``reward_model``, ``extra_info``, ``index``; meta_info ``n``, ``validate``, ``epoch``.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path
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
                 job: str = "job", put_batch: int = 16, state_path: str | Path | None = None,
                 sync: bool = False) -> None:
        if len(dataset) == 0:
            raise ValueError("the prompt dataset is empty (all prompts filtered as over-long?)")
        self.dataset, self.queue = dataset, queue
        self.n, self.max_in_flight = n, max_in_flight
        self.shuffle, self.seed, self.job = shuffle, seed, job
        self.put_batch = put_batch
        self.sync = sync
        self.state = FeederState()
        self.state_path = Path(state_path) if state_path else None
        self._fingerprint = {"prompts": len(dataset), "shuffle": shuffle, "seed": seed, "job": job}
        if self.state_path is not None and self.state_path.exists():
            self._load()
        self._order = self._epoch_order(self.state.epoch)

    def _load(self) -> None:
        try:
            saved = json.loads(self.state_path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"feeder state {self.state_path} is unreadable ({exc}); delete it to feed from the start") from None
        if saved.get("data") != self._fingerprint:
            raise ValueError(f"feeder state {self.state_path} belongs to other data ({saved.get('data')} != "
                             f"{self._fingerprint}); use a new run dir or delete the file")
        self.state = FeederState(**saved["state"])

    def _save(self) -> None:
        if self.state_path is None:
            return
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"data": self._fingerprint, "state": asdict(self.state)}))
        os.replace(tmp, self.state_path)

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

    def uid(self, epoch: int, index: int) -> str:
        return f"{self.job}-e{epoch}-p{index}"

    def fed_uids(self) -> list[str]:
        """The uid of every prompt fed so far, in feeding order."""
        out, epoch, cursor = [], 0, 0
        order = self._epoch_order(0)
        for _ in range(self.state.fed):
            if cursor >= len(order):
                epoch, cursor = epoch + 1, 0
                order = self._epoch_order(epoch)
            out.append(self.uid(epoch, order[cursor]))  # a row's index is its position
            cursor += 1
        return out

    async def top_up(self, finished: int, timeout: float = 30.0, *, replicas_current: bool = True) -> int:
        """Put prompts until ``fed - finished`` reaches ``max_in_flight``; returns how many were put.

        In sync mode (``async.mode=sync``) a new batch goes out only when the last one is
        wholly finished *and* ``replicas_current`` (every replica serves the trainer's
        current version), so every sample is generated by the policy that trains on it.
        """
        if self.sync and (self.state.fed > finished or not replicas_current):
            return 0
        want = self.max_in_flight - (self.state.fed - finished)
        put = 0
        while want > 0:
            k = min(want, self.put_batch)
            items = []
            before = FeederState(**asdict(self.state))
            for _ in range(k):
                row, epoch = self._next_row()
                items.append(prompt_item(row, uid=self.uid(epoch, row["index"]), n=self.n, epoch=epoch))
            try:
                await self.queue.put(items, timeout=timeout, stage="queued")
            except BaseException:
                self.state = before  # not fed: the same prompts go next time
                self._order = self._epoch_order(self.state.epoch)
                raise
            self.state.fed += k
            self._save()
            put += k
            want -= k
        return put


def build_feeder(view, queue, *, log=print, state_path: str | Path | None = None) -> PromptFeeder:
    """The feeder of ``view`` (a :class:`~services.config.views.FeederView`) on ``queue``: the
    training files through :class:`~services.data.prompts.PromptDataset` with the job's
    tokenizer, admission limit ``(async.max_staleness + 1) * data.train_batch_size`` prompts
    (one batch, paced by the replicas' served version, with ``async.mode=sync``)."""
    from transformers import AutoTokenizer

    from services.data.prompts import PromptDataset

    tok = AutoTokenizer.from_pretrained(view.model.tokenizer, trust_remote_code=view.model.trust_remote_code)
    d = view.data
    ds = PromptDataset(d.train_files, tok, max_prompt_length=d.max_prompt_length, truncation=d.truncation,
                       filter_overlong_prompts=d.filter_overlong_prompts, prompt_key=d.prompt_key,
                       chat_template=d.chat_template)
    if ds.num_filtered:
        log(f"filtered {ds.num_filtered} over-long prompts (data.max_prompt_length={d.max_prompt_length})")
    return PromptFeeder(ds, queue, n=view.rollout.n, max_in_flight=view.max_in_flight, shuffle=d.shuffle,
                        seed=d.seed, job=view.name, state_path=state_path, sync=view.async_.mode == "sync")
