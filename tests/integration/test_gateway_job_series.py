"""The job-level series reach Prometheus through the gateway, the target the shipped
``deploy/prometheus/prometheus.yml`` (and ``deploy/k8s/monitoring.yaml``) scrape, for a job
run the compose/Kubernetes way: the gateway's ``deployment`` launcher hands the job to real
``meshrl worker`` processes over a shared RUNS_DIR, queues in a real Redis.

The services are stand-ins (``standin_service.py``: the real counter names on the real
ports, the real queue ledger in Redis); what is under test is the path from the workers'
reports through the launcher to the gateway's ``/metrics``: ``meshrl_job_ledger_samples_total``,
``meshrl_job_service_restarts_total`` (a worker whose container restarts), ``meshrl_job_stalled``
and ``meshrl_ledger_samples``. The real services run the same way in
``test_compose_podman.py``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway_svc.launchers.deployment import DeploymentLauncher
from services.net import free_port
from tests.integration.gateway_support import auth, running_gateway, wait_until
from tests.integration.test_deployment_launcher import Workers

pytestmark = pytest.mark.timeout(240)

HERE = Path(__file__).resolve().parent
ROLES = ("trainer", "rollout", "reward", "feeder")


def scrape_gateway(url: str) -> dict[str, dict[frozenset, float]]:
    """The gateway's /metrics as Prometheus reads it (bearer token, as prometheus.yml sends it)."""
    r = httpx.get(f"{url}/metrics", headers=auth(), timeout=5)
    assert r.status_code == 200, r.text
    out: dict[str, dict[frozenset, float]] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return out


def scraped_when(url: str, name: str, want: float, **labels: str):
    """A predicate for wait_until: the gateway's scrape once ``name{labels}`` equals ``want``."""

    def pred():
        s = scrape_gateway(url)
        return s if value(s, name, **labels) == want else None

    return pred


def value(series: dict, name: str, **labels: str) -> float | None:
    for ls, v in series.get(name, {}).items():
        if set(labels.items()) <= set(ls):
            return v
    return None


def test_a_deployment_jobs_series_are_on_the_gateways_metrics(tmp_path, redis_server):
    ports = {role: free_port() for role in ROLES}
    wiring = {
        "services": {"host": "127.0.0.1", "trainer": {"metrics_port": ports["trainer"]},
                     "rollout": {"metrics_port": ports["rollout"], "grpc_port": free_port()},
                     "reward": {"metrics_port": ports["reward"], "grpc_port": free_port()},
                     "feeder": {"metrics_port": ports["feeder"]}},
        "queues": {"type": "redis", "url": redis_server.url},
        "trainer": {"default_local_dir": str(tmp_path / "ckpt" / "{job_id}")},
    }  # fmt: skip
    (tmp_path / "t.parquet").write_bytes(b"")
    spec = {"name": "series", "model": {"path": str(tmp_path)},
            "data": {"train_files": [str(tmp_path / "t.parquet")], "train_batch_size": 4},
            "actor": {"ppo_mini_batch_size": 4}, "rollout": {"n": 2},
            "services": {"restart": {"stall_warn_s": 3}}}  # fmt: skip
    launcher = DeploymentLauncher(wiring, stop_timeout_s=10)
    runs = tmp_path / "runs"
    runs.mkdir()
    workers = Workers(runs)
    try:
        with running_gateway(tmp_path, launcher, grpc=False) as gw:
            for role in ROLES:
                workers.start(role, sys.executable, str(HERE / "standin_service.py"), role, "{view}",
                              ends_job=role == "trainer", scrape="0.2")
            r = httpx.post(f"{gw.http_url}/v1/jobs", json={"spec": spec}, headers=auth(), timeout=10)
            assert r.status_code == 201, r.text
            jid = r.json()["id"]
            run_dir = runs / jid

            def counted():
                s = scrape_gateway(gw.http_url)
                got = {st: value(s, "meshrl_job_ledger_samples_total", job_id=jid, stage=st)
                       for st in ("fed", "generated", "scored", "trained")}
                return s if all(v for v in got.values()) and value(
                    s, "meshrl_ledger_samples", job_id=jid, stage="scored") == 2 else None

            s = wait_until(counted, timeout=60, what="the job ledger on the gateway's /metrics")
            assert value(s, "meshrl_job_stalled", job_id=jid) == 0
            assert value(s, "meshrl_job_ledger_samples_total", job_id=jid, stage="fed") % 2 == 0  # prompts x rollout.n
            assert {dict(ls)["service"] for ls in s["meshrl_job_service_restarts_total"]} >= {
                "trainer-0", "rollout-1", "reward-2", "feeder-3"}
            assert all(v == 0 for v in s["meshrl_job_service_restarts_total"].values())

            # The rollout worker's container dies (worker and service killed) and comes back:
            # one restart, and its samples carry on from where they were.
            before = value(s, "meshrl_job_ledger_samples_total", job_id=jid, stage="generated")
            report = yaml.safe_load((run_dir / "workers" / "rollout-1.json").read_text())
            workers.procs[1].kill()
            workers.procs[1].wait(timeout=10)
            os.killpg(int(report["pid"]), signal.SIGKILL)
            time.sleep(0.5)  # the port is free again
            workers.start("rollout", sys.executable, str(HERE / "standin_service.py"), "rollout",
                          "{view}", scrape="0.2", name="rollout-1")
            wait_until(scraped_when(gw.http_url, "meshrl_job_service_restarts_total", 1, job_id=jid,
                                    service="rollout-1"), timeout=30, what="the rollout worker's restart")
            wait_until(lambda: value(scrape_gateway(gw.http_url), "meshrl_job_ledger_samples_total", job_id=jid,
                                     stage="generated") > before + 5, timeout=30, what="samples after the restart")
            s = scrape_gateway(gw.http_url)
            assert value(s, "meshrl_job_service_restarts_total", job_id=jid, service="trainer-0") == 0

            # Nothing moves any more though every service runs: stalled after stall_warn_s.
            (run_dir / "freeze").touch()
            wait_until(scraped_when(gw.http_url, "meshrl_job_stalled", 1, job_id=jid), timeout=30, what="the stall")
            job = httpx.get(f"{gw.http_url}/v1/jobs/{jid}", headers=auth(), timeout=5).json()
            assert job["detail"].startswith("stalled: no progress"), job["detail"]
            assert job["progress"]["stalled"] is True

            # The trainer ends the job; its final counts stay on /metrics, no longer stalled.
            (run_dir / "finish").touch()
            wait_until(lambda: httpx.get(f"{gw.http_url}/v1/jobs/{jid}", headers=auth(), timeout=5)
                       .json()["state"] == "succeeded", timeout=60, what="the job to finish")  # fmt: skip
            s = scrape_gateway(gw.http_url)
            assert value(s, "meshrl_job_stalled", job_id=jid) == 0
            assert value(s, "meshrl_job_ledger_samples_total", job_id=jid, stage="trained") > 0
            assert value(s, "meshrl_gateway_jobs", state="succeeded") == 1
    finally:
        workers.stop()
