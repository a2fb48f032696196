"""The gateway's ``deployment`` launcher and the ``meshrl worker`` loop, with real worker
processes (``python -m meshrl_cli worker``) whose services are small real commands; the
whole stack with the real services runs in tests/integration/test_compose_podman.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gateway_svc.launchers.base import JobState, LaunchError
from gateway_svc.launchers.deployment import DeploymentLauncher
from services.handoff import CURRENT
from services.procs import pid_alive, proc_stat

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
WIRING = {"queues": {"type": "embedded", "address": "broker:50080"},
          "trainer": {"default_local_dir": "/checkpoints/{job_id}"}}


STUB = str(ROOT / "tests" / "integration" / "deployment_stub_service.py")


def spec_yaml(tmp_path: Path, name: str = "dep", restart: dict | None = None) -> str:
    spec = {"name": name, "model": {"path": str(tmp_path)},
            "data": {"train_files": [str(tmp_path / "t.parquet")], "train_batch_size": 4},
            "actor": {"ppo_mini_batch_size": 4}, "rollout": {"n": 2}}
    if restart:
        spec["services"] = {"restart": restart}
    return yaml.safe_dump(spec)


def pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def wait_pids(path: Path, n: int, timeout: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while len(pids(path)) < n:
        assert time.monotonic() < deadline, f"{path} never held {n} pids: {pids(path)}"
        time.sleep(0.1)
    return pids(path)


class Workers:
    """``meshrl worker`` processes; each stopped (SIGTERM, then SIGKILL) at the end."""

    def __init__(self, runs: Path) -> None:
        self.runs, self.procs = runs, []

    def start(self, role: str, *command: str, ends_job: bool = False, name: str | None = None,
              scrape: str | None = None) -> subprocess.Popen:
        name = name or f"{role}-{len(self.procs)}"
        argv = [sys.executable, "-m", "meshrl_cli", "worker", "--role", role, "--runs-dir", str(self.runs), "--grace", "5",
                "--name", name, "--state-file", str(self.runs / f"{name}.state")]
        if ends_job:
            argv.append("--ends-job")
        if scrape:
            argv += ["--scrape", scrape]
        p = subprocess.Popen([*argv, "--", *command], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)


@pytest.fixture
def runs(tmp_path):
    d = tmp_path / "runs"
    d.mkdir()
    w = Workers(d)
    try:
        yield d, w
    finally:
        w.stop()


def wait_state(launcher, handle, want: set[JobState], timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        st = launcher.status(handle)
        if st.state in want:
            return st
        assert time.monotonic() < deadline, f"state {st.state} ({st.detail}) never became {want}"
        time.sleep(0.2)


def test_a_job_runs_on_the_workers_and_ends_with_the_trainer(runs, tmp_path, monkeypatch):
    runs_dir, workers = runs
    monkeypatch.delenv("MESHRL_JOB_CREDENTIAL_FILE")  # the gateway has no deployment-wide secret
    launcher = DeploymentLauncher(WIRING)
    h = launcher.start("job-a", spec_yaml(tmp_path), runs_dir / "job-a")
    run_dir = Path(h["run_dir"])
    spec = yaml.safe_load((run_dir / "spec.yaml").read_text())
    assert spec["queues"]["address"] == "broker:50080" and spec["trainer"]["default_local_dir"] == "/checkpoints/job-a"
    assert (run_dir / "job.credential").stat().st_mode & 0o777 == 0o600  # no deployment secret: one per job
    # each role's view of the job is written once, beside the spec ({view} in a worker's command)
    views = {name: yaml.safe_load((run_dir / "config" / f"{name}.yaml").read_text())
             for name in ("trainer", "rollout", "reward", "feeder")}
    assert all(v["service"] == name for name, v in views.items())
    assert views["trainer"]["trainer"]["default_local_dir"] == "/checkpoints/job-a"
    assert views["rollout"]["queues"]["address"] == "broker:50080"
    # the trainer copies its view and credential path, then exits 0; the feeder runs until told to stop
    workers.start("trainer", sys.executable, "-c",
                  "import os, shutil, time; shutil.copy('{view}', '{run_dir}/seen.yaml'); "
                  "open('{run_dir}/cred', 'w').write(os.environ['MESHRL_JOB_CREDENTIAL_FILE']); "
                  "t = time.time()\nwhile not os.path.exists('{run_dir}/feeder-1.up') and time.time() - t < 60: "
                  "time.sleep(0.1)", ends_job=True)
    workers.start("feeder", sys.executable, "-c", "import time; open('{run_dir}/{name}.up', 'w'); time.sleep(600)")
    st = wait_state(launcher, h, {JobState.SUCCEEDED, JobState.FAILED})
    assert st.state == JobState.SUCCEEDED, st.detail
    assert (run_dir / "seen.yaml").read_text() == (run_dir / "config" / "trainer.yaml").read_text()
    assert (run_dir / "cred").read_text() == str(run_dir / "job.credential")
    assert (run_dir / "feeder-1.up").exists()
    deadline = time.monotonic() + 30  # the feeder's service is stopped; its worker goes back to idle
    while (runs_dir / "feeder-1.state").read_text().strip() != "idle":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert "exited" in (run_dir / "workers" / "feeder-1.json").read_text()


def test_a_service_that_keeps_failing_fails_the_job_naming_it_and_its_budget_and_the_next_job_runs(runs, tmp_path):
    runs_dir, workers = runs
    launcher = DeploymentLauncher(WIRING)
    workers.start("trainer", sys.executable, "-c", "import time; time.sleep(600)", ends_job=True)
    workers.start("reward", sys.executable, "-c",  # fails on job-b only
                  "import sys, time\nif 'job-b' in '{run_dir}': print('scorer exploded'); sys.exit(3)\ntime.sleep(600)")
    h = launcher.start("job-b", spec_yaml(tmp_path, restart={"max_restarts": 2, "backoff_s": 0.1}), runs_dir / "job-b")
    st = wait_state(launcher, h, {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
    assert st.state == JobState.FAILED, st.detail
    assert "reward-1 exited with code 3" in st.detail and "restarted 2 time(s)" in st.detail
    assert "services.restart.max_restarts=2" in st.detail and "scorer exploded" in st.detail
    log = (Path(h["run_dir"]) / "logs" / "reward-1.log").read_text()
    assert log.count("scorer exploded") == 3  # the first start and its 2 restarts
    assert "restart 1/2" in log and "restart 2/2" in log
    assert st.progress["restarts"]["reward-1"] == 2
    # one job at a time: a second start is refused while one runs, accepted once it ended
    h2 = launcher.start("job-c", spec_yaml(tmp_path), runs_dir / "job-c")
    with pytest.raises(LaunchError, match="running job job-c"):
        launcher.start("job-d", spec_yaml(tmp_path), runs_dir / "job-d")
    report = Path(h2["run_dir"]) / "workers" / "trainer-0.json"
    deadline = time.monotonic() + 30  # the trainer's worker takes job-c...
    while not report.exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    launcher.cancel(h2, timeout=20)  # ... and stops its service when the job is cancelled
    assert launcher.status(h2).state == JobState.CANCELLED
    assert "exited" in report.read_text()


def test_pause_stops_the_services_and_resume_continues_them(runs, tmp_path):
    runs_dir, workers = runs
    launcher = DeploymentLauncher(WIRING)
    workers.start("trainer", sys.executable, "-c",
                  "import os, time; open('{run_dir}/pid', 'w').write(str(os.getpid())); time.sleep(600)", ends_job=True)
    h = launcher.start("job-p", spec_yaml(tmp_path), runs_dir / "job-p")
    run_dir = Path(h["run_dir"])
    wait_state(launcher, h, {JobState.RUNNING})
    deadline = time.monotonic() + 30
    while not (run_dir / "pid").exists() or not (run_dir / "pid").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    pid = int((run_dir / "pid").read_text())

    def proc_state() -> str:
        st = proc_stat(pid)
        return "X" if st is None else st.state  # gone: as a dead process

    launcher.pause(h)
    assert launcher.status(h).state == JobState.PAUSED
    deadline = time.monotonic() + 10
    while proc_state() not in "Tt":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    launcher.resume(h)
    deadline = time.monotonic() + 10
    while proc_state() in "Tt":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    launcher.cancel(h, timeout=20)
    assert not pid_alive(pid)


def test_without_workers_the_job_fails_saying_why(runs, tmp_path):
    runs_dir, _ = runs
    launcher = DeploymentLauncher(WIRING, pickup_timeout_s=0.5)
    h = launcher.start("job-x", spec_yaml(tmp_path), runs_dir / "job-x")
    assert launcher.status(h).state == JobState.RUNNING
    time.sleep(0.8)
    st = launcher.status(h)
    assert st.state == JobState.FAILED and "no worker of the deployment took the job" in st.detail
    assert (runs_dir / CURRENT).exists()


def test_a_spec_that_does_not_fit_the_wiring_is_refused(runs, tmp_path):
    runs_dir, _ = runs
    with pytest.raises(LaunchError, match="does not fit this deployment's wiring"):
        DeploymentLauncher({"services": {"rollout": {"grpc_port": "not a port"}}}).start("job-w", spec_yaml(tmp_path), runs_dir / "w")
    with pytest.raises(LaunchError, match="needs the deployment's wiring"):
        os.environ.pop("MESHRL_DEPLOYMENT_CONFIG", None)
        DeploymentLauncher()


def test_a_redis_deployment_starts_each_job_on_an_empty_database(runs, tmp_path, redis_server):
    import redis

    runs_dir, _ = runs
    client = redis.Redis.from_url(redis_server.url)
    client.set("left-over-of-the-last-job", "1")
    launcher = DeploymentLauncher({"queues": {"type": "redis", "url": redis_server.url}})
    launcher.start("job-r", spec_yaml(tmp_path), runs_dir / "job-r")
    assert client.dbsize() == 0
    client.close()


def test_a_killed_service_is_restarted_while_the_others_run_and_the_job_finishes(runs, tmp_path):
    runs_dir, workers = runs
    launcher = DeploymentLauncher(WIRING)
    h = launcher.start("job-k", spec_yaml(tmp_path, restart={"backoff_s": 0.2}), runs_dir / "job-k")
    run_dir = Path(h["run_dir"])
    # the trainer ends the job once the reward service started a second time
    workers.start("trainer", sys.executable, STUB, "--pids", "{run_dir}/trainer.pids", "--serve",
                  "--wait-lines", "{run_dir}/reward.pids", "2", ends_job=True, scrape="0.5")
    workers.start("reward", sys.executable, STUB, "--pids", "{run_dir}/reward.pids", "--serve", scrape="0.5")
    first = wait_pids(run_dir / "reward.pids", 1)[0]
    os.kill(first, signal.SIGKILL)
    st = wait_state(launcher, h, {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
    assert st.state == JobState.SUCCEEDED, st.detail
    reward = pids(run_dir / "reward.pids")
    assert len(reward) == 2 and reward[1] != first
    assert len(pids(run_dir / "trainer.pids")) == 1  # the rest of the mesh kept running
    assert st.progress["restarts"] == {"reward-1": 1, "trainer-0": 0}
    assert "reward-1 exited with code -9; restart 1/3" in (run_dir / "logs" / "reward-1.log").read_text()


def test_a_silent_service_is_killed_and_restarted(runs, tmp_path):
    runs_dir, workers = runs
    launcher = DeploymentLauncher(WIRING)
    h = launcher.start("job-s", spec_yaml(tmp_path, restart={"backoff_s": 0.2, "heartbeat_timeout_s": 2}),
                       runs_dir / "job-s")
    run_dir = Path(h["run_dir"])
    workers.start("trainer", sys.executable, STUB, "--pids", "{run_dir}/trainer.pids", "--serve",
                  "--wait-lines", "{run_dir}/reward.pids", "2", ends_job=True, scrape="0.5")
    workers.start("reward", sys.executable, STUB, "--pids", "{run_dir}/reward.pids", "--serve", scrape="0.5")
    first = wait_pids(run_dir / "reward.pids", 1)[0]
    state = runs_dir / "reward-1.state"
    deadline = time.monotonic() + 60  # its worker found it ready: heartbeats (and the container's
    while (state.read_text() if state.exists() else "") != "running job-s\n":  # health check) from now on
        assert time.monotonic() < deadline
        time.sleep(0.1)
    os.kill(first, signal.SIGSTOP)  # alive, but its /health never answers
    st = wait_state(launcher, h, {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
    assert st.state == JobState.SUCCEEDED, st.detail
    log = (run_dir / "logs" / "reward-1.log").read_text()
    assert "reward-1 is stuck (no heartbeat for" in log
    assert "reward-1 exited with code -9 (no heartbeat for" in log
    assert not pid_alive(first)


def test_a_job_without_progress_is_reported_stalled_then_fails_saying_so(runs, tmp_path):
    runs_dir, workers = runs
    launcher = DeploymentLauncher(WIRING)
    h = launcher.start("job-t", spec_yaml(tmp_path, restart={"stall_warn_s": 1, "stall_timeout_s": 6}),
                       runs_dir / "job-t")
    workers.start("trainer", sys.executable, STUB, "--pids", "{run_dir}/trainer.pids", "--serve", ends_job=True, scrape="0.5")
    workers.start("reward", sys.executable, STUB, "--pids", "{run_dir}/reward.pids", "--serve", scrape="0.5")
    seen = set()
    deadline = time.monotonic() + 60
    while (st := launcher.status(h)).state == JobState.RUNNING:
        seen.add(st.detail.split(":")[0])
        assert time.monotonic() < deadline, st.detail
        time.sleep(0.2)
    assert "stalled" in seen  # the status said so while it ran
    assert st.state == JobState.FAILED
    assert st.detail.startswith("job stalled: no progress for") and "services.restart.stall_timeout_s=6" in st.detail
    assert "no sample generated, scored or trained by the deployment's services" in st.detail


def test_a_job_making_progress_is_not_stalled(runs, tmp_path):
    runs_dir, workers = runs
    launcher = DeploymentLauncher(WIRING)
    h = launcher.start("job-g", spec_yaml(tmp_path, restart={"stall_warn_s": 1, "stall_timeout_s": 3}),
                       runs_dir / "job-g")
    # the trainer runs well past the stall deadline while the reward service keeps scoring
    workers.start("trainer", sys.executable, STUB, "--pids", "{run_dir}/trainer.pids", "--serve", "--seconds", "12",
                  ends_job=True, scrape="0.5")
    workers.start("reward", sys.executable, STUB, "--pids", "{run_dir}/reward.pids", "--serve",
                  "--grow", "meshrl_reward_samples_total", scrape="0.5")
    st = wait_state(launcher, h, {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
    assert st.state == JobState.SUCCEEDED, st.detail


def test_a_paused_service_is_not_taken_for_a_silent_one(runs, tmp_path):
    runs_dir, workers = runs
    launcher = DeploymentLauncher(WIRING)
    h = launcher.start("job-q", spec_yaml(tmp_path, restart={"heartbeat_timeout_s": 1, "stall_warn_s": 1,
                                                             "stall_timeout_s": 2}), runs_dir / "job-q")
    run_dir = Path(h["run_dir"])
    workers.start("trainer", sys.executable, STUB, "--pids", "{run_dir}/trainer.pids", "--serve",
                  "--grow", "meshrl_trainer_samples_total", ends_job=True, scrape="0.5")
    report = run_dir / "workers" / "trainer-0.json"
    deadline = time.monotonic() + 60
    while '"ready": true' not in (report.read_text() if report.exists() else ""):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    launcher.pause(h)
    time.sleep(6)  # well past the heartbeat and stall deadlines (several probe rounds)
    launcher.resume(h)
    time.sleep(1.5)
    st = launcher.status(h)
    assert st.state == JobState.RUNNING, st.detail
    assert len(pids(run_dir / "trainer.pids")) == 1  # never killed: a pause is not silence
    assert st.progress["restarts"] == {"trainer-0": 0}
    launcher.cancel(h, timeout=20)
