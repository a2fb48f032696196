"""The canary gate sizes itself in the job's views (docs/weights.md, "How the canary sizes
itself"): at the quick start's settings canary mode runs with the budget, window and judging
sample count measured to keep 0.9 of mode ``all``'s throughput; a value the user set wins;
the gate's group count is computed in one place and read by the trainer and the replicas."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.config.job import load_job
from services.config.views import CANARY_GATE_VERSIONS, canary_groups, derive_views, size_canary
from services.config.weights import RolloutGateConfig

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
CANARY = ("weights.rollout.mode=canary", "services.rollout.replicas=2")


def views(*overrides: str):
    return derive_views(load_job(QUICKSTART, [*CANARY, *overrides]))


def test_at_the_quick_starts_defaults_canary_mode_runs_with_the_sized_settings():
    job = load_job(QUICKSTART, CANARY)
    assert (job.async_.max_staleness, job.data.train_batch_size, job.rollout.n) == (1, 32, 16)
    v = derive_views(job)
    t, f, r = v["trainer"], v["feeder"], v["rollout"]
    # what `bench/canary.py --job quickstart --staleness 4 --set async.max_in_flight=64 --promote-after 64` set by hand
    assert t.async_.max_staleness == 4
    assert t.async_.max_in_flight == 64 and f.max_in_flight == 64
    assert t.weights.rollout.promote_after_samples == 64 == r.weights.rollout.promote_after_samples
    # the feeder keeps the user's budget: its window is what max_staleness 1 gives, not the trainer's 4
    assert f.async_.max_staleness == 1
    # four groups of 16: what the canary keeps in reserve and what the trainer's park limit leaves room for
    assert r.rollout.canary_reserve_groups == 4 == t.canary_groups


def test_mode_all_is_not_sized():
    v = derive_views(load_job(QUICKSTART, ["services.rollout.replicas=2"]))
    t = v["trainer"]
    assert (t.async_.max_staleness, t.async_.max_in_flight, t.weights.rollout.promote_after_samples) == (1, None, None)
    assert v["rollout"].rollout.canary_reserve_groups == 0
    assert size_canary(load_job(QUICKSTART, ["services.rollout.replicas=2"])) is None


@pytest.mark.parametrize("overrides, budget, window, promote, groups", [
    # the queue's share: the window's depth in batches (two at max_staleness 1) or max_staleness, whichever is more
    (("async.max_staleness=3",), 3 + 1 + CANARY_GATE_VERSIONS, 128, 64, 4),
    (("async.max_staleness=3", "async.max_in_flight=64"), 3 + CANARY_GATE_VERSIONS, 64, 64, 4),
    (("async.max_in_flight=48",), 2 + CANARY_GATE_VERSIONS, 48, 64, 4),  # 48 prompts: 1.5 batches, two versions
    # explicit settings win
    (("weights.rollout.promote_after_samples=40",), 4, 64, 40, 3),  # 40 samples: two groups and a half
    (("weights.rollout.staleness_budget=1",), 1, 64, 64, 4),
    (("weights.rollout.staleness_budget=7", "async.max_in_flight=32"), 7, 32, 64, 4),
    # at most a batch: 4 groups of 16 is more than a batch of 2 prompts
    (("data.train_batch_size=2", "actor.ppo_mini_batch_size=2"), 1 + 1 + CANARY_GATE_VERSIONS, 4, 32, 2),
])
def test_a_value_the_user_set_wins_and_the_rest_follows_from_it(overrides, budget, window, promote, groups):
    v = views(*overrides)
    t, f, r = v["trainer"], v["feeder"], v["rollout"]
    assert t.async_.max_staleness == budget
    assert t.async_.max_in_flight == window == f.max_in_flight
    assert t.weights.rollout.promote_after_samples == promote == r.weights.rollout.promote_after_samples
    assert t.canary_groups == groups == r.rollout.canary_reserve_groups


def test_the_group_count_rounds_a_partial_group_up():
    assert canary_groups(RolloutGateConfig(mode="canary", promote_after_samples=17), 8, 16) == 2
    assert canary_groups(RolloutGateConfig(mode="canary", promote_after_samples=16), 8, 16) == 1
    assert canary_groups(RolloutGateConfig(mode="canary"), 8, 4) == 4  # unset: half a batch (16 samples)
