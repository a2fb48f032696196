"""The gateway's ``deployment`` launcher and the ``meshrl worker`` loop, with real worker
processes (``python -m services.cli worker``) whose services are small real commands; the
whole stack with the real services runs in tests/integration/test_compose_podman.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from services.launch.base import JobState, LaunchError
from services.launch.deployment import CURRENT, DeploymentLauncher

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
WIRING = {"queues": {"type": "embedded", "address": "broker:50080"},
          "trainer": {"default_local_dir": "/checkpoints/{job_id}"}}


def spec_yaml(tmp_path: Path, name: str = "dep") -> str:
    return yaml.safe_dump({"name": name, "model": {"path": str(tmp_path)},
                           "data": {"train_files": [str(tmp_path / "t.parquet")], "train_batch_size": 4},
                           "actor": {"ppo_mini_batch_size": 4}, "rollout": {"n": 2}})


class Workers:
    """``meshrl worker`` processes; each stopped (SIGTERM, then SIGKILL) at the end."""

    def __init__(self, runs: Path) -> None:
        self.runs, self.procs = runs, []

    def start(self, role: str, *command: str, ends_job: bool = False, name: str | None = None,
              scrape: str | None = None) -> subprocess.Popen:
        name = name or f"{role}-{len(self.procs)}"
        argv = [sys.executable, "-m", "services.cli", "worker", "--role", role, "--runs-dir", str(self.runs), "--grace", "5",
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


def test_a_failing_service_fails_the_job_naming_it_and_the_next_job_runs(runs, tmp_path):
    runs_dir, workers = runs
    launcher = DeploymentLauncher(WIRING)
    workers.start("trainer", sys.executable, "-c", "import time; time.sleep(600)", ends_job=True)
    workers.start("reward", sys.executable, "-c",  # fails on job-b only
                  "import sys, time\nif 'job-b' in '{run_dir}': print('scorer exploded'); sys.exit(3)\ntime.sleep(600)")
    h = launcher.start("job-b", spec_yaml(tmp_path), runs_dir / "job-b")
    st = wait_state(launcher, h, {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
    assert st.state == JobState.FAILED and "reward-1" in st.detail and "exit code 3" in st.detail
    assert "scorer exploded" in st.detail
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
        text = Path(f"/proc/{pid}/stat").read_text()
        return text[text.rindex(")") + 2]

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
    assert not Path(f"/proc/{pid}").exists() or proc_state() == "Z"


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
