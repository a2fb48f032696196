"""The reward service end to end: real redis-server, real gRPC, real HTTP probes, real CLI."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import grpc
import pytest
import yaml

from reward_svc.decode import load_decoder
from reward_svc.server import RewardServer
from services import wire
from services.config.queues import RedisQueueConfig
from services.config.reward import RewardConfig
from services.config.views import RewardProcess
from services.queues import make_queue
from services import auth
from services.readiness import OutputWatcher
from tests.unit.reward_common import last_valid_index, make_group, write_tokenizer

NO_GRPC = RewardProcess(grpc_port=None)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return write_tokenizer(tmp_path_factory.mktemp("reward_svc_tok"))


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{") and line.split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def drain(q, want: int, timeout: float = 20.0):
    """Lease and ack ``want`` items from ``q`` (fail if they do not come in time)."""
    got = []
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while len(got) < want and loop.time() < end:
        items = await q.get(want - len(got), 0.5)
        await q.ack(items)
        got += items
    assert len(got) == want, f"got {len(got)} of {want} items"
    return got


@pytest.mark.redis
async def test_queue_path_scores_drops_malformed_and_acks(redis_server, tok_dir):
    qcfg = RedisQueueConfig(url=redis_server.url, namespace="rw1")
    server = await RewardServer(RewardConfig(get_timeout_s=0.2), load_decoder(tok_dir), queue_cfg=qcfg, consumer="r0").start()
    producer = make_queue(qcfg, stream="rollouts", group="reward", consumer="rollout-0")
    trainer = make_queue(qcfg, stream="experience", group="trainer", consumer="trainer-0")
    try:
        g1 = make_group(tok_dir, ["#### 3", "#### 4", "so 3"], ["3"] * 3, uid="u1")
        bad = make_group(tok_dir, ["#### 3"], ["3"], uid="bad")
        bad.non_tensor_batch.pop("reward_model")
        g2 = make_group(tok_dir, ["12+7=19", "19", "18"], ["19"] * 3, "meshrl/arith", uid="u2")
        from services.queues import RawItem

        await producer.put([g1, bad])
        await producer.put_frames([RawItem(b"MRLW\x01\x00not a frame at all", ("junk/0",))])  # garbage bytes
        await producer.put([g2])
        loop = asyncio.get_running_loop()
        end = loop.time() + 30
        while await producer.depth() > 0 and loop.time() < end:
            await server.step()
        got = await drain(trainer, 2)
        by_uid = {it.data.non_tensor_batch["uid"][0]: it.data for it in got}
        assert set(by_uid) == {"u1", "u2"}
        for uid, want in (("u1", [1.0, 0.0, 0.0]), ("u2", [1.0, 1.0, 0.0])):
            d = by_uid[uid]
            tls = d.batch["token_level_scores"]
            last = last_valid_index(d)
            assert [tls[i, last[i]].item() for i in range(3)] == want
            assert tls.sum().item() == sum(want)
            assert list(d.non_tensor_batch["sample_id"]) == [f"{uid}/{i}" for i in range(3)]
        assert await producer.depth() == 0  # scored groups acked, the malformed one dropped
        status, text = http_get(server.http.port, "/metrics")
        assert status == 200
        assert metric(text, "meshrl_reward_samples_total") == 6.0
        assert 'meshrl_reward_malformed_total{path="queue"} 1.0' in text
        assert 'meshrl_reward_score_mean{data_source="meshrl/arith"} 0.666' in text
        assert http_get(server.http.port, "/ready")[0] == 200
        assert http_get(server.http.port, "/health")[0] == 200
    finally:
        for q in (producer, trainer):
            await q.close()
        await server.stop()


@pytest.mark.redis
async def test_validation_groups_go_to_the_validation_stream(redis_server, tok_dir):
    """A group generated for validation (meta_info validate=true) is scored and routed to
    ``validation`` (read by the controller), never to the trainer's ``experience``."""
    qcfg = RedisQueueConfig(url=redis_server.url, namespace="rwv")
    server = await RewardServer(RewardConfig(get_timeout_s=0.2), load_decoder(tok_dir), queue_cfg=qcfg, consumer="r0").start()
    producer = make_queue(qcfg, stream="rollouts", group="reward", consumer="rollout-0")
    trainer = make_queue(qcfg, stream="experience", group="trainer", consumer="trainer-0")
    validation = make_queue(qcfg, stream="validation", group="controller", consumer="controller")
    try:
        val = make_group(tok_dir, ["#### 3", "#### 5"], ["3", "3"], uid="job-val0-p0")
        val.meta_info["validate"] = True
        await producer.put([val, make_group(tok_dir, ["#### 1"], ["1"], uid="train-0")])
        loop = asyncio.get_running_loop()
        end = loop.time() + 30
        while await producer.depth() > 0 and loop.time() < end:
            await server.step()
        (got,) = await drain(validation, 1)
        assert got.data.non_tensor_batch["uid"][0] == "job-val0-p0" and got.data.meta_info["validate"] is True
        assert got.data.batch["token_level_scores"].sum(-1).tolist() == [1.0, 0.0]
        (trained,) = await drain(trainer, 1)
        assert trained.data.non_tensor_batch["uid"][0] == "train-0"
        assert await trainer.depth() == 0 and await validation.depth() == 0
    finally:
        for q in (producer, trainer, validation):
            await q.close()
        await server.stop()


@pytest.mark.redis
async def test_input_acked_only_after_output_put(redis_server, tok_dir):
    """A full output stream: the put fails, the input stays leased, and is scored later."""
    qcfg = RedisQueueConfig(url=redis_server.url, namespace="rw2", max_depth=1, put_timeout_s=0.3, lease_idle_s=0.5)
    cfg = RewardConfig(get_timeout_s=0.2)
    server = await RewardServer(cfg, load_decoder(tok_dir), queue_cfg=qcfg, consumer="r0", resources=NO_GRPC).start()
    producer = make_queue(qcfg, stream="rollouts", group="reward", consumer="rollout-0")
    trainer = make_queue(qcfg, stream="experience", group="trainer", consumer="trainer-0")
    try:
        await trainer.put([make_group(tok_dir, ["x"], ["1"], uid="blocker")])  # experience is full
        await producer.put([make_group(tok_dir, ["#### 1"], ["1"], uid="u1")])
        assert await server.step() == 1
        assert metric(http_get(server.http.port, "/metrics")[1], "meshrl_reward_put_failures_total") == 1.0
        assert await producer.depth() == 1  # not acked: nothing lost
        await drain(trainer, 1)  # the trainer makes room
        for _ in range(40):
            await server.step()  # reclaims the idle lease after lease_idle_s
            if await producer.depth() == 0:
                break
        got = await drain(trainer, 1)
        assert got[0].data.non_tensor_batch["uid"][0] == "u1"
        assert got[0].data.batch["token_level_scores"].sum().item() == 1.0
    finally:
        for q in (producer, trainer):
            await q.close()
        await server.stop()


async def test_grpc_score_and_malformed_frames(tok_dir):
    from services.pb import reward_pb2, reward_pb2_grpc

    server = await RewardServer(RewardConfig(), load_decoder(tok_dir)).start()
    try:
        async with auth.aio_channel(f"127.0.0.1:{server.grpc_port}", auth.current()) as ch:
            stub = reward_pb2_grpc.RewardServiceStub(ch)
            g = make_group(tok_dir, [r"\boxed{\dfrac12}", r"\boxed{3}"], [r"\frac{1}{2}", "4"], "lighteval/MATH")
            rep = await stub.Score(reward_pb2.RewardScoreRequest(frame=bytes(wire.encode(g))), timeout=30)
            assert rep.num_samples == 2 and rep.num_errors == 0 and rep.mean_score == 0.5
            out = wire.decode(bytearray(rep.frame))
            assert out.batch["token_level_scores"].sum(-1).tolist() == [1.0, 0.0]
            assert list(out.non_tensor_batch["error"]) == ["", ""]

            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await stub.Score(reward_pb2.RewardScoreRequest(frame=b"MRLW\x01\x00garbage"), timeout=30)
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "malformed frame" in ei.value.details()

            g.non_tensor_batch.pop("data_source")
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await stub.Score(reward_pb2.RewardScoreRequest(frame=bytes(wire.encode(g))), timeout=30)
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "data_source" in ei.value.details()

            ok = make_group(tok_dir, ["#### 2"], ["2"])  # the service still serves
            rep = await stub.Score(reward_pb2.RewardScoreRequest(frame=bytes(wire.encode(ok))), timeout=30)
            assert rep.mean_score == 1.0
        text = http_get(server.http.port, "/metrics")[1]
        assert 'meshrl_reward_malformed_total{path="grpc"} 2.0' in text
    finally:
        await server.stop()


@pytest.mark.redis
async def test_cli_service_process(redis_server, tok_dir, tmp_path):
    """``python -m reward_svc --config FILE`` with a user function, against a real redis-server."""
    user = tmp_path / "user_reward.py"
    user.write_text(
        "import os\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
        "    if 'die' in solution_str:\n"
        "        os.kill(os.getpid(), 9)\n"
        "    return {'score': float(solution_str.strip() == ground_truth) * kw['scale'], 'len': len(solution_str)}\n"
    )
    cfg = {
        "reward": {
            "tokenizer_path": tok_dir,
            "custom_reward_function": {"path": str(user), "reward_kwargs": {"scale": 2.0}},
            "num_workers": 1,
            "memory_limit_mb": 512,
            "get_timeout_s": 0.2,
        },
        "queues": {"type": "redis", "url": redis_server.url, "namespace": "rwcli"},
    }
    path = tmp_path / "reward.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "reward_svc", "--config", str(path), "--id", "cli-0", "resources.grpc_port=null"],
        stdout=subprocess.PIPE, text=True, env=env,
    )
    output = OutputWatcher(proc)
    qcfg = RedisQueueConfig(url=redis_server.url, namespace="rwcli")
    producer = make_queue(qcfg, stream="rollouts", group="reward", consumer="rollout-0")
    trainer = make_queue(qcfg, stream="experience", group="trainer", consumer="trainer-0")
    try:
        ready = await asyncio.to_thread(output.wait, 60)
        assert (ready.service, ready.id, sorted(ready.addresses)) == ("reward", "cli-0", ["metrics"])  # gRPC off
        port = ready.port("metrics")
        await producer.put([make_group(tok_dir, ["7", "die", "8"], ["7"] * 3, "my/task", uid="c1")])
        (item,) = await drain(trainer, 1, timeout=60)
        d = item.data
        assert d.batch["token_level_scores"].sum(-1).tolist() == [2.0, 0.0, 0.0]
        assert [e.get("len") for e in d.non_tensor_batch["reward_extra_info"]] == [1, None, 1]
        assert d.non_tensor_batch["error"][1].startswith("reward crash:")
        text = http_get(port, "/metrics")[1]
        assert 'meshrl_reward_errors_total{kind="crash"} 1.0' in text
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        for q in (producer, trainer):
            await q.close()
    assert code == 0


def test_bad_reward_function_fails_at_start_with_a_clear_message(tok_dir, tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"reward": {"tokenizer_path": tok_dir, "custom_reward_function": {"path": str(tmp_path / "nope.py")},
                                               "num_workers": 1}, "resources": {"grpc_port": None}}))
    out = subprocess.run([sys.executable, "-m", "reward_svc", "--config", str(path), "--no-queue"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "cannot start" in out.stderr and "nope.py" in out.stderr and "does not exist" in out.stderr


async def _shut(stop: asyncio.Event, loop_task: asyncio.Task, server: RewardServer, *queues) -> None:
    """Stop the service loop, close the test's queues, stop the server."""
    stop.set()
    await asyncio.wait_for(loop_task, 30)
    for q in queues:
        await q.close()
    await server.stop()


async def test_queue_path_on_the_embedded_broker(broker, tok_dir):
    """The same service loop on the embedded gRPC broker (the one-machine default)."""
    from services.config.queues import EmbeddedQueueConfig

    qcfg = EmbeddedQueueConfig(address=broker.address)
    server = await RewardServer(RewardConfig(get_timeout_s=0.2), load_decoder(tok_dir), queue_cfg=qcfg,
                                consumer="r0", resources=NO_GRPC).start()
    producer = make_queue(qcfg, stream="rollouts", group="reward", consumer="rollout-0")
    trainer = make_queue(qcfg, stream="experience", group="trainer", consumer="trainer-0")
    stop = asyncio.Event()
    loop_task = asyncio.create_task(server.run(stop))
    try:
        await producer.put([make_group(tok_dir, ["#### 1", "#### 2"], ["1", "1"], uid=f"e{i}") for i in range(3)])
        got = await drain(trainer, 3)
        assert sorted(it.data.non_tensor_batch["uid"][0] for it in got) == ["e0", "e1", "e2"]
        assert all(it.data.batch["token_level_scores"].sum(-1).tolist() == [1.0, 0.0] for it in got)
        assert await producer.depth() == 0
    finally:
        await _shut(stop, loop_task, server, producer, trainer)


@pytest.mark.redis
async def test_stop_is_prompt_even_when_redis_is_gone(redis_server, tok_dir):
    """SIGTERM-style stop while the backend is dead: run() and stop() return promptly."""
    qcfg = RedisQueueConfig(url=redis_server.url, namespace="rwstop", op_timeout_s=30.0)
    server = await RewardServer(RewardConfig(get_timeout_s=5.0), load_decoder(tok_dir), queue_cfg=qcfg,
                                consumer="r0", resources=NO_GRPC).start()
    stop = asyncio.Event()
    task = asyncio.create_task(server.run(stop))
    await asyncio.sleep(0.3)  # the reader is blocked in a 5 s get
    redis_server.kill()
    await asyncio.sleep(0.3)
    stop.set()
    await asyncio.wait_for(task, 10.0)  # a deadline far below op_timeout_s + get_timeout_s
    await asyncio.wait_for(server.stop(), 15.0)


@pytest.mark.redis
async def test_an_own_lease_handed_back_while_its_batch_scores_is_not_scored_twice(broker, tok_dir, tmp_path):
    """Scoring outlasts ``lease_idle_s`` (a slow reward function): the worker's own get hands
    the groups it is scoring back to it. They are scored and delivered once."""
    from services.config.queues import EmbeddedQueueConfig

    slow = tmp_path / "slow_reward.py"
    slow.write_text("import time\n"
                    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    time.sleep(0.5)\n"
                    "    return 1.0\n")
    qcfg = EmbeddedQueueConfig(address=broker.address, lease_idle_s=0.3)
    cfg = RewardConfig(get_timeout_s=0.1, get_batch=1, custom_reward_function={"path": str(slow)}, call_timeout_s=10)
    server = await RewardServer(cfg, load_decoder(tok_dir), queue_cfg=qcfg, consumer="r0", resources=NO_GRPC).start()
    producer = make_queue(qcfg, stream="rollouts", group="reward", consumer="rollout-0")
    trainer = make_queue(EmbeddedQueueConfig(address=broker.address), stream="experience", group="trainer",
                         consumer="trainer-0")
    await trainer.depth()  # the trainer's group exists before anything is put
    stop = asyncio.Event()
    loop_task = asyncio.create_task(server.run(stop))
    try:
        await producer.put([make_group(tok_dir, ["#### 1", "#### 2"], ["1", "1"], uid=f"s{i}") for i in range(2)])
        got = await drain(trainer, 2)
        await asyncio.sleep(2.0)  # a second scoring of either group would have been put by now
        assert sorted(it.data.non_tensor_batch["uid"][0] for it in got) == ["s0", "s1"]
        assert await trainer.depth() == 0
        scored = server.metrics.registry.get_sample_value("meshrl_reward_samples_total")
        assert scored == 4, scored  # 2 groups x 2 samples, each scored once
    finally:
        await _shut(stop, loop_task, server, producer, trainer)
