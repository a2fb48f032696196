"""``python -m trainer_svc`` end to end on a real Redis ``experience`` stream, 2 gloo ranks:
checkpoint -> SIGKILL -> resume reproduces the next step exactly; the new version reaches a
real weight receiver bit for bit; SIGTERM checkpoints and exits cleanly; /health, /ready
and /metrics are served."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from services.readiness import OutputWatcher

pytestmark = [pytest.mark.redis, pytest.mark.distributed, pytest.mark.slow]

N_PER_STEP = 2  # groups per step


class Trainer:
    """A ``python -m trainer_svc`` process tree we started (its own session, so we can kill it)."""

    def __init__(self, config: Path, *overrides: str) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainer_svc", "--config", str(config), *overrides],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env,
        )
        self.output = OutputWatcher(self.proc)
        self.lines = self.output.lines

    def wait_for(self, pred, what: str, timeout: float = 400.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = pred()
            if got:
                return got
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"{what} did not happen (exit={self.proc.poll()}):\n{''.join(self.lines[-40:])}")

    def ready(self, timeout: float = 400.0):
        return self.output.wait(timeout)

    def ready_address(self) -> str:
        return self.ready().address("metrics")

    def kill_tree(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def wait(self, timeout: float = 400.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_tree(signal.SIGKILL)
            raise AssertionError(f"trainer did not exit:\n{''.join(self.lines[-40:])}") from None


def _steps(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


async def _put(url: str, namespace: str, first: int, count: int, vocab: int) -> None:
    from services.config.queues import RedisQueueConfig
    from services.queues import make_queue
    from trainer_svc.synthetic import make_group

    q = make_queue(RedisQueueConfig(url=url, namespace=namespace, op_timeout_s=5), stream="experience",
                   group="trainer", consumer="test-producer")
    groups = [make_group(f"u{i}", n=2, prompt_len=6, response_len=6, vocab_size=vocab, seed=i) for i in range(first, first + count)]
    await q.put(groups)
    await q.close()


def _config(tmp: Path, model: str, url: str, namespace: str, lora: bool = False) -> Path:
    spec = {
        "model": {"path": model, **({"lora_rank": 8, "lora_alpha": 16} if lora else {})},
        "data": {"train_batch_size": N_PER_STEP},
        "rollout": {"n": 2},
        "async": {"max_staleness": 10},
        "actor": {"ppo_mini_batch_size": 1, "ppo_micro_batch_size_per_gpu": 1, "optim": {"lr": 1e-3, "lr_warmup_steps": 2}},
        "resources": {"nproc": 2, "torch_threads": 1},
        "trainer": {"default_local_dir": str(tmp / "ckpt"),
                    "metrics_file": str(tmp / "steps.jsonl"), "collective_timeout_s": 60},
        "queues": {"type": "redis", "url": url, "namespace": namespace, "lease_idle_s": 0},
    }
    path = tmp / "trainer.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
async def test_kill_resume_reproduces_next_step_and_sigterm_checkpoints(tiny_model, redis_server, tmp_path, lora):
    """Full fine-tuning, and a LoRA adapter (model.lora_rank): then the checkpoint, the
    published versions and the snapshot a rejoining replica fetches are the adapter alone."""
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(tiny_model).vocab_size
    url = redis_server.url

    # A: uninterrupted, three steps.
    a = tmp_path / "a"
    a.mkdir()
    ns = "lora-" if lora else ""
    await _put(url, f"{ns}a", 0, 3 * N_PER_STEP, vocab)
    run = Trainer(_config(a, tiny_model, url, f"{ns}a", lora), "trainer.total_steps=3")
    assert run.wait() == 0, "".join(run.lines[-40:])
    steps_a = _steps(a / "steps.jsonl")
    assert [s["version"] for s in steps_a] == [1, 2, 3]

    # B1: two steps with a checkpoint after each, then SIGKILL while waiting for data.
    b = tmp_path / "b"
    b.mkdir()
    cfg_b = _config(b, tiny_model, url, f"{ns}b", lora)
    await _put(url, f"{ns}b", 0, 2 * N_PER_STEP, vocab)
    run = Trainer(cfg_b, "trainer.total_steps=4", "trainer.save_freq=1")
    latest = b / "ckpt" / "latest_checkpointed_iteration.txt"
    # (a step's metrics line is written after its checkpoint: it carries the checkpoint's time)
    run.wait_for(lambda: latest.exists() and latest.read_text() == "2" and len(_steps(b / "steps.jsonl")) == 2,
                 "checkpoint and metrics line of step 2")
    run.kill_tree(signal.SIGKILL)
    run.wait()
    assert len(_steps(b / "steps.jsonl")) == 2

    # B2: resume with a weight channel; a receiver subscribes; the third batch arrives;
    # step 3 must equal A's step 3, and version 3 must reach the receiver.
    run = Trainer(cfg_b, "trainer.total_steps=4", "trainer.save_freq=100", "weights.control_port=0", "weights.bucket_mb=1")
    ready = run.ready()
    addr, weights_addr = ready.address("metrics"), ready.address("weights")
    assert (ready.service, ready.info["world_size"], ready.info["device"]) == ("trainer", 2, "cpu")
    # before its first step it reports the version it resumed at (a supervisor compares the
    # replicas' served versions with it: 0 here would make every replica look stale)
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as r:
        assert "meshrl_trainer_policy_version 2.0" in r.read().decode()
    probe = Probe(weights_addr)
    probe.wait_event(lambda e: e["event"] == "welcome")
    await _put(url, f"{ns}b", 2 * N_PER_STEP, N_PER_STEP, vocab)
    run.wait_for(lambda: len(_steps(b / "steps.jsonl")) >= 3, "resumed step 3")
    step3 = _steps(b / "steps.jsonl")[2]
    assert step3["step"] == 3 and step3["version"] == 3
    for key in ("actor/pg_loss", "actor/loss", "actor/grad_norm", "actor/lr", "actor/entropy"):
        assert step3["metrics"][key] == pytest.approx(steps_a[2]["metrics"][key], rel=1e-5, abs=1e-7), key

    # the service surface
    with urllib.request.urlopen(f"http://{addr}/health", timeout=5) as r:
        assert r.status == 200
    with urllib.request.urlopen(f"http://{addr}/ready", timeout=5) as r:
        assert json.loads(r.read()) == {"ready": True}
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as r:
        text = r.read().decode()
    for name in ("meshrl_trainer_steps_total 1.0", "meshrl_trainer_policy_version 3.0",
                 'meshrl_trainer_phase_seconds_total{phase="wait"}', "meshrl_trainer_staleness_versions_bucket",
                 "meshrl_trainer_grad_norm", "meshrl_trainer_idle_ratio", "meshrl_trainer_dropped_stale_samples_total"):
        assert name in text, name

    # a replica that joins now catches up from the publisher's snapshot: version 3
    late = Probe(weights_addr, "r1", "--snapshot-first")
    caught_up = late.wait_event(lambda e: e["event"] == "snapshot" and e["version"] == 3)
    assert late.proc.wait(timeout=30) == 0
    published = next(line for line in run.lines if "weights v3: published" in line)
    assert ("(LoRA adapter)" if lora else "(full weights)") in published, published

    # SIGTERM while waiting for step 4's data: checkpoint of step 3, clean exit.
    run.kill_tree(signal.SIGTERM)
    assert run.wait() == 0, "".join(run.lines[-40:])
    assert latest.read_text() == "3"
    state = json.loads((b / "ckpt" / "global_step_3" / "state.json").read_text())
    assert state["version"] == 3 and state["extra"]["intake"]["samples_trained"] == 3 * N_PER_STEP * 2

    # the receiver got version 3, identical to the checkpointed weights
    got = probe.wait_event(lambda e: e["event"] in ("update", "snapshot") and e["version"] == 3)
    assert probe.proc.wait(timeout=30) == 0
    saved = _checkpoint_params(b / "ckpt" / "global_step_3" / "model", tmp_path / "full.pt")
    from rollout_svc.weights.probe import tensor_digest

    assert caught_up["digest"] == got["digest"]
    if lora:  # the adapter alone, by PEFT's saved names (the checkpoint's carry PEFT's adapter name)
        saved = {k.replace(".default.", "."): v for k, v in saved.items()}
        assert set(got["digest"]) == set(saved)
        assert all(".lora_A." in k or ".lora_B." in k for k in saved)
        assert "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight" in got["digest"]
    assert set(got["digest"]) <= set(saved), set(got["digest"]) - set(saved)
    assert lora or "model.layers.0.self_attn.q_proj.weight" in got["digest"]
    for name, digest in got["digest"].items():
        assert tensor_digest(saved[name]) == digest, name


def _checkpoint_params(dcp_dir: Path, out: Path) -> dict:
    """The actor parameters of a DCP checkpoint, by HF name (offline, no process group)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(dcp_dir), str(out))
    state = torch.load(out, weights_only=True)
    return {k[len("actor.model."):]: v for k, v in _flatten(state).items() if k.startswith("actor.model.")}


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


class Probe:
    """A real weight receiver process (``python -m rollout_svc.weights.probe``), until version 3."""

    def __init__(self, address: str, replica_id: str = "r0", *extra: str) -> None:
        cmd = [sys.executable, "-m", "rollout_svc.weights.probe", "--address", address, "--replica-id", replica_id,
               "--until-version", "3", "--timeout", "30", "--catch-up", *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        self.events: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def wait_event(self, pred, timeout: float = 300.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in list(self.events):
                if pred(e):
                    return e
            time.sleep(0.05)
        self.proc.kill()
        raise AssertionError(f"probe event not seen; exit={self.proc.poll()} events={self.events}")
