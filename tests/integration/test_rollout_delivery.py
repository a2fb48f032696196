"""The replica's delivery path over a real queue (the embedded gRPC broker process):
finished items are written in batches, and a failed write loses nothing.

The engine is not involved: these tests hand the replica already-packed groups, so they
run in a second and need no vLLM.
"""

from __future__ import annotations

import asyncio

import numpy as np

from services.config.queues import parse_queue_config


def _prompt_item(uid: str):
    from services.protocol import DataProto

    col = np.empty(1, dtype=object)
    col[0] = [1, 2, 3]
    return DataProto.from_dict(non_tensors={"raw_prompt_ids": col, "uid": np.array([uid], dtype=object),
                                            "sample_id": np.array([uid], dtype=object)}, meta_info={"n": 2})


def _group(uid: str):
    import torch

    from services.protocol import DataProto

    return DataProto.from_dict(tensors={"responses": torch.arange(4).view(2, 2)},
                               non_tensors={"uid": np.array([uid] * 2, dtype=object),
                                            "sample_id": np.array([f"{uid}/0", f"{uid}/1"], dtype=object)})


def _replica(prompts, rollouts):
    from rollout_svc.replica import Replica
    from services.config.rollout import RolloutConfig

    return Replica(None, RolloutConfig(), name="r0", prompts=prompts, rollouts=rollouts)


async def _run_replica(replica, middle):
    """Run ``replica``'s loop until ``middle(replica)`` returns, then stop it; returns what
    ``middle`` returned."""
    stop = asyncio.Event()
    run = asyncio.create_task(replica.run(stop))
    seen = await middle(replica)
    stop.set()
    await asyncio.wait_for(run, timeout=30)
    return seen


async def _drain(sink, prompts, queues):
    """What the replica delivered, the prompts left unacknowledged; closes ``queues``."""
    got = await sink.get(max_items=20, timeout=5.0)
    depth = await prompts.depth()
    for q in queues:
        await q.close()
    return got, depth


def _queues(address: str, **rollouts_cfg):
    from services.queues import make_queue

    qcfg = parse_queue_config({"type": "embedded", "address": address})
    out_cfg = parse_queue_config({"type": "embedded", "address": address, **rollouts_cfg})
    return (make_queue(qcfg, stream="prompts", group="rollout", consumer="feeder"),
            make_queue(qcfg, stream="prompts", group="rollout", consumer="r0"),
            make_queue(out_cfg, stream="rollouts", group="reward", consumer="r0-out"),
            make_queue(qcfg, stream="rollouts", group="reward", consumer="reader"))


def test_items_finished_together_are_written_in_one_put(broker) -> None:
    async def scenario():
        feeder, prompts, rollouts, sink = _queues(broker.address)
        await feeder.put([_prompt_item(f"p{i}") for i in range(10)])
        leased = await prompts.get(max_items=10, timeout=5.0)
        assert len(leased) == 10
        replica = _replica(prompts, rollouts)
        calls = []
        real_put = rollouts.put

        async def spy_put(items, **kw):  # the real put runs; we only record its batch size
            calls.append(len(items))
            return await real_put(items, **kw)

        rollouts.put = spy_put
        await asyncio.wait_for(asyncio.gather(*(replica._deliver(it, [_group(f"p{i}")])
                                                for i, it in enumerate(leased))), timeout=30)
        got = await sink.get(max_items=20, timeout=5.0)
        depth = await prompts.depth()
        for q in (feeder, prompts, rollouts, sink):
            await q.close()
        return calls, got, depth

    calls, got, depth = asyncio.run(scenario())
    assert calls == [10]  # all ten finished in the same tick: one write, not ten
    assert sorted(g.data.non_tensor_batch["uid"][0] for g in got) == sorted(f"p{i}" for i in range(10))
    assert depth == 0  # and every prompt item was acknowledged after it


def test_a_failed_write_keeps_every_item_leased(broker) -> None:
    """rollouts is full (max_depth 1, nobody reading): the write fails at its deadline, each
    waiting item gets the error and stays leased on ``prompts`` for a retry."""
    from services.queues import QueueFullError

    async def scenario():
        feeder, prompts, rollouts, sink = _queues(broker.address, max_depth=1, put_timeout_s=0.5)
        await rollouts.put([_group("filler")])  # the stream is now at max_depth
        await feeder.put([_prompt_item(f"p{i}") for i in range(3)])
        leased = await prompts.get(max_items=3, timeout=5.0)
        replica = _replica(prompts, rollouts)
        res = await asyncio.wait_for(asyncio.gather(*(replica._deliver(it, [_group(f"p{i}")])
                                                      for i, it in enumerate(leased)), return_exceptions=True),
                                     timeout=30)
        depth = await prompts.depth()
        for q in (feeder, prompts, rollouts, sink):
            await q.close()
        return res, depth

    res, depth = asyncio.run(scenario())
    assert len(res) == 3 and all(isinstance(r, QueueFullError) for r in res), res
    assert depth == 3  # nothing acknowledged: all three are reclaimed and generated again


def test_an_own_lease_handed_back_while_its_group_generates_is_not_generated_twice(broker) -> None:
    """Generation outlasts ``lease_idle_s`` (a loaded machine, a long weight update): the
    replica's own get hands the same prompt item back to it. It must not start that group a
    second time; the first generation delivers and acks it."""
    from rollout_svc.replica import Replica
    from services.config.rollout import RolloutConfig

    class SlowReplica(Replica):
        calls: list[str] = []

        async def generate_item(self, data):  # the engine's place: slower than the lease
            uid = str(data.non_tensor_batch["uid"][0])
            self.calls.append(uid)
            await asyncio.sleep(2.0)
            return [_group(uid)]

    async def scenario():
        from services.queues import make_queue

        feeder, _, rollouts, sink = _queues(broker.address)
        prompts = make_queue(parse_queue_config({"type": "embedded", "address": broker.address, "lease_idle_s": 0.5}),
                             stream="prompts", group="rollout", consumer="r0")
        await feeder.put([_prompt_item(f"p{i}") for i in range(3)])
        replica = SlowReplica(None, RolloutConfig(lease_timeout_s=0.2), name="r0", prompts=prompts, rollouts=rollouts)
        await _run_replica(replica, lambda _: asyncio.sleep(4.0))  # several reclaim rounds meanwhile
        got, depth = await _drain(sink, prompts, (feeder, prompts, rollouts, sink))
        return replica.calls, got, depth

    calls, got, depth = asyncio.run(scenario())
    assert sorted(calls) == ["p0", "p1", "p2"], calls  # each prompt generated once
    assert sorted(g.data.non_tensor_batch["uid"][0] for g in got) == ["p0", "p1", "p2"]
    assert depth == 0


class _Versioned:
    """The engine's one property these tests read: the policy version it serves."""

    version = 0


def _recording_replica(cfg, prompts, rollouts):
    from rollout_svc.replica import Replica

    class Recording(Replica):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.started: dict[str, int] = {}  # uid -> the version served when its generation began

        async def generate_item(self, data):
            uid = str(data.non_tensor_batch["uid"][0])
            self.started[uid] = self.engine.version
            await asyncio.sleep(0.05)
            return [_group(uid)]

    return Recording(_Versioned(), cfg, name="r0", prompts=prompts, rollouts=rollouts)


async def _canary_run(address: str, uids: list[str], reserve: int, canary: bool, middle):
    """Run a recording replica over ``uids`` until ``middle(replica)`` returns (what it returns
    comes back first), then stop it; also returns the versions each group started with, the
    uids delivered and the prompts left unacknowledged."""
    from services.config.rollout import RolloutConfig

    feeder, prompts, rollouts, sink = _queues(address)
    await feeder.put([_prompt_item(u) for u in uids])
    replica = _recording_replica(RolloutConfig(lease_timeout_s=0.2, canary_reserve_groups=reserve), prompts, rollouts)
    replica.weights_canary = canary
    seen = await _run_replica(replica, middle)
    got, depth = await _drain(sink, prompts, (feeder, prompts, rollouts, sink))
    return seen, replica.started, sorted(g.data.non_tensor_batch["uid"][0] for g in got), depth


def test_a_canary_keeps_groups_for_its_next_version_and_starts_them_when_it_loads(broker) -> None:
    """Canary mode: once a canary started ``canary_reserve_groups`` groups with the version it
    serves, it keeps as many more leased and unstarted, and starts them the moment it loads
    the next version (a candidate is judged on its first groups, and on a trainer-bound job
    there would be no prompt left to make them with); past that it generates as usual. A
    replica that is not a canary keeps nothing."""

    async def next_version(replica):
        await asyncio.sleep(1.0)
        before = dict(replica.started)
        replica.engine.version = 1  # the next version is loaded; the subscriber says so
        replica.weights_loaded()
        await asyncio.sleep(1.0)
        return before

    uids = [f"p{i}" for i in range(6)]
    before, started, delivered, depth = asyncio.run(_canary_run(broker.address, uids, 2, True, next_version))
    assert before == {"p0": 0, "p1": 0, "p4": 0, "p5": 0}, before  # p2, p3 kept for the next version
    assert started == {**before, "p2": 1, "p3": 1}, started
    assert delivered == uids and depth == 0
    uids = [f"q{i}" for i in range(6)]  # (new ids: the broker dedupes)
    before, started, delivered, depth = asyncio.run(_canary_run(broker.address, uids, 2, False, next_version))
    assert before == {u: 0 for u in uids} and delivered == uids and depth == 0


def test_groups_a_canary_kept_are_made_anyway_when_no_version_comes(broker, monkeypatch) -> None:
    """A paused rollout or a slow trainer: no next version comes, and the kept groups are made
    with the version served once ``RESERVE_MAX_S`` has passed (their leases never idle out)."""
    from rollout_svc import replica as replica_mod

    monkeypatch.setattr(replica_mod, "RESERVE_MAX_S", 0.5)

    async def no_version(replica):
        await asyncio.sleep(0.3)
        early = dict(replica.started)
        await asyncio.sleep(1.5)
        return early

    uids = ["r0", "r1", "r2"]
    early, started, delivered, depth = asyncio.run(_canary_run(broker.address, uids, 1, True, no_version))
    assert early == {"r0": 0, "r2": 0}, early  # r1 kept
    assert started == {"r0": 0, "r1": 0, "r2": 0} and delivered == uids and depth == 0
