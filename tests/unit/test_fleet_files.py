"""A fleet's spec, what a job must agree on to attach, the files a fleet and its jobs meet
through, and a job's side of an attached replica (no vLLM here: the replica's side of the
files is written the way ``rollout_svc/fleet_member.py`` writes it)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from controller_svc.fleet_attach import AttachedReplica, FleetAttachment, fleet_for, job_id_of
from services.config.fleet import FleetSpec, attach_problems
from services.config.job import JobSpecError, parse_job
from services.config.loader import ConfigError, validate
from services.config.views import derive_view
from services.fleets import FleetDir
from services.procs import ServiceFailed


def _fleet(model: str = "/models/base", **over) -> FleetSpec:
    raw = {"name": "smol", "model": {"path": model, "lora_rank": 16} if isinstance(model, str) else model,
           "rollout": {"prompt_length": 64, "response_length": 32}, **over}
    return validate(FleetSpec, raw, (), what="fleet spec")


def _job(model: str = "/models/base", *overrides: str):
    raw = {"name": "j", "model": {"path": model, "lora_rank": 8},
           "data": {"train_files": ["x.parquet"], "train_batch_size": 2, "max_prompt_length": 64,
                    "max_response_length": 32},
           "rollout": {"n": 2}, "actor": {"ppo_mini_batch_size": 1}, "services": {"rollout": {"fleet": "smol"}}}
    return parse_job(raw, list(overrides))


def test_fleet_spec_checks():
    f = _fleet()
    assert (f.max_jobs, f.replicas, f.max_lora_rank) == (4, 1, 16)
    with pytest.raises(ConfigError, match="lora_rank must be > 0 on a fleet"):
        _fleet(model={"path": "/m"})  # no lora_rank
    with pytest.raises(ConfigError, match="rollout.response_length is required on a fleet"):
        validate(FleetSpec, {"name": "a", "model": {"path": "/m", "lora_rank": 8}, "rollout": {"prompt_length": 8}},
                 (), what="fleet spec")
    for bad in ("Smol", "ok\n", "a/b", "-a"):
        with pytest.raises(ConfigError, match="name"):
            _fleet(name=bad)


def test_a_job_that_fits_attaches_and_each_mismatch_is_named():
    fleet = _fleet()
    assert attach_problems(fleet, derive_view(_job(), "rollout")) == []
    cases = [
        (_job("/models/base", "model.lora_rank=32"), "model.lora_rank (32) exceeds the largest rank fleet 'smol'"),
        (_job("/models/other"), "is not fleet 'smol''s base model"),
        (_job("/models/base", "data.max_prompt_length=128"), "data.max_prompt_length (128) exceeds"),
        (_job("/models/base", "data.max_response_length=64"), "data.max_response_length (64) exceeds"),
    ]
    for job, message in cases:
        problems = attach_problems(fleet, derive_view(job, "rollout"))
        assert any(message in p for p in problems), (message, problems)


@pytest.mark.parametrize("overrides, message", [
    (["model.lora_rank=0"], "a fleet serves adapter jobs only: set model.lora_rank > 0"),
    (["services.launcher=ray"], "a job attaches to a fleet on its own machine"),
    (["weights.rollout.mode=canary", "services.rollout.replicas=2"], "run the canary on the job's own replicas"),
    (["services.rollout.fleet=Bad_Name"], "services.rollout.fleet"),
])
def test_job_spec_refuses_what_a_fleet_cannot_serve(overrides, message):
    with pytest.raises(JobSpecError, match="fleet") as e:
        _job("/models/base", *overrides)
    assert message in str(e.value)


def test_fleet_dir_files_are_private_and_whole(tmp_path):
    fdir = FleetDir("smol", tmp_path)
    fdir.create("name: smol\n")
    assert stat.S_IMODE(fdir.path.stat().st_mode) == 0o700
    d = fdir.attach("job-1", {"rollout-0": "service: rollout\n", "rollout-1": "service: rollout\n"}, "s3cret\n")
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    for f in (fdir.job_view("job-1", "rollout-0"), fdir.job_credential("job-1")):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert fdir.attached() == ["job-1"]
    assert not list(d.glob(".*.tmp"))  # written whole: nothing half-written is left behind
    fdir.report("rollout-0", "job-1", "attached", metrics="127.0.0.1:1")
    assert fdir.reports("job-1")["rollout-0"]["state"] == "attached"
    fdir.detach("job-1")
    assert fdir.attached() == [] and not d.exists()
    with pytest.raises(ValueError, match="not a fleet job id"):
        fdir.job_dir("../escape")
    # a restart keeps attached jobs, clears the members' old reports and a stale stop request
    fdir.attach("job-2", {"rollout-0": "x"}, "c")
    fdir.request_stop()
    fdir.create("name: smol\n")
    assert fdir.attached() == ["job-2"] and fdir.reports("job-1") == {} and not fdir.stop_requested()


def test_running_follows_the_fleet_process(tmp_path):
    fdir = FleetDir("smol", tmp_path)
    assert not fdir.running()
    fdir.create("name: smol\n")
    fdir.write_state("ready", ["rollout-0"])
    assert fdir.running()  # this process wrote it and is alive
    with pytest.raises(ValueError, match="has never run here"):
        fleet_for_dir(tmp_path, "other")
    fdir.write_state("stopped", ["rollout-0"])
    assert not fdir.running()
    with pytest.raises(ValueError, match="is stopped"):
        fleet_for_dir(tmp_path, "smol")


def fleet_for_dir(root: Path, name: str):
    old = os.environ.get("MESHRL_FLEETS_DIR")
    os.environ["MESHRL_FLEETS_DIR"] = str(root)
    try:
        return fleet_for(name)
    finally:
        if old is None:
            del os.environ["MESHRL_FLEETS_DIR"]
        else:
            os.environ["MESHRL_FLEETS_DIR"] = old


def _attached(tmp_path) -> tuple[FleetDir, AttachedReplica]:
    fdir = FleetDir("smol", tmp_path / "fleets")
    fdir.create("name: smol\n")
    fdir.write_state("ready", ["rollout-0"])
    view = tmp_path / "rollout-0.yaml"
    view.write_text("service: rollout\n")
    cred = tmp_path / "job.credential"
    cred.write_text("secret\n")
    att = FleetAttachment(fdir, "job-1", {"rollout-0": view}, cred)
    return fdir, att.replica("rollout-0", tmp_path / "logs" / "rollout-0.log")


def test_attached_replica_ready_refused_and_lost(tmp_path):
    fdir, rep = _attached(tmp_path)
    rep.start()
    assert fdir.job_credential("job-1").read_text() == "secret\n"
    with pytest.raises(ServiceFailed, match="did not take the job within"):
        rep.wait_ready(0.5)
    # the replica takes it: ready, its metrics address is the job's
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fdir.report("rollout-0", "job-1", "attached", metrics="127.0.0.1:9", served_version=0)
        _rewrite_pid(fdir, child.pid)
        assert rep.wait_ready(5.0).pid == child.pid
        assert rep.url() == "http://127.0.0.1:9" and rep.returncode is None
    finally:
        child.kill()
        child.wait()
    # the fleet's replica died: the job sees its replica exited (and a restart waits for it)
    assert rep.returncode == 1
    rep.start()
    fdir.report("rollout-0", "job-1", "refused", detail="all 4 adapter slots of this replica are taken")
    with pytest.raises(ServiceFailed, match="refused the job: all 4 adapter slots"):
        rep.wait_ready(5.0)


def test_stop_takes_the_job_off_the_fleet_and_signals_never_reach_it(tmp_path):
    fdir, rep = _attached(tmp_path)
    rep.start()
    fdir.report("rollout-0", "job-1", "attached", metrics="127.0.0.1:9")
    rep.wait_ready(5.0)
    rep.signal(15)  # SIGTERM: the fleet's replica is not the job's to stop
    assert rep.returncode is None
    rep.signal(9)  # SIGKILL: marks it exited for the job only
    assert rep.returncode == -9 and fdir.attached() == ["job-1"]
    rep.start()
    rep.wait_ready(5.0)
    fdir.report("rollout-0", "job-1", "detached", detail="the job left the fleet")
    assert rep.stop(grace=2.0) == 0
    assert fdir.attached() == []


def test_job_id_of_a_run_dir():
    assert job_id_of(Path("/runs/quickstart-20261128-093000")) == "quickstart-20261128-093000"
    assert job_id_of(Path("/runs/a b:c")) == "a-b-c"


def _rewrite_pid(fdir: FleetDir, pid: int) -> None:
    import json

    f = fdir.member_file("rollout-0", "job-1")
    data = json.loads(f.read_text())
    data["pid"] = pid
    f.write_text(json.dumps(data))


def test_a_replica_the_fleet_drains_or_that_says_it_leaves_is_parked_and_taken_back(tmp_path):
    """The fleet scales: a replica it does not run is parked at once (not waited for); one it
    drains, or one whose own heartbeat says it is leaving (an orchestrator scaled it in), is
    parked, not counted as a crash; one that serves and took the job again rejoins; a parked
    replica of a fleet that stopped is an exit."""
    fdir, rep = _attached(tmp_path)
    members = {"rollout-0": {"phase": "off"}}
    fdir.write_state("ready", ["rollout-0"], members=members)
    rep.start()
    assert rep.wait_ready(5.0) is None and rep.parked and rep.returncode is None
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fdir.report("rollout-0", "job-1", "attached", metrics="127.0.0.1:9")
        _rewrite_pid(fdir, child.pid)
        assert rep.follow() is None  # reported, but the fleet does not say it serves yet
        fdir.write_state("ready", ["rollout-0"], members={"rollout-0": {"phase": "serving"}})
        assert rep.follow() == "joined" and rep.ready.pid == child.pid and not rep.parked
        # an orchestrator's SIGTERM: the replica's heartbeat says draining before the fleet knows
        fdir.heartbeat("rollout-0", "draining")
        fdir.report("rollout-0", "job-1", "detached", detail="the replica is stopping")
        assert rep.returncode is None  # leaving, not failing
        assert rep.follow() == "left" and rep.parked and rep.ready is None
        fdir.heartbeat("rollout-0", "serving")
        fdir.report("rollout-0", "job-1", "attached", metrics="127.0.0.1:9")
        _rewrite_pid(fdir, child.pid)
        assert rep.follow() == "joined"
        # the fleet drains it: parked again
        fdir.write_state("ready", ["rollout-0"], members={"rollout-0": {"phase": "draining"}})
        assert rep.returncode is None and rep.follow() == "left"
    finally:
        child.kill()
        child.wait()
    # the fleet's process is gone (its pid in fleet.json is ours, so fake a dead one): an exit
    st = fdir.state()
    st["pid"] = child.pid
    fdir.state_file.write_text(__import__("json").dumps(st))
    assert rep.returncode == 1
    with pytest.raises(ServiceFailed, match="stopped"):
        rep.start().wait_ready(5.0)


def test_a_fleet_is_running_only_while_its_own_process_lives(tmp_path):
    """The state file names the fleet's process by pid *and* start time: a pid reused by
    another process (a restart, a container) is not the fleet."""
    import json

    fdir = FleetDir("smol", tmp_path / "fleets")
    fdir.create("name: smol\n")
    fdir.write_state("ready", ["rollout-0"])
    assert fdir.running()
    st = fdir.state()
    st["pid_start"] += 1  # the same pid, started at another time: another process
    fdir.state_file.write_text(json.dumps(st))
    assert not fdir.running()
    fdir.write_state("stopped", ["rollout-0"])
    assert not fdir.running()
