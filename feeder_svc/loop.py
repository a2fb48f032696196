"""The feeding loop: the one place prompts are put on the ``prompts`` stream.

Every round it asks the queue's sample ledger which of the prompts in flight have finished
(:class:`feeder_svc.in_flight.InFlight`; the first round rebuilds that set from every prompt
ever fed, so a resumed job or a restarted feeder starts from the truth), asks the admission
rule (:mod:`feeder_svc.admission`) how many may go out, puts them, and exports its counters
and the streams' depths. With ``async.mode=sync`` it also reads the trainer's version and
the served version of every replica. Between rounds it watches the trainer's step file (a
line per committed step, when the view names one: ``meshrl run`` does) so prompts go out as
soon as a step has ended, not a poll interval later: with ``async.mode=sync`` the next batch
goes out once the replicas serve the step's version (the synchronous baseline is not charged
for the feeder's poll); with the canary gate (``feed_each_step``) the room the step freed in
the admission window is filled at once, so a canary that has just loaded a candidate is not
kept waiting for prompts. Otherwise asynchronous jobs keep the poll: measured on
``bench/canary.py``'s job in mode ``all``, feeding on every step filled the window sooner,
so samples waited longer, some went stale, and throughput fell by about 15%.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from feeder_svc.admission import room
from feeder_svc.feeder import PromptFeeder
from feeder_svc.in_flight import InFlight
from feeder_svc.metrics import FeederMetrics
from services.metrics.scrape import scrape

log = logging.getLogger("meshrl.feeder")

#: The streams whose depths the feeder exports, with the consumer group that reads each.
WATCHED = (("prompts", "rollout"), ("rollouts", "reward"), ("experience", "trainer"))

#: Seconds between two reads of those depths: they are exported metrics only (admission
#: reads the ledger), and three queue calls every round were a third of the feeder's calls.
DEPTHS_S = 5.0


class FeedLoop:
    """Feeds ``feeder`` as the admission rule allows (see module doc)."""

    def __init__(self, view: Any, feeder: PromptFeeder, metrics: FeederMetrics, watched: list[Any],
                 *, emit: Callable[[str], None] = print) -> None:
        self.view, self.feeder, self.metrics, self.watched = view, feeder, metrics, watched
        self.emit = emit
        self.limit = view.max_in_flight
        self.sync = view.async_.mode == "sync"
        self.in_flight = InFlight(feeder.queue, view.rollout.n)
        self.trainer_version: float | None = None
        self.depths: dict[str, int] = {}
        self.ready = False  # the in-flight set was rebuilt from the ledger
        step_file = getattr(view, "trainer_metrics_file", None)
        self._step_file = Path(step_file) if step_file else None

    # ------------------------------------------------------------------ one round

    async def _read_trainer(self) -> None:
        t = await asyncio.to_thread(scrape, self.view.trainer_metrics_url)
        if "meshrl_trainer_policy_version" in t:
            self.trainer_version = t["meshrl_trainer_policy_version"]

    async def _replicas_current(self) -> bool:
        served = await asyncio.gather(*(asyncio.to_thread(scrape, u) for u in self.view.rollout_metrics_urls))
        return self.trainer_version is not None and all(
            s.get("meshrl_rollout_served_version") == self.trainer_version for s in served)

    async def _refresh(self) -> bool:
        """Bring the in-flight set up to date with the ledger (the first time: rebuild it from
        every prompt fed); False when the queue could not be read (nothing is fed then)."""
        try:
            if self.ready:
                await self.in_flight.refresh()
            else:
                await self.in_flight.rebuild(self.feeder.fed_uids())
                if self.feeder.state.fed:
                    self.emit(f"feeder: {len(self.in_flight)} of the {self.feeder.state.fed} prompts fed before "
                              "are still in flight (from the queue's ledger)")
                self.ready = True
        except Exception as exc:  # noqa: BLE001 - a queue outage: the next round asks again
            self.emit(f"feeder: reading the ledger failed, retrying: {type(exc).__name__}: {exc}")
            return False
        if self.sync:
            await self._read_trainer()
        return True

    async def recover(self) -> bool:
        """Rebuild the in-flight set from the ledger now, before anything is fed (the server
        does it at start, before it holds for the replicas, so a resumed job reports what is
        still in flight even when it ends on the batches already queued); when the queue
        cannot be read the first round tries again."""
        return await self._refresh()

    async def round(self, *, refresh: bool = True) -> int:
        """Top the stream up once; returns how many prompts were put."""
        if refresh and not await self._refresh():
            return 0
        want = room(limit=self.limit, in_flight=len(self.in_flight), sync=self.sync,
                    replicas_current=await self._replicas_current() if self.sync else True)
        before = self.feeder.state.fed
        if want:
            try:
                await self.feeder.put(want, timeout=min(5.0, self.view.queues.put_timeout_s), on_put=self.in_flight.add)
            except Exception as exc:  # noqa: BLE001 - a queue outage: the prompts not put go next round
                self.emit(f"feeder: put failed, retrying: {type(exc).__name__}: {exc}")
        put = self.feeder.state.fed - before
        self.metrics.fed(put, len(self.in_flight), self.limit)
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
        """Rounds every ``poll_s`` until ``should_stop()`` -- and, where the trainer's step
        file is known, as soon as a step has ended."""
        depths_at = 0.0
        while not should_stop():
            seen = self._step_file_size() if self._step_file is not None else 0  # before the round reads the ledger
            await self.round()
            if time.monotonic() - depths_at >= max(poll_s, DEPTHS_S):  # (not on every round)
                await self.read_depths()
                depths_at = time.monotonic()
            if self._step_file is None:
                await asyncio.sleep(poll_s)
            elif self.sync:
                await self._sync_wait(poll_s, should_stop)
            elif self.view.feed_each_step:
                await self._step_wait(poll_s, should_stop, seen)
            else:
                await asyncio.sleep(poll_s)

    def _step_file_size(self) -> int:
        try:
            return self._step_file.stat().st_size
        except OSError:
            return 0

    async def _step_wait(self, budget_s: float, should_stop: Callable[[], bool], seen: int,
                         tick_s: float = 0.05) -> None:
        """Asynchronous mode between two rounds: stat the trainer's step file every ``tick_s``
        and end the wait as soon as it differs from ``seen`` (its size before the last round):
        a step line appeared. The step's ledger stages (written
        before the line) free room in the admission window, and the next round fills it now
        rather than up to ``budget_s`` later: with steps shorter than the poll the replicas
        would otherwise run out of prompts, and a canary that has just loaded a candidate
        waits for prompts before it can make the samples the candidate is judged on.
        Samples dropped between steps free room too; the round at the end of the budget
        catches those."""
        end = time.monotonic() + budget_s
        while time.monotonic() < end and not should_stop():
            if self._step_file_size() != seen:
                return
            await asyncio.sleep(min(tick_s, max(0.0, end - time.monotonic())))

    async def _sync_wait(self, budget_s: float, should_stop: Callable[[], bool], tick_s: float = 0.05) -> None:
        """``async.mode=sync`` between two rounds: while a batch is out, only stat the
        trainer's step file; once a step line appears, ask the ledger and the trainer; once
        the batch is finished, poll the replicas until they serve its version, then feed."""
        end = time.monotonic() + budget_s
        seen = self._step_file_size()
        while time.monotonic() < end and not should_stop():
            if not self.ready or len(self.in_flight):  # the batch is out
                size = self._step_file_size()
                if size == seen:
                    await asyncio.sleep(tick_s)
                    continue
                seen = size  # a step line: its ledger stages are written before it
                await self._refresh()
                continue
            if await self.round(refresh=False):
                return
            await asyncio.sleep(tick_s)

    def status(self) -> dict[str, Any]:
        """What ``/status`` answers."""
        s = self.feeder.state
        in_flight = len(self.in_flight) if self.ready else None
        return {"service": "feeder", "ready": self.ready, "prompts_fed": s.fed, "epoch": s.epoch,
                "position": s.cursor, "finished": None if in_flight is None else s.fed - in_flight,
                "in_flight": in_flight,
                "max_in_flight": self.limit, "sync": self.sync, "queues": dict(self.depths)}
