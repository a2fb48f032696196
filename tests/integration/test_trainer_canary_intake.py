"""The trainer's intake with the canary gate, on a real queue (the embedded broker): a
candidate's samples wait, are judged in a batch, and a rejected version's samples are
dropped and counted wherever they turn up -- never trained."""

from __future__ import annotations

import asyncio

import pytest
import torch

from services.config.queues import EmbeddedQueueConfig
from services.config.weights import WeightChannelConfig
from services.protocol import DataProto
from services.queues import make_queue
from trainer_svc.weights.publisher import WeightPublisher
from trainer_svc.promotion.canary import META_KEY, Canary as CanaryGate, judge, park_limit
from trainer_svc.intake import QueueIntake
from trainer_svc.synthetic import make_group


def _group(uid: str, version: int, n: int = 2):
    g = make_group(uid, n=n, prompt_len=4, response_len=5, vocab_size=64, seed=hash(uid) % 1000)
    g.batch["policy_version"] = torch.full((n,), version, dtype=torch.long)
    return g


def _publisher(promoted: int, candidate: int, promote_after_samples: int) -> WeightPublisher:
    """A canary-mode publisher (never started) with ``promoted`` served and ``candidate`` under test."""
    pub = WeightPublisher(WeightChannelConfig(control_port=0, rollout={
        "mode": "canary", "promote_after_samples": promote_after_samples}))
    pub.rollout.routed(promoted, "promote")
    pub.rollout.routed(candidate, "canaries")
    return pub


async def _experience(broker):
    """A producer and the trainer's consumer of the experience stream on ``broker``."""
    cfg = EmbeddedQueueConfig(address=broker.address, op_timeout_s=5.0, put_timeout_s=10.0, lease_idle_s=0)
    producer = make_queue(cfg, stream="experience", group="trainer", consumer="producer")
    consumer = make_queue(cfg, stream="experience", group="trainer", consumer="trainer-0")
    await consumer.depth()
    return producer, consumer


async def test_a_rejected_candidates_samples_are_held_judged_and_dropped_never_trained(broker):
    producer, consumer = await _experience(broker)
    pub = _publisher(0, 1, promote_after_samples=4)  # v1 is the candidate at the canary
    gate = CanaryGate(pub.cfg.rollout, pub, batch_samples=4)
    intake = QueueIntake(consumer, train_batch_size=2, max_staleness=2, poll_s=0.2, gate=gate)
    await producer.put([_group("c0", 1), _group("c1", 1), _group("p0", 0), _group("p1", 0), _group("p2", 0)])

    pending = await intake.next_batch(1, timeout=10)
    # c0 and c1 (4 samples of v1) were held, then judged together: the batch closes at once
    spec = pending.data.meta_info[META_KEY]
    assert spec["version"] == 1 and spec["measurements"]["samples"] == 4.0
    assert list(pending.data.non_tensor_batch["uid"]) == ["c0", "c0", "c1", "c1"]

    # the step: the trainer's probabilities of the candidate's tokens are far from the replica's
    b = pending.data.batch
    b["old_log_probs"] = b["rollout_log_probs"] - 3.0
    verdict, removed = judge(pending.data, spec, current_version=1, max_staleness=2)
    assert not verdict["promoted"] and removed.tolist() == [True] * 4
    pending.remove(removed, rejected=True)
    gate.decide(verdict)
    assert pub.rollout.rejected.keys() == {1} and pub.rollout.candidate is None
    await intake.commit(pending)
    c = intake.counters
    assert (c.samples_trained, c.dropped_rejected, c.dropped_stale) == (0, 4, 4)  # dropped for its version
    assert await consumer.stages(["c0/0", "c1/1"]) == {"c0/0": "dropped", "c1/1": "dropped"}
    assert pending.staleness == []

    pending = await intake.next_batch(1, timeout=10)  # the promoted samples train
    assert list(pending.data.non_tensor_batch["uid"]) == ["p0", "p0", "p1", "p1"]
    assert META_KEY not in pending.data.meta_info
    await intake.commit(pending)
    # a sample of v1 that arrives later is dropped as it turns up
    await producer.put([_group("c2", 1), _group("p3", 0)])
    pending = await intake.next_batch(1, timeout=10)
    assert list(pending.data.non_tensor_batch["uid"]) == ["p2", "p2", "p3", "p3"]
    await intake.commit(pending)
    assert await consumer.stages(["c2/0", "c2/1", "p3/0"]) == {"c2/0": "dropped", "c2/1": "dropped",
                                                               "p3/0": "trained"}
    assert await consumer.depth() == 0
    assert (c.samples_trained, c.dropped_rejected, c.dropped_stale) == (8, 6, 6)
    await producer.close()
    await consumer.close()


async def test_a_promoted_candidates_samples_are_trained_and_the_next_version_is_the_next_candidate(broker):
    producer, consumer = await _experience(broker)
    pub = _publisher(0, 3, promote_after_samples=2)
    gate = CanaryGate(pub.cfg.rollout, pub, batch_samples=4)
    intake = QueueIntake(consumer, train_batch_size=2, max_staleness=4, poll_s=0.2, gate=gate)
    await producer.put([_group("c0", 3), _group("p0", 0), _group("c1", 3), _group("p1", 0)])
    pending = await intake.next_batch(4, timeout=10)
    spec = pending.data.meta_info[META_KEY]
    assert list(pending.data.non_tensor_batch["uid"]) == ["p0", "p0", "c0", "c0"]
    b = pending.data.batch
    b["old_log_probs"] = b["rollout_log_probs"] - 0.001
    verdict, removed = judge(pending.data, spec, current_version=4, max_staleness=4)
    assert verdict["promoted"] and not bool(removed.any())
    gate.decide(verdict)
    await intake.commit(pending)
    assert pub.rollout.promoted == 3 and pub.rollout.wants_next()
    pending = await intake.next_batch(4, timeout=10)  # c1, held while c0 was judged, now trains
    assert sorted(set(pending.data.non_tensor_batch["uid"])) == ["c1", "p1"] and META_KEY not in pending.data.meta_info
    assert pending.staleness == [1, 1, 4, 4]
    await intake.commit(pending)
    assert intake.counters.dropped_rejected == 0 and intake.counters.samples_trained == 8
    assert await consumer.depth() == 0
    await producer.close()
    await consumer.close()


async def test_a_candidate_with_too_many_rollout_errors_is_rejected_at_the_intake(broker):
    import numpy as np

    producer, consumer = await _experience(broker)
    pub = WeightPublisher(WeightChannelConfig(control_port=0, rollout={
        "mode": "canary", "promote_after_samples": 4, "max_error_rate_increase": 0.25}))
    pub.rollout.routed(0, "promote")
    pub.rollout.routed(1, "canaries")
    gate = CanaryGate(pub.cfg.rollout, pub, batch_samples=4)
    intake = QueueIntake(consumer, train_batch_size=2, max_staleness=2, poll_s=0.2, gate=gate)
    broken = [_group(f"c{i}", 1) for i in range(2)]
    for g in broken:
        g.non_tensor_batch["error"] = np.array(["vllm: engine error", ""], dtype=object)
    await producer.put([_group("p0", 0), *broken, _group("p1", 0)])
    pending = await intake.next_batch(1, timeout=10)
    assert pending.data is None, "decided at the intake: nothing to train, the trainer offers a new candidate"
    assert pub.rollout.rejected[1].startswith("error rate 0.500 vs promoted 0.000")
    assert [e.kind for e in pub.rollout.events][-1] == "rejected"
    pending = await intake.next_batch(1, timeout=10)  # p0 went back to the backlog: nothing lost
    assert list(pending.data.non_tensor_batch["uid"]) == ["p0", "p0", "p1", "p1"]
    await intake.commit(pending)
    assert await consumer.stages(["c0/0", "c1/1", "p0/0"]) == {"c0/0": "dropped", "c1/1": "dropped",
                                                               "p0/0": "trained"}
    assert (intake.counters.dropped_rejected, intake.counters.samples_trained) == (4, 4)
    await producer.close()
    await consumer.close()


async def test_a_trainer_max_staleness_past_the_promoted_version_waits_for_the_verdict(broker):
    """Another step before the verdict would make every promoted replica's sample stale: the
    promoted items are kept for the judging batch (and trained there) instead, up to the
    park limit; past it the trainer takes them as usual (it never waits for ever)."""
    producer, consumer = await _experience(broker)
    pub = _publisher(0, 1, promote_after_samples=4)
    gate = CanaryGate(pub.cfg.rollout, pub, batch_samples=8, max_staleness=2, park_limit=2)
    intake = QueueIntake(consumer, train_batch_size=4, max_staleness=2, poll_s=0.2, gate=gate)
    await producer.put([_group("p0", 0), _group("p1", 0), _group("p2", 0), _group("c0", 1), _group("c1", 1)])
    pending = await intake.next_batch(2, timeout=10)  # v2 - v0 = max_staleness: wait for v1's verdict
    spec = pending.data.meta_info[META_KEY]
    # p0, p1 parked (the limit: 2), p2 past it taken as usual; c0 and c1 held, then judged with
    # a parked group (the batch's room: 3 groups, the candidate's first; p1 waits for the verdict)
    assert spec["version"] == 1
    assert list(pending.data.non_tensor_batch["uid"]) == ["p2", "p2", "c0", "c0", "c1", "c1", "p0", "p0"]
    b = pending.data.batch
    b["old_log_probs"] = b["rollout_log_probs"] - 0.001
    verdict, removed = judge(pending.data, spec, current_version=2, max_staleness=2)
    assert verdict["promoted"] and verdict["measurements"]["promoted_logprob_gap"] == pytest.approx(0.001, abs=1e-5)
    gate.decide(verdict)
    await intake.commit(pending)
    assert pending.staleness == [2, 2, 1, 1, 1, 1, 2, 2]
    await producer.put([_group(f"q{i}", 1) for i in range(4)])
    # p1, released by the verdict, is screened again: v0 is now 3 versions behind (the cost of
    # the judging batch's room), dropped as stale
    pending = await intake.next_batch(3, timeout=10)
    assert list(pending.data.non_tensor_batch["uid"]) == ["q0", "q0", "q1", "q1", "q2", "q2", "q3", "q3"]
    await intake.commit(pending)
    assert await consumer.depth() == 0 and intake.counters.dropped_stale == 2 and intake.counters.samples_trained == 16
    await producer.close()
    await consumer.close()


async def test_at_max_staleness_1_parked_groups_leave_room_for_a_batch_beside_a_short_candidate(broker):
    """``max_staleness: 1`` (the quick start's): the feeder admits two batches' prompts, and
    held or parked groups are unfinished, so they take room in that window. The candidate is
    one group short of being judged and the window is full: parking half the window (the
    first rule) left three groups to a four-group batch, and the trainer waited for ever.
    The park limit leaves room for a whole batch beside the candidate's groups."""
    producer, consumer = await _experience(broker)
    pub = _publisher(0, 1, promote_after_samples=4)
    batch_groups, window = 4, 8  # (max_staleness + 1) * train_batch_size
    limit = park_limit(window, batch_groups, needed_groups=2)  # 4 samples of groups of 2
    assert limit == 2
    gate = CanaryGate(pub.cfg.rollout, pub, batch_samples=8, max_staleness=1, park_limit=limit)
    intake = QueueIntake(consumer, train_batch_size=batch_groups, max_staleness=1, poll_s=0.2, gate=gate)
    # the whole window: one group of the candidate, seven of the promoted version
    await producer.put([_group("c0", 1)] + [_group(f"p{i}", 0) for i in range(7)])
    pending = await intake.next_batch(1, timeout=5)  # p0, p1 parked; a batch of promoted groups
    assert META_KEY not in pending.data.meta_info
    assert list(pending.data.non_tensor_batch["uid"]) == ["p2", "p2", "p3", "p3", "p4", "p4", "p5", "p5"]
    await intake.commit(pending)
    # the room the step freed: the canary's next group completes the candidate's samples
    await producer.put([_group("c1", 1)])
    pending = await intake.next_batch(1, timeout=5)
    assert pending.data.meta_info[META_KEY]["version"] == 1
    assert list(pending.data.non_tensor_batch["uid"]) == ["p6", "p6", "c0", "c0", "c1", "c1", "p0", "p0"]
    await intake.commit(pending)
    await producer.close()
    await consumer.close()


async def test_the_judging_batch_is_topped_up_with_the_groups_at_hand_without_waiting(broker):
    """The candidate becomes judgeable while the batch is short (here a stale group took a
    lease's slot): the batch takes the candidate's groups, then what the queue has now, and
    closes -- a full batch, not the candidate's groups alone. With nothing at hand it closes
    with what it has rather than wait."""
    producer, consumer = await _experience(broker)
    pub = _publisher(2, 3, promote_after_samples=2)
    gate = CanaryGate(pub.cfg.rollout, pub, batch_samples=4, max_staleness=3, park_limit=0)
    intake = QueueIntake(consumer, train_batch_size=2, max_staleness=3, poll_s=5.0, gate=gate)
    await producer.put([_group("s0", 0), _group("c0", 3), _group("p0", 2)])
    pending = await intake.next_batch(4, timeout=10)  # the first lease: s0 (4 versions behind: dropped), c0 held
    assert pending.data.meta_info[META_KEY]["version"] == 3
    assert list(pending.data.non_tensor_batch["uid"]) == ["c0", "c0", "p0", "p0"]
    assert pending.dropped_stale == 2
    gate.decide({"version": 3, "promoted": True, "reason": "", "measurements": {}})
    await intake.commit(pending)
    pub.rollout.routed(4, "canaries")
    await producer.put([_group("s1", 0), _group("c1", 4)])
    pending = await intake.next_batch(4, timeout=10)
    assert list(pending.data.non_tensor_batch["uid"]) == ["c1", "c1"]  # nothing else at hand
    await intake.commit(pending)
    await producer.close()
    await consumer.close()


async def test_a_judging_batch_fills_like_any_other_while_the_window_has_room_for_it(broker):
    """With room in the admission window for a whole batch beside what the gate still holds,
    the judging batch waits for its groups as any batch does (a short judging step would
    train less and spend a version of the staleness budget for it)."""
    producer, consumer = await _experience(broker)
    pub = _publisher(2, 3, promote_after_samples=2)
    gate = CanaryGate(pub.cfg.rollout, pub, batch_samples=6, max_staleness=3, park_limit=0, window=6)
    assert gate.can_fill(3)
    intake = QueueIntake(consumer, train_batch_size=3, max_staleness=3, poll_s=0.2, gate=gate)
    await producer.put([_group("s0", 0), _group("c0", 3), _group("p0", 2)])
    task = asyncio.ensure_future(intake.next_batch(4, timeout=30))
    for _ in range(50):  # until the intake took the three items (s0 dropped, c0 judged, p0 in the batch)
        await asyncio.sleep(0.1)
        if gate.candidate is not None and gate.candidate.judging:
            break
    await asyncio.sleep(0.5)  # a few polls of the queue
    assert gate.candidate.judging and not task.done(), "the judging batch closed short although the window had room"
    await producer.put([_group("p1", 2)])
    pending = await task
    assert pending.data.meta_info[META_KEY]["version"] == 3
    assert sorted(set(pending.data.non_tensor_batch["uid"])) == ["c0", "p0", "p1"]
    await intake.commit(pending)
    await producer.close()
    await consumer.close()


def test_a_candidate_judged_at_lag_0_is_compared_with_the_promoted_versions_own_lag_0_gap():
    """Judged with its own weights (lag 0), a candidate's gap is how the canary served them;
    it is compared with the gap the promoted version had when it was judged the same way,
    not with older rows' gap, which holds the policy's change since (here 0.5 nats: a
    serving error of 0.3 would hide under it). Judged at a lag, the reference is ignored."""
    data = DataProto.concat([_group("c0", 3), _group("c1", 3), _group("p0", 1)])
    b = data.batch
    cand = b["policy_version"].long().reshape(-1) == 3
    b["rollout_log_probs"] = torch.zeros_like(b["response_mask"], dtype=torch.float32)
    b["old_log_probs"] = torch.where(cand[:, None], torch.tensor(0.3), torch.tensor(0.5))  # the current weights
    own = torch.where(cand[:, None], torch.tensor(0.3), torch.tensor(0.0))  # v3's own weights: 0.3 off, a fault
    spec = {"version": 3, "max_logprob_gap_increase": 0.1, "promoted_logprob_gap": None, "reference_gap": 0.01}
    verdict, removed = judge(data, spec, current_version=4, max_staleness=2, judged=(own, 0))
    assert not verdict["promoted"] and bool(removed[cand].all())
    assert verdict["measurements"]["judged_lag"] == 0 and verdict["measurements"]["reference_logprob_gap"] == 0.01
    assert "promoted version's own (lag 0) 0.0100" in verdict["reason"]
    # the same gap judged with the current weights (lag 1): against the promoted rows' 0.5, passed
    verdict, removed = judge(data, spec, current_version=4, max_staleness=2)
    assert verdict["promoted"] and verdict["measurements"]["judged_lag"] == 1 and not bool(removed.any())
    assert "reference_logprob_gap" not in verdict["measurements"]
