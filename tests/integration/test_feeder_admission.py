"""Admission counted from the queue's sample ledger, on a real broker with its append-only
file: the feeder never has more than its limit in flight, whatever the trainer dropped,
and a restarted feeder (or a resumed job, the broker killed and restarted) starts from
what the ledger says is still in flight -- never from counters a restart has lost."""

from __future__ import annotations

import pytest

from feeder_svc.feeder import PromptFeeder
from feeder_svc.loop import FeedLoop
from feeder_svc.metrics import FeederMetrics
from services.config.views import FeederView
from services.queues import make_queue

pytestmark = [pytest.mark.timeout(90)]

N = 2  # samples per prompt


def _rows(n: int):
    return [{"raw_prompt_ids": [1, 2, 3], "data_source": "t", "reward_model": {"ground_truth": "1"},
             "extra_info": {}, "index": i} for i in range(n)]


def _view(tmp_path, address: str) -> FeederView:
    return FeederView.model_validate({
        "name": "adm", "model": {"path": str(tmp_path)}, "data": {"train_files": ["x"], "train_batch_size": 4},
        "rollout": {"n": N}, "async": {"max_staleness": 1}, "queues": {"type": "embedded", "address": address, "op_timeout_s": 3.0, "put_timeout_s": 3.0},
    })  # fmt: skip


def _loop(tmp_path, address: str) -> FeedLoop:
    """A feeder as ``meshrl run`` starts it: its position in ``feeder.json``."""
    view = _view(tmp_path, address)
    q = make_queue(view.queues, stream="prompts", group="controller", consumer="feeder")
    feeder = PromptFeeder(_rows(200), q, n=N, job="adm", state_path=tmp_path / "feeder.json")
    return FeedLoop(view, feeder, FeederMetrics(), [], emit=lambda _line: None)


def _samples(uids):
    return [f"{u}/{k}" for u in uids for k in range(N)]


async def test_admission_follows_the_ledger_across_a_restart(tmp_path, broker_aof):
    loop = _loop(tmp_path, broker_aof.address)
    ledger = make_queue(_view(tmp_path, broker_aof.address).queues, stream="experience", group="trainer",
                        consumer="trainer")
    try:
        assert await loop.round() == 8  # (max_staleness + 1) x train_batch_size
        assert await loop.round() == 0
        fed = loop.feeder.fed_uids()
        # the trainer: two prompts trained in a committed step, two dropped as stale (acked at
        # once: a trainer restored from its checkpoint would no longer count these), one
        # half-done (one sample trained, the other still being scored)
        await ledger.record_stage(_samples(fed[:2]), "trained")
        await ledger.record_stage(_samples(fed[2:4]), "dropped")
        await ledger.record_stage([f"{fed[4]}/0"], "trained")
        await ledger.record_stage([f"{fed[4]}/1"], "scored")
        assert await loop.round() == 4
        assert loop.status()["in_flight"] == 8 and loop.status()["prompts_fed"] == 12
        assert await loop.round() == 0
        # a setback a redelivery could write ("generated" again) does not finish anything
        await ledger.record_stage(_samples(fed[5:6]), "generated")
        assert await loop.round() == 0
        await loop.feeder.queue.close()

        # the whole job dies: the broker is killed and replays its file; the feeder starts again
        broker_aof.kill()
        broker_aof.restart()
        again = _loop(tmp_path, broker_aof.address)
        assert again.feeder.state.fed == 12
        assert await again.round() == 0  # the 8 in flight are known from the ledger at once
        assert again.status()["in_flight"] == 8
        await ledger.record_stage(_samples(fed[4:8]), "trained")  # fed[4] finished now too
        assert await again.round() == 4
        assert again.status()["in_flight"] == 8
        await again.feeder.queue.close()
    finally:
        await ledger.close()


async def test_a_ledger_that_cannot_be_read_feeds_nothing(tmp_path, broker):
    loop = _loop(tmp_path, broker.address)
    try:
        assert await loop.round() == 8
        broker.kill()  # nothing can say what finished: nothing goes out
        assert await loop.round() == 0
        assert loop.status()["in_flight"] == 8
    finally:
        await loop.feeder.queue.close()


async def test_with_the_canary_gate_the_room_a_step_frees_is_filled_when_the_step_ends(tmp_path, broker):
    """``feed_each_step`` (``meshrl run`` sets it in canary mode): the feeder watches the
    trainer's step file and tops up as soon as a line appears, not at its next poll (here
    five minutes away), so a canary that has just loaded a candidate gets prompts at once."""
    import asyncio

    steps = tmp_path / "trainer_metrics.jsonl"
    steps.write_text("")
    view = _view(tmp_path, broker.address).model_copy(update={"trainer_metrics_file": str(steps),
                                                               "feed_each_step": True})
    q = make_queue(view.queues, stream="prompts", group="controller", consumer="feeder")
    loop = FeedLoop(view, PromptFeeder(_rows(200), q, n=N, job="adm", state_path=tmp_path / "feeder.json"),
                    FeederMetrics(), [], emit=lambda _line: None)
    ledger = make_queue(view.queues, stream="experience", group="trainer", consumer="trainer")
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop.is_set, poll_s=300.0))

    async def fed(n: int) -> bool:
        for _ in range(200):  # 20 s at most
            if loop.feeder.state.fed >= n or task.done():
                break
            await asyncio.sleep(0.1)
        return loop.feeder.state.fed >= n

    try:
        assert await fed(8)  # the first round fills the window
        uids = loop.feeder.fed_uids()
        await ledger.record_stage(_samples(uids[:3]), "trained")  # the trainer commits a step ...
        with steps.open("a") as f:
            f.write('{"step": 1}\n')  # ... then writes its line
        assert await fed(11), f"fed {loop.feeder.state.fed} after the step line (task done: {task.done()})"
        assert loop.status()["in_flight"] == 8
    finally:
        stop.set()
        await asyncio.wait_for(task, 5.0)
        await loop.feeder.queue.close()
        await ledger.close()
