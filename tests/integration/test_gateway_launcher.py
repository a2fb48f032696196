"""LocalLauncher against real subprocesses (the stand-in job driver)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gateway_svc.launchers.base import JobState, LaunchError
from gateway_svc.launchers.registry import make_launcher
from gateway_svc.launchers.local import LocalLauncher, _proc_stat
from tests.integration.gateway_support import VALID_SPEC_YAML, fake_launcher, wait_until

pytestmark = pytest.mark.timeout(60)


def _finished(launcher, handle):
    st = launcher.status(handle)
    return st if st.state.finished else None


def test_job_runs_to_success_with_progress(tmp_path):
    launcher = fake_launcher(FAKE_STEPS=3, FAKE_INTERVAL=0.05)
    handle = launcher.start("j1", VALID_SPEC_YAML, tmp_path / "j1")
    assert (tmp_path / "j1" / "spec.yaml").read_text() == VALID_SPEC_YAML
    st = wait_until(lambda: _finished(launcher, handle), what="job end")
    assert st.state is JobState.SUCCEEDED and st.exit_code == 0
    assert st.progress["step"] == 3 and st.progress["reward_mean"] == 1.0
    assert "fake job: finished" in (tmp_path / "j1" / "job.log").read_text()


def test_failing_job_reports_exit_code_and_reason(tmp_path):
    launcher = fake_launcher(FAKE_STEPS=1, FAKE_INTERVAL=0.01, FAKE_EXIT=3)
    handle = launcher.start("j2", VALID_SPEC_YAML, tmp_path / "j2")
    st = wait_until(lambda: _finished(launcher, handle), what="job end")
    assert st.state is JobState.FAILED and st.exit_code == 3
    assert "exit code 3" in st.detail and "trainer crashed: boom" in st.detail


def test_pause_stops_the_whole_group_and_resume_continues(tmp_path):
    launcher = fake_launcher(FAKE_STEPS=400, FAKE_INTERVAL=0.05, FAKE_CHILD=1)
    handle = launcher.start("j3", VALID_SPEC_YAML, tmp_path / "j3")
    child = int(wait_until(lambda: (tmp_path / "j3" / "child.pid").exists() and (tmp_path / "j3" / "child.pid").read_text(), what="child pid"))
    wait_until(lambda: launcher.status(handle).progress.get("step"), what="first step")
    launcher.pause(handle)
    wait_until(lambda: launcher.status(handle).state is JobState.PAUSED, what="paused")
    wait_until(lambda: _proc_stat(child)[0] == "T", what="child stopped too")
    step = launcher.status(handle).progress["step"]
    # While stopped the driver cannot write: its step stays put (checked over several reads).
    for _ in range(5):
        assert launcher.status(handle).progress["step"] == step
        time.sleep(0.1)
    launcher.resume(handle)
    wait_until(lambda: launcher.status(handle).progress["step"] > step, what="progress after resume")
    assert launcher.status(handle).state is JobState.RUNNING
    launcher.cancel(handle, timeout=5)
    assert launcher.status(handle).state is JobState.CANCELLED
    wait_until(lambda: _proc_stat(child) is None or _proc_stat(child)[0] == "Z", what="child gone")


def test_cancel_kills_a_job_that_ignores_sigterm(tmp_path):
    launcher = fake_launcher(FAKE_STEPS=10_000, FAKE_INTERVAL=0.05, FAKE_IGNORE_TERM=1, FAKE_CHILD=1)
    handle = launcher.start("j4", VALID_SPEC_YAML, tmp_path / "j4")
    wait_until(lambda: launcher.status(handle).progress.get("step"), what="first step")
    child = int((tmp_path / "j4" / "child.pid").read_text())
    launcher.cancel(handle, timeout=0.5)
    st = launcher.status(handle)
    assert st.state is JobState.CANCELLED and st.exit_code == -9  # SIGKILL after the timeout
    wait_until(lambda: _proc_stat(child) is None or _proc_stat(child)[0] == "Z", what="child killed")


def test_a_new_launcher_instance_finds_the_job_by_its_handle(tmp_path):
    first = fake_launcher(FAKE_STEPS=10_000, FAKE_INTERVAL=0.05)
    handle = first.start("j5", VALID_SPEC_YAML, tmp_path / "j5")
    wait_until(lambda: first.status(handle).progress.get("step"), what="first step")
    second = LocalLauncher()  # e.g. a restarted gateway: the process is not its child
    assert second.status(handle).state is JobState.RUNNING
    second.pause(handle)
    wait_until(lambda: second.status(handle).state is JobState.PAUSED, what="paused via new instance")
    second.cancel(handle, timeout=2)
    first.status(handle)  # reap as the parent
    st = second.status(handle)
    assert st.state is JobState.CANCELLED


def test_dead_pid_with_reused_number_is_not_mistaken_for_the_job(tmp_path):
    launcher = LocalLauncher()
    handle = {"pid": os.getpid(), "pgid": os.getpgid(0), "start_ticks": -1, "run_dir": str(tmp_path)}
    st = launcher.status(handle)  # our own pid, but the start time does not match
    assert st.state is JobState.FAILED and "exit code unknown" in st.detail
    with pytest.raises(LaunchError):
        launcher.pause(handle)


def test_missing_driver_executable_is_a_launch_error(tmp_path):
    launcher = LocalLauncher(command=[str(tmp_path / "no-such-program")])
    with pytest.raises(LaunchError, match="cannot start"):
        launcher.start("j6", VALID_SPEC_YAML, Path(tmp_path / "j6"))


def test_make_launcher_local_and_unknown():
    assert isinstance(make_launcher("local"), LocalLauncher)
    with pytest.raises(LaunchError, match="unknown launcher"):
        make_launcher("slurm")
