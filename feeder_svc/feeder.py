"""The prompt feeder: a PromptDataset turned into items on the ``prompts`` stream, in order.

Position: with a ``state_path`` the feeder's position (epoch, cursor, prompts fed) is written
there after every put and read back at start (:mod:`services.data.feed_position`), so a
restarted feeder or a resumed job feeds the prompts not fed yet, in order, instead of
starting the data over (whose ids the queue would drop as already seen).

How many prompts may go out is not decided here: :func:`feeder_svc.admission.room` says,
and :class:`feeder_svc.loop.FeedLoop` asks it before every :meth:`PromptFeeder.put`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from services.data.feed_position import FeedPosition, read_position, write_position
from services.data.prompt_frames import prompt_frame
from services.data.prompt_items import epoch_order, fed_uids, prompt_item, prompt_uid
from services.queues.base import RawItem


class PromptFeeder:
    """Feeds ``dataset`` into ``queue`` (a services.queues Queue on the prompts stream)."""

    def __init__(self, dataset, queue, *, n: int, shuffle: bool = True, seed: int = 0, job: str = "job",
                 put_batch: int = 16, state_path: str | Path | None = None) -> None:
        if len(dataset) == 0:
            raise ValueError("the prompt dataset is empty (all prompts filtered as over-long?)")
        self.dataset, self.queue = dataset, queue
        self.n, self.shuffle, self.seed, self.job = n, shuffle, seed, job
        self.put_batch = put_batch
        self.state = FeedPosition()
        self.state_path = Path(state_path) if state_path else None
        self._fingerprint = {"prompts": len(dataset), "shuffle": shuffle, "seed": seed, "job": job}
        if self.state_path is not None and self.state_path.exists():
            data, state = read_position(self.state_path)
            if data != self._fingerprint:
                raise ValueError(f"feeder state {self.state_path} belongs to other data ({data} != "
                                 f"{self._fingerprint}); use a new run dir or delete the file")
            self.state = state
        self._order = self._epoch_order(self.state.epoch)

    def _save(self) -> None:
        if self.state_path is not None:
            write_position(self.state_path, self._fingerprint, self.state)

    def _epoch_order(self, epoch: int) -> list[int]:
        return epoch_order(len(self.dataset), shuffle=self.shuffle, seed=self.seed, epoch=epoch)

    def _next_row(self) -> tuple[dict[str, Any], int]:
        if self.state.cursor >= len(self._order):
            self.state.epoch += 1
            self.state.cursor = 0
            self._order = self._epoch_order(self.state.epoch)
        row = self.dataset[self._order[self.state.cursor]]
        self.state.cursor += 1
        return row, self.state.epoch

    def uid(self, epoch: int, index: int) -> str:
        return prompt_uid(self.job, epoch, index)

    def fed_uids(self) -> list[str]:
        """The uid of every prompt fed so far, in feeding order."""
        return list(fed_uids(self.job, len(self.dataset), self.state.fed, shuffle=self.shuffle, seed=self.seed))

    def _frame(self, row: dict[str, Any], uid: str, epoch: int) -> bytes:
        """The wire frame of the prompt item of ``row``: written without torch
        (services/data/prompt_frames.py) unless the row holds more than plain Python data."""
        frame = prompt_frame(row, uid=uid, n=self.n, epoch=epoch)
        if frame is None:
            from services import wire

            frame = bytes(wire.encode(prompt_item(row, uid=uid, n=self.n, epoch=epoch)))
        return frame

    async def put(self, count: int, timeout: float = 30.0,
                  on_put: Callable[[list[str]], None] | None = None) -> int:
        """Put the next ``count`` prompts (in chunks of ``put_batch``); returns how many went out.
        ``on_put`` gets the uids of each chunk once it is on the stream. A chunk that fails is
        not fed: the same prompts go next time (the error propagates)."""
        put = 0
        while put < count:
            k = min(count - put, self.put_batch)
            before = FeedPosition(**asdict(self.state))
            items, uids = [], []
            for _ in range(k):
                row, epoch = self._next_row()
                uids.append(self.uid(epoch, row["index"]))
                items.append(RawItem(self._frame(row, uids[-1], epoch), (uids[-1],)))
            try:
                await self.queue.put_frames(items, timeout=timeout, stage="queued")
            except BaseException:
                self.state = before
                self._order = self._epoch_order(self.state.epoch)
                raise
            self.state.fed += k
            self._save()
            if on_put is not None:
                on_put(uids)
            put += k
        return put


def build_feeder(view, queue, *, log=print, state_path: str | Path | None = None) -> PromptFeeder:
    """The feeder of ``view`` (a :class:`~services.config.views.FeederView`) on ``queue``: the
    training files through :class:`~services.data.prompts.PromptDataset` with the job's
    tokenizer -- without importing transformers once this tokenizer was used before
    (:mod:`services.data.prompt_tokenizer`)."""
    from services.data.prompt_tokenizer import open_prompt_dataset

    d = view.data
    ds = open_prompt_dataset(d.train_files, view.model.tokenizer, trust_remote_code=view.model.trust_remote_code,
                             log=lambda line: log(f"feeder: {line}"), max_prompt_length=d.max_prompt_length,
                             truncation=d.truncation, filter_overlong_prompts=d.filter_overlong_prompts,
                             prompt_key=d.prompt_key, chat_template=d.chat_template)
    if ds.num_filtered:
        log(f"filtered {ds.num_filtered} over-long prompts (data.max_prompt_length={d.max_prompt_length})")
    return PromptFeeder(ds, queue, n=view.rollout.n, shuffle=d.shuffle, seed=d.seed, job=view.name,
                        state_path=state_path)
