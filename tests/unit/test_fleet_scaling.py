"""The fleet's scaling policy and its signals (fleet_svc/scaling.py), the spec's bounds and
the files the scaling reads and writes (services/fleets.py): fast, no process started."""

from __future__ import annotations

import json
import os
import time

import pytest
from pydantic import ValidationError

from fleet_svc.scaling import BacklogPolicy, FleetSignals, SignalReader
from services.config.fleet import FleetScaling, FleetSpec
from services.fleets import FleetDir, JobLoad, job_load


def _policy(**kw) -> BacklogPolicy:
    return BacklogPolicy(**{"up_backlog": 4, "down_backlog": 0.5, "up_after_s": 6, "down_after_s": 20,
                            "cooldown_s": 20, **kw})


def _run(policy, readings, lo=1, hi=3, start=1):
    """Feed (t, backlog, jobs[, wait]) readings; carry out each decision at once; the changes."""
    serving, changes = start, []
    for t, backlog, jobs, *wait in readings:
        d = policy.decide(FleetSignals(now=t, serving=serving, jobs=jobs, backlog=backlog,
                                       trainer_wait=wait[0] if wait else 0.0), lo, hi)
        if d.action != "hold":
            serving += d.count if d.action == "add" else -d.count
            policy.changed(t)
            changes.append((t, d.action, d.reason, serving))
    return changes


def test_a_backlog_adds_a_replica_once_its_mean_over_up_after_s_is_high():
    p = _policy()
    # high from t=0: not before the readings cover up_after_s (6 s)
    assert _run(p, [(t, 10, 2) for t in range(0, 6)]) == []
    assert _run(_policy(), [(t, 10, 2) for t in range(0, 7)]) == [(6, "add", "backlog_high", 2)]
    # a sawtooth (a job's window refilling after each step) counts by its mean: 0/12 -> 6 >= 4
    saw = [(t, 12 if t % 2 else 0, 2) for t in range(0, 7)]
    assert _run(_policy(), saw) == [(6, "add", "backlog_high", 2)]
    # one spike does not: 20 groups at one reading of seven is a mean of 2.9
    spike = [(t, 20 if t == 3 else 0, 2) for t in range(0, 30)]
    assert _run(_policy(), spike) == []
    # no job: nothing to add for, whatever the files said last
    assert _run(_policy(), [(t, 10, 0) for t in range(0, 7)]) == []


def test_the_cool_down_allows_one_change_per_cooldown_s():
    p = _policy(up_after_s=0, cooldown_s=20)
    changes = _run(p, [(t, 100, 3) for t in range(0, 61)], hi=5)
    assert [c[0] for c in changes] == [0, 20, 40, 60]
    assert [c[3] for c in changes] == [2, 3, 4, 5]
    # at max it holds however long the backlog stays
    assert _run(p, [(t, 100, 3) for t in range(61, 200)], hi=5, start=5) == []


def test_a_low_backlog_drains_one_replica_after_down_after_s_unless_a_trainer_is_starved():
    assert _run(_policy(), [(t, 0, 1) for t in range(0, 21)], start=2) == [(20, "remove", "backlog_low", 1)]
    # the trainer waits most of the time: the replicas are the bottleneck, none is drained
    assert _run(_policy(), [(t, 0, 1, 0.8) for t in range(0, 60)], start=2) == []
    # never below min
    assert _run(_policy(), [(t, 0, 1) for t in range(0, 100)], lo=2, start=2) == []


def test_no_job_attached_returns_to_min_in_one_decision():
    changes = _run(_policy(), [(t, 0, 0) for t in range(0, 30)], lo=1, hi=4, start=4)
    assert changes == [(20, "remove", "idle", 1)]


def test_out_of_bounds_is_corrected_at_once_and_a_change_in_progress_holds():
    p = _policy()
    assert p.decide(FleetSignals(now=0, serving=1, jobs=1), 2, 3).reason == "below_min"
    assert p.decide(FleetSignals(now=0, serving=3, jobs=1), 1, 2).reason == "above_max"
    d = p.decide(FleetSignals(now=0, serving=1, changing=1, jobs=3, backlog=100), 1, 3)
    assert d.action == "hold" and "starting or draining" in d.reason

    # the cool-down counts from the end of a change: a replica that took 60 s to start is not
    # drained the moment it serves, on readings taken while it started
    p = _policy(up_after_s=0, down_after_s=5, cooldown_s=10)
    assert p.decide(FleetSignals(now=0, serving=1, jobs=1, backlog=100), 1, 3).action == "add"
    p.changed(0)
    for t in range(1, 60):
        assert p.decide(FleetSignals(now=t, serving=1, changing=1, jobs=1, backlog=0), 1, 3).action == "hold"
    held = [p.decide(FleetSignals(now=t, serving=2, jobs=1, backlog=0), 1, 3) for t in range(60, 69)]
    assert all(d.action == "hold" for d in held)
    assert p.decide(FleetSignals(now=70, serving=2, jobs=1, backlog=0), 1, 3).reason == "backlog_low"


def test_an_oscillating_backlog_never_flaps():
    """A backlog swinging every 4 s: between 0 and 6 its mean (3) lies between the thresholds
    and nothing changes; between 0 and 10 (mean 5) one replica is added, after which the mean
    per replica (2.5) lies between them again: one change, never back and forth. And with no
    time to hold, changes still stay a cool-down apart."""
    assert _run(_policy(), [(t, 6 if (t // 4) % 2 else 0, 2) for t in range(0, 300)], start=1) == []
    changes = _run(_policy(), [(t, 10 if (t // 4) % 2 else 0, 2) for t in range(0, 300)], start=1)
    assert [(c[1], c[2], c[3]) for c in changes] == [("add", "backlog_high", 2)]
    p = _policy(up_after_s=0, down_after_s=0, cooldown_s=15)
    changes = _run(p, [(t, 10 if (t // 3) % 2 else 0, 2) for t in range(0, 300)], start=2)
    assert changes, "with no hysteresis time it does change"
    assert all(b[0] - a[0] >= 15 for a, b in zip(changes, changes[1:]))


def test_signals_sum_the_jobs_and_rate_their_counters():
    r = SignalReader()
    wall = 1000.0
    loads = {"a": JobLoad(time=wall, prompts=10, leased=4, trainer_wait_s=5, dropped_stale=0),
             "b": JobLoad(time=wall, prompts=3, leased=3), "c": None}
    s = r.read(loads, now=1, wall=wall, serving=2, changing=0)
    assert (s.jobs, s.backlog, s.backlog_per_replica, s.trainer_wait) == (3, 13, 6.5, 0)
    loads["a"] = JobLoad(time=wall + 4, prompts=10, leased=4, trainer_wait_s=7, dropped_stale=8)
    s = r.read(loads, now=5, wall=wall + 4, serving=2, changing=0)
    assert s.trainer_wait == pytest.approx(0.5) and s.dropped_stale_per_s == pytest.approx(2.0)
    s = r.read(loads, now=6, wall=wall + 5, serving=2, changing=0)  # unchanged file: the rate is kept
    assert s.trainer_wait == pytest.approx(0.5)
    # a load older than LOAD_FRESH_S (its controller is gone) is not counted
    s = r.read(loads, now=60, wall=wall + 60, serving=2, changing=0)
    assert s.backlog == 0 and s.jobs == 3
    assert job_load({"time": 1, "prompts": "x"}) is None and job_load(None) is None
    assert job_load({"time": 1, "prompts": 2, "version": 3.0, "other": 1}) == JobLoad(time=1, prompts=2, version=3)


def _spec(**kw) -> dict:
    return {"name": "f", "model": {"path": "/m", "lora_rank": 8},
            "rollout": {"prompt_length": 16, "response_length": 8}, **kw}


def test_the_spec_bounds_the_replicas():
    spec = FleetSpec(**_spec(replicas=1, scaling={"min_replicas": 1, "max_replicas": 3}))
    assert spec.elastic and spec.replica_names() == ["rollout-0", "rollout-1", "rollout-2"]
    fixed = FleetSpec(**_spec(replicas=2))
    assert not fixed.elastic and fixed.replica_names() == ["rollout-0", "rollout-1"]
    with pytest.raises(ValidationError, match=r"replicas \(4\) must lie within scaling.min_replicas \(1\) and "
                                              r"scaling.max_replicas \(3\)"):
        FleetSpec(**_spec(replicas=4, scaling={"min_replicas": 1, "max_replicas": 3}))
    with pytest.raises(ValidationError, match="down_backlog .* must be below scaling.up_backlog"):
        FleetScaling(up_backlog=1, down_backlog=1)


def test_the_fleet_directory_carries_loads_events_and_bounds(tmp_path):
    fdir = FleetDir("f", tmp_path)
    fdir.create("name: f\n")
    fdir.attach("job-a", {"rollout-0": "x: 1\n"}, "cred")
    assert fdir.write_load("job-a", {"prompts": 3})
    assert fdir.loads()["job-a"]["prompts"] == 3 and time.time() - fdir.loads()["job-a"]["time"] < 60
    assert oct(os.stat(fdir.load_file("job-a")).st_mode & 0o777) == "0o600"
    fdir.detach("job-a")
    assert not fdir.write_load("job-a", {"prompts": 3})  # a job that left is not attached again by its load
    assert fdir.attached() == [] and not fdir.job_dir("job-a").exists()
    fdir.add_event({"action": "add", "reason": "backlog_high"})
    fdir.add_event({"action": "remove", "reason": "idle"})
    with open(fdir.events_file, "a") as f:
        f.write("not json\n")
    assert [e["reason"] for e in fdir.events()] == ["backlog_high", "idle"]
    assert fdir.requested_bounds() is None
    fdir.request_bounds(2, 3)
    assert fdir.requested_bounds() == (2, 3)
    fdir.bounds_file.write_text(json.dumps({"min": "x"}))
    assert fdir.requested_bounds() is None
