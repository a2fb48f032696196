"""The feeding loop: the one place prompts are put on the ``prompts`` stream.

Every round it reads how many prompts the trainer has finished (its ``/metrics``), asks the
admission rule (:mod:`feeder_svc.admission`) how many may go out, puts them, and exports
its counters and the streams' depths. With ``async.mode=sync`` it also reads the served
version of every replica, and between rounds it watches the trainer's step file (a line
per committed step, when the view names one) so the next batch goes out as soon as a step
has ended and the replicas serve its version, not a poll interval later: the synchronous
baseline is not charged for the feeder's poll.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from feeder_svc.admission import finished_prompts, room
from feeder_svc.feeder import PromptFeeder
from feeder_svc.metrics import FeederMetrics
from services.metrics.scrape import scrape

log = logging.getLogger("meshrl.feeder")

#: The streams whose depths the feeder exports, with the consumer group that reads each.
WATCHED = (("prompts", "rollout"), ("rollouts", "reward"), ("experience", "trainer"))


class FeedLoop:
    """Feeds ``feeder`` as the admission rule allows (see module doc)."""

    def __init__(self, view: Any, feeder: PromptFeeder, metrics: FeederMetrics, watched: list[Any],
                 *, emit: Callable[[str], None] = print) -> None:
        self.view, self.feeder, self.metrics, self.watched = view, feeder, metrics, watched
        self.emit = emit
        self.limit = view.max_in_flight
        self.sync = view.async_.mode == "sync"
        self.finished: int | None = None  # None until the trainer answered
        self.trainer_version: float | None = None
        self.depths: dict[str, int] = {}
        self.ready = False  # the first round reached the trainer
        step_file = getattr(view, "trainer_metrics_file", None)
        self._step_file = Path(step_file) if step_file else None

    # ------------------------------------------------------------------ one round

    async def _read_trainer(self) -> None:
        t = await asyncio.to_thread(scrape, self.view.trainer_metrics_url)
        finished = finished_prompts(t, self.view.rollout.n)
        if finished is not None:
            self.finished, self.trainer_version = finished, t.get("meshrl_trainer_policy_version")

    async def _replicas_current(self) -> bool:
        if not self.sync:
            return True
        served = await asyncio.gather(*(asyncio.to_thread(scrape, u) for u in self.view.rollout_metrics_urls))
        return self.trainer_version is not None and all(
            s.get("meshrl_rollout_served_version") == self.trainer_version for s in served)

    async def round(self, *, read_trainer: bool = True) -> int:
        """Top the stream up once; returns how many prompts were put."""
        if read_trainer:
            await self._read_trainer()
        if self.finished is None:  # the trainer is down or restarting: nobody knows what finished
            return 0
        self.ready = True
        fed = self.feeder.state.fed
        want = room(limit=self.limit, fed=fed, finished=self.finished, sync=self.sync,
                    replicas_current=await self._replicas_current() if self.sync else True)
        put = 0
        if want:
            try:
                put = await self.feeder.put(want, timeout=min(5.0, self.view.queues.put_timeout_s))
            except Exception as exc:  # noqa: BLE001 - a queue outage: the same prompts go next round
                self.emit(f"feeder: put failed, retrying: {type(exc).__name__}: {exc}")
        self.metrics.fed(put, self.feeder.state.fed, self.finished, self.limit)
        return put

    async def read_depths(self) -> None:
        """Each watched stream's depth (also into ``meshrl_queue_depth_items``)."""
        for q in self.watched:
            try:
                self.depths[q.stream] = int(await asyncio.wait_for(q.depth(), timeout=5.0))
            except Exception:  # noqa: BLE001 - a depth we cannot read is left as it was, never fatal
                pass

    # ------------------------------------------------------------------ the loop

    async def run(self, should_stop: Callable[[], bool], poll_s: float = 1.0) -> None:
        """Rounds every ``poll_s`` until ``should_stop()``."""
        while not should_stop():
            await self.round()
            await self.read_depths()
            if self.sync and self._step_file is not None:
                await self._sync_wait(poll_s, should_stop)
            else:
                await asyncio.sleep(poll_s)

    def _step_file_size(self) -> int:
        try:
            return self._step_file.stat().st_size
        except OSError:
            return 0

    async def _sync_wait(self, budget_s: float, should_stop: Callable[[], bool], tick_s: float = 0.05) -> None:
        """``async.mode=sync`` between two rounds: while a batch is out, only stat the
        trainer's step file; once a step line appears, read the trainer; once the batch is
        finished, poll the replicas until they serve its version, then feed."""
        end = time.monotonic() + budget_s
        seen = self._step_file_size()
        while time.monotonic() < end and not should_stop():
            if self.finished is None or self.feeder.state.fed > self.finished:  # the batch is out
                size = self._step_file_size()
                if size == seen:
                    await asyncio.sleep(tick_s)
                    continue
                seen = size  # a step line: its counters follow at once
                await self._read_trainer()
                continue
            if await self.round(read_trainer=False):
                return
            await asyncio.sleep(tick_s)

    def status(self) -> dict[str, Any]:
        """What ``/status`` answers."""
        s = self.feeder.state
        in_flight = None if self.finished is None else s.fed - self.finished
        return {"service": "feeder", "ready": self.ready, "prompts_fed": s.fed, "epoch": s.epoch,
                "position": s.cursor, "finished": self.finished, "in_flight": in_flight,
                "max_in_flight": self.limit, "sync": self.sync, "queues": dict(self.depths)}
