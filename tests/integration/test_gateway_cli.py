"""`meshrl gateway` as a real process: refuses to start without a token, serves REST and
gRPC with one, and exits cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import grpc
import httpx
import pytest

from services.net import free_port, wait_for_port
from services.pb import job_pb2, job_pb2_grpc

pytestmark = pytest.mark.timeout(120)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHRL_GATEWAY")}
    env.update(extra)
    return env


def test_gateway_refuses_to_start_without_a_token(tmp_path):
    r = subprocess.run([sys.executable, "-m", "meshrl_cli", "gateway", "--runs-dir", str(tmp_path)],
                       env=_env(), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "MESHRL_GATEWAY_TOKEN" in r.stderr
    r = subprocess.run([sys.executable, "-m", "meshrl_cli", "gateway", "--runs-dir", str(tmp_path)],
                       env=_env(MESHRL_GATEWAY_TOKEN="short"), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "token" in r.stderr


def test_gateway_process_serves_and_stops_on_sigterm(tmp_path):
    http, rpc = free_port(), free_port()
    token_file = tmp_path / "token"
    token_file.write_text("cli-token-123456\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "meshrl_cli", "gateway", "--port", str(http), "--grpc-port", str(rpc),
         "--runs-dir", str(tmp_path / "runs"), "--token-file", str(token_file), "--db",
         f"sqlite:///{tmp_path / 'jobs.db'}"],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_for_port("127.0.0.1", http, timeout=60, proc=proc)
        assert httpx.get(f"http://127.0.0.1:{http}/health", timeout=5).status_code == 200
        assert httpx.get(f"http://127.0.0.1:{http}/v1/jobs", timeout=5).status_code == 401
        ok = httpx.get(f"http://127.0.0.1:{http}/v1/jobs", headers={"Authorization": "Bearer cli-token-123456"},
                       timeout=5)  # fmt: skip
        assert ok.status_code == 200 and ok.json() == {"jobs": []}
        wait_for_port("127.0.0.1", rpc, timeout=30, proc=proc)
        with grpc.insecure_channel(f"127.0.0.1:{rpc}") as ch:
            reply = job_pb2_grpc.JobServiceStub(ch).ListJobs(
                job_pb2.JobListRequest(), metadata=(("authorization", "Bearer cli-token-123456"),), timeout=10
            )
        assert list(reply.jobs) == []
        assert (tmp_path / "jobs.db").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out = proc.communicate(timeout=30)[0].decode(errors="replace")
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate(timeout=10)[0].decode(errors="replace")
    assert proc.returncode == 0, out[-2000:]
    assert f"REST http://127.0.0.1:{http}" in out
