"""Trainer intake on a real Redis stream: staleness filtering, counting, ack-after-commit."""

from __future__ import annotations

import pytest
import torch

from services.config.queues import EmbeddedQueueConfig, RedisQueueConfig
from services.queues import make_queue
from trainer_svc.intake import QueueIntake
from trainer_svc.synthetic import make_group

pytestmark = [pytest.mark.redis]

VOCAB = 64


def _cfg(server):
    if hasattr(server, "address"):  # the embedded broker
        return EmbeddedQueueConfig(address=server.address, op_timeout_s=5.0, put_timeout_s=10.0, lease_idle_s=0)
    return RedisQueueConfig(url=server.url, op_timeout_s=5.0, put_timeout_s=10.0, lease_idle_s=0)


async def _pair(server):
    """A producer and the trainer's consumer of the ``experience`` stream (its group made)."""
    producer = make_queue(_cfg(server), stream="experience", group="trainer", consumer="producer")
    consumer = make_queue(_cfg(server), stream="experience", group="trainer", consumer="trainer-0")
    await consumer.depth()
    return producer, consumer


@pytest.fixture(params=["redis", "embedded"])
def server(request):
    """Each intake test runs on both queue backends."""
    return request.getfixturevalue("redis_server" if request.param == "redis" else "broker")


def _group(uid: str, versions: list[int], response_len: int = 5, prompt_len: int = 4):
    g = make_group(uid, n=len(versions), prompt_len=prompt_len, response_len=response_len, vocab_size=VOCAB, seed=hash(uid) % 1000)
    g.batch["policy_version"] = torch.tensor(versions, dtype=torch.long)
    return g


async def test_stale_samples_are_dropped_counted_and_acked_after_commit(server):
    producer, consumer = await _pair(server)
    # current version 5, max_staleness 1: versions 4 and 5 are fresh, 3 and below stale, and
    # 6 and above come from a run that died after its last checkpoint (this one resumed at 5).
    await producer.put(
        [
            _group("fresh", [5, 5]),
            _group("all-stale", [3, 2]),
            _group("future", [7, 6]),
            _group("mixed", [4, 3], response_len=7, prompt_len=6),  # different shape: intake re-pads
            _group("fresh2", [4, 4]),
        ]
    )
    intake = QueueIntake(consumer, train_batch_size=3, max_staleness=1, poll_s=0.2)
    pending = await intake.next_batch(5, timeout=10)
    assert pending is not None
    uids = list(pending.data.non_tensor_batch["uid"])
    assert uids == ["fresh", "fresh", "mixed", "fresh2", "fresh2"]
    assert list(pending.data.non_tensor_batch["sample_id"]) == ["fresh/0", "fresh/1", "mixed/0", "fresh2/0", "fresh2/1"]
    assert pending.staleness == [0, 0, 1, 1, 1]
    # all-stale/0, all-stale/1, future/0, future/1 and mixed/1 count when their items are
    # acked with the step (they go back unacked if the step never commits)
    assert intake.counters.dropped_stale == 0 and pending.dropped_stale == 5
    assert pending.dropped_ids == ["mixed/1"] and len(pending.dropped_items) == 2
    # collated to the longest prompt (6) and response (7)
    assert tuple(pending.data.batch["responses"].shape) == (5, 7)
    assert tuple(pending.data.batch["input_ids"].shape) == (5, 13)
    assert int(pending.data.batch["response_mask"][0, 5:].sum()) == 0  # right padding is masked
    # nothing is acked before the commit; the ledger knows at once the groups that are done
    stages = await consumer.stages(["fresh/0", "all-stale/0", "future/1", "mixed/1"])
    assert stages["all-stale/0"] == "dropped" and stages["future/1"] == "dropped"
    assert stages["fresh/0"] != "trained"
    assert await consumer.depth() == 5
    await intake.commit(pending)
    assert await consumer.depth() == 0
    stages = await consumer.stages(["fresh/0", "fresh2/1", "mixed/0", "mixed/1"])
    assert stages == {"fresh/0": "trained", "fresh2/1": "trained", "mixed/0": "trained", "mixed/1": "dropped"}
    assert intake.counters.samples_trained == 5 and intake.counters.batches == 1
    assert intake.counters.dropped_stale == 5
    await producer.close()
    await consumer.close()


async def test_uncommitted_batch_is_recovered_after_restart(server):
    """A trainer that dies before commit loses nothing: the restarted intake takes the
    items its previous incarnation leased (even with automatic reclaim off) before new ones."""
    cfg = _cfg(server)
    producer = make_queue(cfg, stream="experience", group="trainer", consumer="producer")
    first = make_queue(cfg, stream="experience", group="trainer", consumer="trainer-0")
    await first.depth()
    await producer.put([_group("a", [0, 0]), _group("b", [0, 0])])
    pending = await QueueIntake(first, train_batch_size=2, max_staleness=0, poll_s=0.2).next_batch(0, timeout=10)
    assert pending is not None and len(pending.data) == 4
    await first.close()  # "crash": no commit, the items stay leased
    await producer.put([_group("c", [0, 0])])
    restarted = make_queue(cfg, stream="experience", group="trainer", consumer="trainer-0")
    intake = QueueIntake(restarted, train_batch_size=3, max_staleness=0, poll_s=0.2)
    again = await intake.next_batch(0, timeout=10)
    assert sorted(again.data.non_tensor_batch["sample_id"]) == ["a/0", "a/1", "b/0", "b/1", "c/0", "c/1"]
    await intake.commit(again)
    assert await restarted.depth() == 0
    for q in (producer, restarted):
        await q.close()


async def test_timeout_when_batch_never_fills(server):
    consumer = make_queue(_cfg(server), stream="experience", group="trainer", consumer="trainer-0")
    intake = QueueIntake(consumer, train_batch_size=2, max_staleness=0, poll_s=0.1)
    with pytest.raises(TimeoutError, match="0/2 groups"):
        await intake.next_batch(0, timeout=0.5)
    stopped = await intake.next_batch(0, timeout=5, should_stop=lambda: True)
    assert stopped is None
    await consumer.close()


async def test_skipped_nonfinite_step_is_recorded_honestly(server):
    producer, consumer = await _pair(server)
    await producer.put([_group("nan", [0, 0])])
    intake = QueueIntake(consumer, train_batch_size=1, max_staleness=0, poll_s=0.2)
    pending = await intake.next_batch(0, timeout=10)
    await intake.commit(pending, applied=False)
    assert await consumer.depth() == 0
    assert await consumer.stages(["nan/0", "nan/1"]) == {"nan/0": "nonfinite", "nan/1": "nonfinite"}
    assert intake.counters.samples_nonfinite == 2 and intake.counters.samples_trained == 0
    await producer.close()
    await consumer.close()


async def test_malformed_items_are_dropped_with_a_reason_and_training_goes_on(server, caplog):
    producer, consumer = await _pair(server)
    no_scores = _group("no-scores", [0, 0])
    no_scores.pop(batch_keys=["token_level_scores"])
    bad_shape = _group("bad-shape", [0, 0])
    bad_shape.batch["responses"] = bad_shape.batch["responses"].flip(-1)  # no longer the tail of input_ids
    await producer.put([no_scores, bad_shape, _group("good", [0, 0])])
    intake = QueueIntake(consumer, train_batch_size=1, max_staleness=0, poll_s=0.2)
    with caplog.at_level("ERROR"):
        pending = await intake.next_batch(0, timeout=10)
    assert list(pending.data.non_tensor_batch["uid"]) == ["good", "good"]
    await intake.commit(pending)
    assert intake.counters.dropped_error == 4
    assert "token_level_scores" in caplog.text and "last R columns" in caplog.text
    assert await consumer.stages(["no-scores/0", "bad-shape/1"]) == {"no-scores/0": "dropped", "bad-shape/1": "dropped"}
    await producer.close()
    await consumer.close()


async def test_a_failed_score_is_trained_as_zero_and_a_rollout_error_is_dropped(server):
    import numpy as np

    producer, consumer = await _pair(server)
    g = _group("mixed-errors", [0, 0, 0])
    g.non_tensor_batch["error"] = np.array(["", "reward timeout: scorer call exceeded its deadline",
                                            "prompt item has no raw_prompt_ids column"], dtype=object)
    await producer.put([g])
    intake = QueueIntake(consumer, train_batch_size=1, max_staleness=0, poll_s=0.2)
    pending = await intake.next_batch(0, timeout=10)
    assert list(pending.data.non_tensor_batch["sample_id"]) == ["mixed-errors/0", "mixed-errors/1"]
    assert intake.counters.scored_failed == 0 and intake.counters.dropped_error == 0  # counted at commit
    await intake.commit(pending)
    assert intake.counters.scored_failed == 1 and intake.counters.dropped_error == 1
    assert await consumer.stages(["mixed-errors/1", "mixed-errors/2"]) == {
        "mixed-errors/1": "trained", "mixed-errors/2": "dropped"}
    await producer.close()
    await consumer.close()


async def test_deferred_acks_wait_for_the_checkpoint_and_a_restart_trains_nothing_twice(server):
    producer, consumer = await _pair(server)
    await producer.put([_group(f"g{i}", [0, 0]) for i in range(3)])
    intake = QueueIntake(consumer, train_batch_size=1, max_staleness=0, poll_s=0.2, defer_acks=True)
    first = await intake.next_batch(0, timeout=10)
    await intake.commit(first)
    assert await consumer.depth() == 3  # trained, held until a checkpoint covers it
    # ... but the ledger says trained at once (the feeder counts the prompt finished)
    assert await consumer.stages(["g0/0", "g0/1"]) == {"g0/0": "trained", "g0/1": "trained"}
    checkpoint = intake.state()  # what the checkpoint of step 1 records ...
    second = await intake.next_batch(0, timeout=10)
    await intake.commit(second)  # ... step 2 is trained after it, then the trainer dies
    await consumer.close()
    # a new incarnation resumes from the step-1 checkpoint: g0 is acked untrained, g1 trained again
    consumer = make_queue(_cfg(server), stream="experience", group="trainer", consumer="trainer-0")
    again = QueueIntake(consumer, train_batch_size=1, max_staleness=0, poll_s=0.2, defer_acks=True)
    again.restore(checkpoint)
    batch = await again.next_batch(0, timeout=10)
    assert list(batch.data.non_tensor_batch["uid"]) == ["g1", "g1"]
    assert await consumer.stages(["g0/0"]) == {"g0/0": "trained"}
    await again.commit(batch)
    await again.acks_due()
    assert await consumer.depth() == 1  # g2 waits
    await producer.close()
    await consumer.close()


async def test_an_own_lease_handed_back_while_the_batch_fills_is_not_trained_twice(server):
    """The trainer's own lease idles past ``lease_idle_s`` while it waits for the rest of the
    batch (a frozen replica): the queue hands the same entry back to it. It must not go into
    the batch a second time, and a group screened for a batch that never commits must not
    count its drops twice."""
    cfg = _cfg(server).model_copy(update={"lease_idle_s": 0.6})
    producer = make_queue(cfg, stream="experience", group="trainer", consumer="producer")
    consumer = make_queue(cfg, stream="experience", group="trainer", consumer="trainer-0")
    await consumer.depth()
    await producer.put([_group("early", [0, 1])])  # at v1 with max_staleness 0, early/0 is stale
    intake = QueueIntake(consumer, train_batch_size=2, max_staleness=0, poll_s=0.2)
    with pytest.raises(TimeoutError):  # only one group arrives: the step never fills
        await intake.next_batch(1, timeout=3.0)
    assert intake.counters.dropped_stale == 0  # early/0 (v0 at v1) is not counted: its item went back
    await producer.put([_group("late", [1, 1])])
    pending = await intake.next_batch(1, timeout=10)
    assert sorted(pending.data.non_tensor_batch["sample_id"]) == ["early/1", "late/0", "late/1"]
    await intake.commit(pending)
    assert intake.counters.dropped_stale == 1 and intake.counters.samples_trained == 3
    assert await consumer.stages(["early/0", "early/1"]) == {"early/0": "dropped", "early/1": "trained"}
    await producer.close()
    await consumer.close()


async def test_groups_dropped_after_the_checkpoint_are_counted_once_by_the_restored_trainer(server):
    """A group with nothing to train is in the ledger as dropped at once, but counted and acked
    with its step: a trainer killed before that step's checkpoint, restored from the one
    before, screens it again and counts it once -- its drops are never forgotten (acked at
    once, they would be: gone from the stream, missing from the restored counters)."""
    producer, consumer = await _pair(server)
    await producer.put([_group("stale", [1, 1]), _group("fresh", [3, 3])])
    intake = QueueIntake(consumer, train_batch_size=1, max_staleness=0, poll_s=0.2, defer_acks=True)
    intake.counters.samples_trained = 6  # what the last checkpoint holds
    checkpoint = intake.state()
    pending = await intake.next_batch(3, timeout=10)
    assert [str(it.sample_ids[0]) for it in pending.dropped_items] == ["stale/0"]
    assert await consumer.stages(["stale/0", "stale/1"]) == {"stale/0": "dropped", "stale/1": "dropped"}
    await intake.commit(pending)
    assert intake.counters.dropped_stale == 2 and await consumer.depth() == 2  # held for the checkpoint
    await consumer.close()  # killed before it
    consumer = make_queue(_cfg(server), stream="experience", group="trainer", consumer="trainer-0")
    again = QueueIntake(consumer, train_batch_size=1, max_staleness=0, poll_s=0.2, defer_acks=True)
    again.restore(checkpoint)
    batch = await again.next_batch(3, timeout=10)
    await again.commit(batch)
    await again.acks_due()
    assert (again.counters.samples_trained, again.counters.dropped_stale) == (8, 2)
    assert await consumer.depth() == 0
    assert await consumer.stages(["fresh/0", "stale/1"]) == {"fresh/0": "trained", "stale/1": "dropped"}
    await producer.close()
    await consumer.close()
