"""A real (short) job through the gateway: the default LocalLauncher runs `meshrl run`
(controller, embedded broker, vLLM rollout replica, reward worker, trainer) on the tiny
model and a small arithmetic set; the job must reach `succeeded` with its steps counted,
and the gateway must show its metric points."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from gateway_svc.launchers.local import LocalLauncher
from tests.integration.gateway_support import auth, running_gateway, wait_until
from tests.fixtures.jobs import tiny_job_spec

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(900)]


def test_gateway_runs_a_real_job_to_completion(tmp_path, tiny_model):
    from services.data import synthetic
    from services.data.parquet import write_rows

    train = write_rows(synthetic.arith_rows(64, seed=0, split="train"), tmp_path / "data" / "train.parquet")
    spec = tiny_job_spec("gateway-real", tiny_model, train, total_steps=2)
    with running_gateway(tmp_path, LocalLauncher(), grpc=False, input_roots=[tmp_path, Path(tiny_model).parent]) as gw, \
            httpx.Client(base_url=gw.http_url, timeout=10) as c:  # fmt: skip
        r = c.post("/v1/jobs", content=yaml.safe_dump(spec).encode(),
                   headers={**auth(), "Content-Type": "application/yaml"})  # fmt: skip
        assert r.status_code == 201, r.text
        jid = r.json()["id"]
        job = wait_until(
            lambda: (j := c.get(f"/v1/jobs/{jid}", headers=auth()).json())["state"] in ("succeeded", "failed") and j,
            timeout=800, what="the real job to finish",
        )
        assert job["state"] == "succeeded", job["detail"][-3000:]
        assert job["exit_code"] == 0 and job["progress"]["step"] == 2 and job["progress"]["total_steps"] == 2
        assert c.get(f"/v1/jobs/{jid}/metrics", headers=auth()).json()["points"]
