"""The job ledger's end-of-job audit against a real broker's per-sample ledger."""

from __future__ import annotations

import json

from services.config.queues import EmbeddedQueueConfig
from services.ledger import Ledger, audit
from services.queues import make_queue


async def test_the_audit_finds_lost_and_twice_trained_samples(broker):
    q = make_queue(EmbeddedQueueConfig(address=broker.address, op_timeout_s=5.0), stream="experience",
                   group="trainer", consumer="controller")
    await q.record_stage(["p0"], "queued")
    await q.record_stage(["p0/0", "p0/1"], "trained")
    await q.record_stage(["p1"], "queued")  # fed, not generated yet: in flight
    await q.record_stage(["p2/0"], "trained")
    await q.record_stage(["p2/1"], "dropped")
    # p3 was fed but left no trace at all: lost
    got = await audit(q, ["p0", "p1", "p2", "p3"], n=2, trained_count=3)
    assert got["stages"] == {"trained": 3, "queued": 2, "dropped": 1, "lost": 2}
    assert got["lost"] == 2 and got["trained_twice"] == 0 and got["trained_ids"] == 3
    # the trainer counted 5 trained samples for 3 distinct ids: 2 were trained twice
    assert (await audit(q, ["p0", "p2"], n=2, trained_count=5))["trained_twice"] == 2
    await q.close()


def test_the_trainers_final_counters_come_from_its_last_checkpoint(tmp_path):
    ckpt = tmp_path / "checkpoints"
    (ckpt / "global_step_3").mkdir(parents=True)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("3")
    (ckpt / "global_step_3" / "state.json").write_text(json.dumps({"step": 3, "extra": {"intake": {
        "samples_trained": 40, "samples_nonfinite": 8, "dropped_stale": 4, "dropped_error": 2, "scored_failed": 5}}}))
    ledger = Ledger(tmp_path, n=4)
    ledger.prompts_fed = 16
    assert ledger.read_checkpoint(ckpt)
    c = ledger.counts()
    assert (c["trained"], c["failed"], c["dropped_stale"], c["dropped_error"]) == (48, 5, 4, 2)
    assert c["in_flight"] == 64 - 48 - 4 - 2
    assert not Ledger(tmp_path, n=4).read_checkpoint(tmp_path / "none")
