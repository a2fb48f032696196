"""The Ray launcher against a real local Ray cluster (`ray start --head`, started and
stopped by this test; only its own process group is ended)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gateway_svc.launchers.base import JobState, LaunchError
from services.net import free_port, port_open
from tests.integration.gateway_support import FAKE_JOB, VALID_SPEC, VALID_SPEC_YAML, auth, running_gateway, wait_until

import ray  # noqa: E402  (the test extra installs it)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A one-node Ray cluster of our own on free ports; yields its GCS address."""
    exe = Path(sys.executable).with_name("ray")
    assert exe.exists(), "ray CLI missing"
    port = free_port()
    tmp = Path("/tmp") / f"ray-meshrl-{os.getpid()}"  # short: Ray's socket paths have a length limit
    proc = subprocess.Popen(
        [str(exe), "start", "--head", "--block", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
         "--disable-usage-stats", f"--temp-dir={tmp}", f"--dashboard-agent-listen-port={free_port()}",
         f"--ray-client-server-port={free_port()}", f"--node-manager-port={free_port()}",
         f"--object-manager-port={free_port()}", f"--metrics-export-port={free_port()}",
         f"--runtime-env-agent-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    address = f"127.0.0.1:{port}"
    try:
        wait_until(lambda: proc.poll() is not None or port_open("127.0.0.1", port), timeout=90, what="ray head")
        assert proc.poll() is None, "ray start --head exited"
        yield address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
        shutil.rmtree(tmp, ignore_errors=True)


def _launcher(address: str, **env):
    from gateway_svc.launchers.ray import RayLauncher

    return RayLauncher(address, command=[sys.executable, str(FAKE_JOB)], env={k: str(v) for k, v in env.items()})


def test_ray_launcher_runs_pauses_and_cancels_a_job(ray_cluster, tmp_path):
    launcher = _launcher(ray_cluster, FAKE_STEPS=3, FAKE_INTERVAL=0.05)
    handle = launcher.start("r1", VALID_SPEC_YAML, tmp_path / "r1")
    assert handle["kind"] == "ray" and handle["actor"] == "meshrl-job-r1"
    st = wait_until(lambda: (s := launcher.status(handle)).state.finished and s, timeout=60, what="ray job end")
    assert st.state is JobState.SUCCEEDED and st.exit_code == 0 and st.progress["step"] == 3
    assert (tmp_path / "r1" / "spec.yaml").read_text() == VALID_SPEC_YAML

    long = _launcher(ray_cluster, FAKE_STEPS=10_000, FAKE_INTERVAL=0.05)
    h2 = long.start("r2", VALID_SPEC_YAML, tmp_path / "r2")
    wait_until(lambda: long.status(h2).progress.get("step"), timeout=60, what="progress")
    long.pause(h2)
    wait_until(lambda: long.status(h2).state is JobState.PAUSED, what="paused")
    long.resume(h2)
    wait_until(lambda: long.status(h2).state is JobState.RUNNING, what="running again")
    long.cancel(h2, timeout=5)
    assert long.status(h2).state is JobState.CANCELLED
    with pytest.raises(LaunchError, match="gone"):
        long.pause(h2)  # the actor was removed with the job


def test_gateway_with_the_ray_launcher(ray_cluster, tmp_path):
    with running_gateway(tmp_path, _launcher(ray_cluster, FAKE_STEPS=3, FAKE_INTERVAL=0.05), grpc=False) as gw, \
            httpx.Client(base_url=gw.http_url, timeout=30) as c:  # fmt: skip
        r = c.post("/v1/jobs", json={"spec": VALID_SPEC}, headers=auth())
        assert r.status_code == 201, r.text
        assert r.json()["launcher"] == "ray"
        jid = r.json()["id"]
        job = wait_until(lambda: (j := c.get(f"/v1/jobs/{jid}", headers=auth()).json())["state"] == "succeeded" and j,
                         timeout=60, what="success via ray")  # fmt: skip
        assert job["progress"]["step"] == 3
