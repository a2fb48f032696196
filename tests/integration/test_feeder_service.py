"""The prompt feeder service (`python -m feeder_svc`, as `meshrl run`, docker-compose and
Kubernetes run it) on a private Redis: it fills the prompts stream up to its admission bound and
feeds more only as the queue's sample ledger says prompts finished (the stages a replica and
the trainer record, written here by the test standing in for them)."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest
import yaml

from meshrl_cli import main as cli_main
from services.net import terminate_then_kill
from services.readiness import OutputWatcher
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


def write_feeder_views(tmp_path, redis_server, tiny_model, *, name: str, rows: int, batch: int) -> None:
    """A job of ``rows`` arithmetic prompts, ``batch`` per step, ``max_staleness: 1``, on the
    test's Redis; its views under ``tmp_path / "views"``."""
    from services.data import synthetic
    from services.data.parquet import write_rows

    train = write_rows(synthetic.arith_rows(rows, seed=0, split="train"), tmp_path / "train.parquet")
    spec = {
        "name": name,
        "model": {"path": tiny_model},
        "data": {"train_files": [str(train)], "max_prompt_length": 32, "train_batch_size": batch},
        "async": {"max_staleness": 1},
        "rollout": {"n": 2},
        "actor": {"ppo_mini_batch_size": batch},
        "queues": {"type": "redis", "url": redis_server.url, "namespace": name.replace("-", "")},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    assert cli_main(["views", str(tmp_path / "job.yaml"), "--out", str(tmp_path / "views")]) == 0


async def test_feeder_respects_admission_control(tmp_path, redis_server, tiny_model):
    write_feeder_views(tmp_path, redis_server, tiny_model, name="feed-test", rows=50, batch=4)
    # at most (max_staleness 1 + 1) * 4 = 8 prompts in flight
    proc = subprocess.Popen(
        [sys.executable, "-m", "feeder_svc", "--config", str(tmp_path / "views" / "feeder.yaml"),
         "--poll", "0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    output = OutputWatcher(proc)
    from services.config.queues import RedisQueueConfig
    from services.queues import make_queue

    replica = make_queue(RedisQueueConfig(url=redis_server.url, namespace="feedtest"), stream="prompts",
                         group="rollout", consumer="replica")
    try:
        port = output.wait(60).port("metrics")
        try:
            wait_until(lambda: _fed(port) == 8, timeout=60, what="the first 8 prompts")
        except AssertionError:
            raise AssertionError(output.text(60)) from None
        for _ in range(5):  # nothing finished: it must not feed more
            assert _fed(port) == 8
            time.sleep(0.2)
        assert httpx.get(f"http://127.0.0.1:{port}/ready", timeout=5).status_code == 200
        status = httpx.get(f"http://127.0.0.1:{port}/status", timeout=5).json()
        assert (status["prompts_fed"], status["in_flight"], status["max_in_flight"]) == (8, 8, 8)
        # a replica takes 3 prompts; the trainer trains their groups (n=2) and records it
        taken: list[str] = []
        while len(taken) < 3:
            got = await replica.get(max_items=3 - len(taken), timeout=10)
            assert got, "the prompts stream holds the 8 prompts fed"
            taken += [str(it.data.non_tensor_batch["uid"][0]) for it in got]
        await replica.record_stage([f"{u}/{k}" for u in taken for k in range(2)], "trained")
        wait_until(lambda: _fed(port) == 11, timeout=30, what="3 more prompts")
    finally:
        await replica.close()
        terminate_then_kill(proc, grace=20)
    assert proc.returncode == 0, output.text(40)
    assert output.ready is not None and output.ready.service == "feeder"


async def test_a_held_feeder_is_ready_and_feeds_only_once_released(tmp_path, redis_server, tiny_model):
    """``--hold FILE`` (how ``meshrl run`` starts the feeder beside the other services): the
    feeder does its imports and tokenizing and announces readiness, puts nothing while the
    file exists, and fills the admission window once it is gone."""
    write_feeder_views(tmp_path, redis_server, tiny_model, name="hold-test", rows=20, batch=2)
    # at most (max_staleness 1 + 1) * 2 = 4 prompts in flight
    hold = tmp_path / "feeder.hold"
    hold.touch()
    proc = subprocess.Popen(
        [sys.executable, "-m", "feeder_svc", "--config", str(tmp_path / "views" / "feeder.yaml"),
         "--poll", "0.1", "--hold", str(hold)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    output = OutputWatcher(proc)
    try:
        port = output.wait(60).port("metrics")
        for _ in range(5):  # ready, and holding: nothing fed
            assert _fed(port) in (0.0, -1.0)
            time.sleep(0.2)
        hold.unlink()
        try:
            wait_until(lambda: _fed(port) == 4, timeout=60, what="the admission window's 4 prompts")
        except AssertionError:
            raise AssertionError(output.text(60)) from None
    finally:
        terminate_then_kill(proc, grace=20)
    assert proc.returncode == 0, output.text(40)
