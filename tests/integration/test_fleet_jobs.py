"""A fleet through the `meshrl` command: `meshrl fleet start` keeps a real vLLM replica
warm; two adapter jobs (`meshrl run ... services.rollout.fleet=NAME`) attach to it at once,
start no replica of their own, train on it and finish with exact ledgers while the fleet's
replica stays the same process; a job the fleet cannot serve is refused with the reason;
the fleet's replica killed while a job runs is restarted by the fleet and the job finishes,
nothing lost or trained twice; `meshrl fleet stop` stops it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from services.fleets import FleetDir
from tests.fixtures.jobs import make_arith_parquet
from tests.integration.fleet_support import adapter_job, running_fleet
from tests.integration.job_faults_support import assert_ledger_exact

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(1200)]

NAME = "tiny"


@pytest.fixture(scope="module")
def fleet(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    with running_fleet(root, NAME, tiny_model) as (env, fdir, proc):
        yield root, env, fdir, proc


@pytest.fixture(scope="module")
def arith(tmp_path_factory):
    return make_arith_parquet(tmp_path_factory.mktemp("arith"), train_size=64)


def _job(env: dict, run_dir: Path, model: str, data: str, *overrides: str) -> subprocess.Popen:
    return adapter_job(env, run_dir, model, data, NAME, *overrides)


def _replica_pid(fdir: FleetDir) -> int:
    return fdir.state()["members"]["rollout-0"]["pid"]


def test_two_adapter_jobs_share_the_warm_replica(fleet, tiny_model, arith):
    root, env, fdir, _ = fleet
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
