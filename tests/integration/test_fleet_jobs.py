"""A fleet through the `meshrl` command: `meshrl fleet start` keeps a real vLLM replica
warm; two adapter jobs (`meshrl run ... services.rollout.fleet=NAME`) attach to it at once,
start no replica of their own, train on it and finish with exact ledgers while the fleet's
replica stays the same process; a job the fleet cannot serve is refused with the reason;
the fleet's replica killed while a job runs is restarted by the fleet and the job finishes,
nothing lost or trained twice; `meshrl fleet stop` stops it.

The same fleet scales (one fleet for the module: its start is most of a test's time; the
tests above pin it to one replica with `meshrl fleet scale`): a job's backlog adds a replica,
which loads the job's current version before it leases and serves the job (and a job that
comes later) beside the first; once the jobs left, the fleet drains back to its minimum;
every decision is an event, a log line and a metric, none within a cool-down of the last; the
ledgers are exact. And a fault: a replica killed while it drains (`meshrl fleet scale` makes
the fleet drain it under a running job) loses nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from services.fleets import FleetDir
from services.metrics.scrape import http_get, parse_metrics
from tests.fixtures.jobs import make_arith_parquet
from tests.integration.fleet_support import adapter_job, meshrl, running_fleet, wait_until
from tests.integration.job_faults_support import assert_ledger_exact

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(1200)]

NAME = "tiny"
SCALING = {"min_replicas": 1, "max_replicas": 2, "interval_s": 1.0, "up_backlog": 2.0, "down_backlog": 0.5,
           "up_after_s": 2.0, "down_after_s": 5.0, "cooldown_s": 8.0, "drain_timeout_s": 30.0}


@pytest.fixture(scope="module")
def fleet(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    with running_fleet(root, NAME, tiny_model, scaling=SCALING) as (env, fdir, proc):
        yield root, env, fdir, proc


def _bounds(fleet, lo: int, hi: int) -> None:
    """`meshrl fleet scale` to ``lo``..``hi`` replicas; back when the fleet runs within them."""
    _, env, fdir, proc = fleet
    scale = meshrl("fleet", "scale", NAME, "--min", str(lo), "--max", str(hi), env=env)
    assert scale.wait(60) == 0, scale.stdout.read()

    def settled():
        sc = (fdir.state() or {}).get("scaling") or {}
        phases = [m.get("phase") for m in fdir.state()["members"].values()]
        return (sc.get("min"), sc.get("max")) == (lo, hi) and lo <= phases.count("serving") <= hi and not (
            {"starting", "draining"} & set(phases))

    wait_until(settled, f"the fleet within {lo}..{hi} replicas ({_why(fdir)})", 300, alive=proc, every=0.5)


@pytest.fixture(scope="module")
def arith(tmp_path_factory):
    return make_arith_parquet(tmp_path_factory.mktemp("arith"), train_size=64)


def _job(env: dict, run_dir: Path, model: str, data: str, *overrides: str) -> subprocess.Popen:
    return adapter_job(env, run_dir, model, data, NAME, *overrides)


def _replica_pid(fdir: FleetDir) -> int:
    return fdir.state()["members"]["rollout-0"]["pid"]


def test_two_adapter_jobs_share_the_warm_replica(fleet, tiny_model, arith):
    root, env, fdir, _ = fleet
    _bounds(fleet, 1, 1)
    pid = _replica_pid(fdir)
    runs = [root / "job-a", root / "job-b"]
    jobs = [_job(env, r, tiny_model, arith, f"data.seed={i}") for i, r in enumerate(runs)]
    outs = [j.communicate(timeout=900)[0] for j in jobs]
    for job, out, run_dir in zip(jobs, outs, runs):
        assert job.returncode == 0, out[-4000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["steps"] == 3
        assert_ledger_exact(run_dir)
        # no replica of its own: the fleet's took the job and served its adapter versions
        note = (run_dir / "logs" / "rollout-0.log").read_text()
        assert "attached (replica pid" in note and "MESHRL_READY" not in note, note
        report = fdir.reports(run_dir.name)["rollout-0"]
        assert report["state"] == "detached", report
    assert _replica_pid(fdir) == pid  # the same warm process served both
    replica_log = fdir.log_file("rollout-0").read_text()
    for run_dir in runs:
        assert f"serving job {run_dir.name}" in replica_log
    assert fdir.attached() == []


def test_a_job_the_fleet_cannot_serve_is_refused_with_the_reason(fleet, tiny_model, arith, tmp_path):
    _, env, fdir, _ = fleet
    _bounds(fleet, 1, 1)
    job = _job(env, tmp_path / "big", tiny_model, arith, "model.lora_rank=16")
    out = job.communicate(timeout=300)[0]
    assert job.returncode != 0
    assert "refused the job: model.lora_rank (16) exceeds the largest rank fleet 'tiny' serves (8)" in out, out[-3000:]
    assert fdir.attached() == []  # the failed job took itself off the fleet
    job = _job(env, tmp_path / "none", tiny_model, arith, "services.rollout.fleet=nowhere")
    out = job.communicate(timeout=120)[0]
    assert job.returncode != 0 and "fleet 'nowhere' has never run here" in out, out[-3000:]


def test_the_fleet_restarts_a_killed_replica_and_the_job_loses_nothing(fleet, tiny_model, arith):
    root, env, fdir, _ = fleet
    _bounds(fleet, 1, 1)
    run_dir = root / "job-kill"
    job = _job(env, run_dir, tiny_model, arith, "trainer.total_steps=6", "trainer.save_freq=2")
    pid = _replica_pid(fdir)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().count("\n") >= 1):  # a step was trained
        assert job.poll() is None, job.stdout.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    out = job.communicate(timeout=900)[0]
    assert job.returncode == 0, out[-4000:]
    assert _replica_pid(fdir) != pid  # the fleet brought a new replica, which took the job again
    assert "rollout-0 exited" in (root / f"{NAME}.out").read_text()
    assert_ledger_exact(run_dir)


def _phase(fdir, replica: str) -> str:
    return (fdir.state() or {}).get("members", {}).get(replica, {}).get("phase", "?")


def _serving(fdir) -> int:
    return sum(m.get("phase") == "serving" for m in (fdir.state() or {}).get("members", {}).values())


def _why(fdir) -> str:
    st = fdir.state() or {}
    return json.dumps({"scaling": st.get("scaling"), "events": fdir.events()[-5:]})[-2500:]


def test_a_backlog_adds_a_replica_and_the_fleet_drains_back_to_min(fleet, tiny_model, arith):
    root, env, fdir, proc = fleet
    _bounds(fleet, 1, 2)
    assert _serving(fdir) == 1 and _phase(fdir, "rollout-1") == "off"
    since = time.time()
    first = root / "job-a"
    # job a runs until it is cancelled (the tiny model trains a step in under a second: a job
    # of fixed length would end before a replica joins)
    job_a = adapter_job(env, first, tiny_model, arith, NAME, "trainer.total_steps=100000", "data.seed=0")
    added = wait_until(lambda: [e for e in fdir.events() if e["action"] == "add" and e["time"] >= since],
                       "a replica added", 240,
                       alive=job_a, every=0.5)
    assert added[0]["reason"] == "backlog_high" and added[0]["replicas"] == ["rollout-1"], added
    assert added[0]["signals"]["backlog_per_replica"] >= SCALING["up_backlog"], added
    joined = first / "logs" / "rollout-1.log"
    wait_until(lambda: joined.exists() and "joined" in joined.read_text(),
               f"rollout-1 joined job a ({_why(fdir)})", 300, alive=job_a, every=0.5)
    # a job arriving now is served by both replicas from its start
    second = root / "job-b"
    job_b = adapter_job(env, second, tiny_model, arith, NAME, "trainer.total_steps=3", "data.seed=1")
    out_b = job_b.communicate(timeout=900)[0]
    assert job_b.returncode == 0, out_b[-4000:]
    assert "rollout-1 ready" in out_b and "rollout-1: not running" not in out_b, out_b[-3000:]
    job_a.send_signal(signal.SIGINT)
    out_a = job_a.communicate(timeout=300)[0]
    left = time.monotonic()
    assert job_a.returncode == 130, out_a[-4000:]
    assert "meshrl run: rollout-1 joined (the fleet added it)" in out_a, out_a[-3000:]
    assert json.loads((second / "summary.json").read_text())["steps"] == 3
    for run_dir in (first, second):
        assert_ledger_exact(run_dir)
    # the replica that joined job a loaded a's current version before it leased
    replica_log = fdir.log_file("rollout-1").read_text()
    assert "job job-a: caught up to version" in replica_log, replica_log[-3000:]
    assert "serving job job-b" in replica_log
    # no job left: back to the minimum within a minute, by one decision
    wait_until(lambda: _serving(fdir) == 1 and _phase(fdir, "rollout-1") == "off",
               f"the fleet back at 1 replica ({_why(fdir)})", 60)
    assert time.monotonic() - left < 60
    events = [e for e in fdir.events() if e["time"] >= since]
    removed = [e for e in events if e["action"] == "remove"]
    assert removed and removed[-1]["reason"] in ("idle", "backlog_low") and removed[-1]["replicas"] == ["rollout-1"]
    changes = [e["time"] for e in events]
    assert all(b - a >= SCALING["cooldown_s"] - 0.5 for a, b in zip(changes, changes[1:])), events  # no flapping
    out = (root / f"{NAME}.out").read_text()
    assert "meshrl fleet: scaling 1 -> 2 replica(s) (backlog_high" in out and "rollout-1 drained" in out, out[-3000:]
    # the decisions on the fleet's /metrics
    status, body = http_get(f"http://{fdir.state()['metrics']}/metrics", 2.0)
    assert status == 200
    metrics = parse_metrics(body)
    assert metrics["meshrl_fleet_scale_decisions_total"] == len(fdir.events())
    assert metrics["meshrl_fleet_replicas"] == 1 and metrics["meshrl_fleet_jobs"] == 0
    assert b'meshrl_fleet_scale_decisions_total{reason="backlog_high"}' in body


def test_a_replica_killed_while_it_drains_loses_nothing(fleet, tiny_model, arith):
    root, env, fdir, proc = fleet
    _bounds(fleet, 2, 2)
    run_dir = root / "job-drain"
    job = adapter_job(env, run_dir, tiny_model, arith, NAME, "trainer.total_steps=30", "trainer.save_freq=2",
                      "queues.lease_idle_s=10", "data.seed=2")
    metrics = run_dir / "metrics.jsonl"
    wait_until(lambda: metrics.exists() and metrics.read_text().count("\n") >= 2, "two steps trained", 300,
               alive=job, every=0.5)
    assert "attached" in (run_dir / "logs" / "rollout-1.log").read_text()
    pid = fdir.state()["members"]["rollout-1"]["pid"]
    os.kill(pid, signal.SIGSTOP)  # it cannot act on the drain's SIGTERM: the fleet waits, then we kill it
    try:
        scale = meshrl("fleet", "scale", NAME, "--replicas", "1", env=env)
        assert scale.wait(60) == 0, scale.stdout.read()
        wait_until(lambda: _phase(fdir, "rollout-1") == "draining", "rollout-1 draining", 60, alive=job)
    finally:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: _phase(fdir, "rollout-1") == "off", "rollout-1 off after its kill", 60)
    out = job.communicate(timeout=900)[0]
    assert job.returncode == 0, out[-4000:]
    assert "meshrl run: rollout-1 left (the fleet drains it)" in out, out[-3000:]
    assert_ledger_exact(run_dir)  # what the killed replica held came back through the queue: nothing lost or doubled
    assert _serving(fdir) == 1
    reasons = [e["reason"] for e in fdir.events()]
    assert reasons[-2:] == ["below_min", "above_max"], reasons
