"""The standalone prompt feeder (`python -m services.launch.feeder_process`, used by docker-compose and
Kubernetes) on a private Redis: it fills the prompts stream up to its admission bound and
feeds more only as the trainer's /metrics (a real HTTP server standing in for the trainer)
reports finished samples."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter

from services.metrics.server import MetricsServer
from services.net import free_port, wait_for_port
from tests.integration.gateway_support import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]


def _fed(port: int) -> float:
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return -1.0
    for line in text.splitlines():
        if line.startswith("meshrl_feeder_prompts_total "):
            return float(line.split()[1])
    return -1.0


def test_feeder_respects_admission_control(tmp_path, redis_server, tiny_model):
    from services.data import synthetic
    from services.data.parquet import write_rows

    train = write_rows(synthetic.arith_rows(50, seed=0, split="train"), tmp_path / "train.parquet")
    spec = {
        "name": "feed-test",
        "model": {"path": tiny_model},
        "data": {"train_files": [str(train)], "max_prompt_length": 32, "train_batch_size": 4},
        "async": {"max_staleness": 1},  # at most (1 + 1) * 4 = 8 prompts in flight
        "rollout": {"n": 2},
        "actor": {"ppo_mini_batch_size": 4},
        "queues": {"type": "redis", "url": redis_server.url, "namespace": "feedtest"},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    registry = CollectorRegistry()
    samples = Counter("meshrl_trainer_samples", "stand-in trainer: samples trained on", registry=registry)
    trainer = MetricsServer(registry, port=0).start()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.launch.feeder_process", "--config", str(tmp_path / "job.yaml"),
         "--trainer-metrics", f"http://127.0.0.1:{trainer.port}/metrics", "--metrics-host", "127.0.0.1",
         "--metrics-port", str(port), "--poll", "0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_for_port("127.0.0.1", port, timeout=60, proc=proc)
        wait_until(lambda: _fed(port) == 8, timeout=60, what="the first 8 prompts")
        for _ in range(5):  # nothing finished: it must not feed more
            assert _fed(port) == 8
            time.sleep(0.2)
        assert httpx.get(f"http://127.0.0.1:{port}/ready", timeout=5).status_code == 200
        samples.inc(2 * 3)  # 3 prompts' groups (n=2) trained
        wait_until(lambda: _fed(port) == 11, timeout=30, what="3 more prompts")
    finally:
        proc.terminate()
        try:
            out = proc.communicate(timeout=20)[0].decode(errors="replace")
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate(timeout=10)[0].decode(errors="replace")
        trainer.stop()
    assert proc.returncode == 0, out[-2000:]
    assert "feeder ready" in out
