"""LoRA on the trainer, on real gloo ranks (``lora_step_job.py``) with the tiny model:

- only the adapter's parameters change, the base stays bit for bit (frozen), and the
  optimizer holds exactly the adapter;
- the reference policy is the base model: its log-probs equal a plain Hugging Face model's
  of the starting checkpoint, while the trained actor's differ;
- what the trainer publishes is the adapter alone, by PEFT's saved names;
- 2 ranks (FSDP2) give the update 1 rank gives;
- a checkpoint holds only the adapter (and its optimizer state), and resuming from it
  reproduces the next step exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

JOB = str(Path(__file__).with_name("lora_step_job.py"))


def _spec(model: str) -> dict:
    # one optimizer step per training step: the rows of a mini-batch are then the same at any rank count
    return {"model": {"path": model, "lora_rank": 8, "lora_alpha": 16},
            "data": {"train_batch_size": 4}, "rollout": {"n": 2},
            "actor": {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 2, "use_kl_loss": True,
                      "kl_loss_coef": 0.1, "optim": {"lr": 1e-2, "lr_warmup_steps": 0}}}


def _run(tmp: Path, spec: dict, nproc: int, *extra: str) -> tuple[dict, dict, dict]:
    from safetensors.torch import load_file

    from trainer_svc.launch import spawn_ranks

    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "spec.json").write_text(json.dumps(spec))
    code = spawn_ranks([JOB, str(tmp / "spec.json"), str(tmp / "out"), *extra], nproc, threads=1, timeout_s=500)
    assert code == 0, f"{nproc}-rank LoRA job failed with exit code {code}"
    out = tmp / "out"
    return (json.loads((out / "result.json").read_text()), load_file(str(out / "adapter.safetensors")),
            load_file(str(out / "probe.safetensors")))


@pytest.fixture(scope="module")
def runs(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    spec = _spec(tiny_model)
    return {
        "one": _run(root / "one", spec, 1, "--steps", "2"),
        "two": _run(root / "two", spec, 2, "--steps", "2"),
        "first": _run(root / "first", spec, 2, "--steps", "1", "--save", str(root / "ckpt")),
        "resumed": _run(root / "resumed", spec, 2, "--steps", "1", "--first", "1", "--load", str(root / "ckpt")),
        "ckpt": root / "ckpt",
    }


@pytest.mark.parametrize("which", ["one", "two"])
def test_only_the_adapter_trains_and_is_published(runs, which):
    res, adapter, _ = runs[which]
    assert res["model_class"].endswith("PeftModelForCausalLM")
    assert [s["version"] for s in res["steps"]] == [1, 2] and all(s["applied"] for s in res["steps"])
    lora = [n for n in res["param_names"] if ".lora_A." in n or ".lora_B." in n]
    base = [n for n in res["param_names"] if n not in lora]
    assert lora and base
    assert res["changed"], "nothing trained"
    assert set(res["changed"]) <= set(lora), f"base parameters changed: {set(res['changed']) - set(lora)}"
    # every targeted layer (all-linear: q, k, v, o, gate, up, down of both blocks) learned
    assert {n for n in res["changed"] if ".lora_B." in n} == {n for n in lora if ".lora_B." in n}
    assert res["optimizer_numel"] == res["trainable_numel"] == sum(t.numel() for t in adapter.values())
    assert res["trainable_numel"] < res["total_numel"] / 10
    # published: the adapter only, named as PEFT saves it (what vLLM's LoRA loader reads)
    assert len(adapter) == len(lora) == 2 * 7 * 2
    assert all(n.startswith("base_model.model.model.layers.") and n.endswith((".lora_A.weight", ".lora_B.weight"))
               for n in adapter), sorted(adapter)[:3]
    assert res["published_bytes"] == sum(t.numel() * t.element_size() for t in adapter.values())


def test_reference_policy_is_the_base_model_with_the_adapter_off(runs, tiny_model):
    from transformers import AutoModelForCausalLM

    from trainer_svc.actor import forward_log_probs

    _, _, probe = runs["two"]
    plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    with torch.no_grad():
        _, base_lp = forward_log_probs(plain, {k: probe[k] for k in ("input_ids", "attention_mask", "position_ids",
                                                                     "responses")}, 1.0, False)
    m = probe["mask"]
    assert (probe["ref"] - base_lp)[m].abs().max() < 1e-5
    assert (probe["actor"] - probe["ref"])[m].abs().max() > 1e-3  # the adapter moved the policy


def test_two_ranks_update_like_one(runs):
    one, a1, p1 = runs["one"]
    two, a2, p2 = runs["two"]
    for s1, s2 in zip(one["steps"], two["steps"]):
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/entropy"):
            assert s2["metrics"][key] == pytest.approx(s1["metrics"][key], rel=1e-4, abs=1e-6), key
    assert set(a1) == set(a2)
    # Adam moves each element by about lr * m / sqrt(v): an element whose gradient is ~0 (all
    # of lora_A's are at step 1, as lora_B starts at 0) moves by up to lr either way depending
    # on the summation order. Nearly every element must agree, and the policies they make must.
    for name in a1:
        assert float(((a2[name] - a1[name]).abs() > 1e-6).float().mean()) < 0.01, name
    torch.testing.assert_close(p2["actor"], p1["actor"], rtol=1e-4, atol=1e-5)


def test_checkpoint_holds_the_adapter_and_resume_is_exact(runs):
    from torch.distributed.checkpoint import FileSystemReader

    two, adapter_two, probe_two = runs["two"]
    resumed, adapter_resumed, probe_resumed = runs["resumed"]
    assert resumed["resumed_from"] == 1 and [s["version"] for s in resumed["steps"]] == [2]
    for key in ("actor/pg_loss", "actor/loss", "actor/grad_norm", "actor/lr", "actor/entropy", "actor/kl_loss"):
        assert resumed["steps"][0]["metrics"][key] == pytest.approx(two["steps"][1]["metrics"][key],
                                                                    rel=1e-5, abs=1e-7), key
    for name in adapter_two:
        torch.testing.assert_close(adapter_resumed[name], adapter_two[name], rtol=1e-6, atol=1e-7, msg=name)
    # the checkpoint: the adapter and its optimizer moments, no base weight
    step = runs["ckpt"] / "global_step_1"
    keys = list(FileSystemReader(str(step / "model")).read_metadata().state_dict_metadata)
    model_keys = [k for k in keys if k.startswith("actor.model.")]
    assert any(".lora_A." in k for k in model_keys) and any(".lora_B." in k for k in model_keys)
    base = [k for k in model_keys if ".lora_A." not in k and ".lora_B." not in k and "rotary_emb" not in k]
    assert not base, base[:5]  # (the tiny model's tied lm_head among them: frozen too)
    assert any(k.startswith("actor.optim.state.") and "exp_avg" in k for k in keys)
    state = json.loads((step / "state.json").read_text())
    assert state["lora"] == {"rank": 8, "alpha": 16.0, "target_modules": "all-linear"}


def test_export_writes_a_peft_adapter_and_a_merged_model(runs, tiny_model, tmp_path):
    """``meshrl export`` of the LoRA checkpoint: the PEFT adapter directory loads with peft over
    the base model, ``--merged`` a plain transformers model; both give the trainer's log-probs."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from trainer_svc.actor import forward_log_probs
    from trainer_svc.hf_export import export_hf

    _, published, probe = runs["first"]  # the policy the checkpoint of step 1 holds
    batch = {k: probe[k] for k in ("input_ids", "attention_mask", "position_ids", "responses")}
    m = probe["mask"]

    adapter_dir = export_hf(runs["ckpt"], tmp_path / "adapter", model_dir=tiny_model)
    assert (adapter_dir / "adapter_config.json").is_file() and not (adapter_dir / "model.safetensors").exists()
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert (cfg["r"], cfg["lora_alpha"], cfg["peft_type"]) == (8, 16.0, "LORA")
    assert sorted(cfg["target_modules"]) == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj",
                                             "v_proj"]
    from safetensors.torch import load_file

    exported = load_file(str(adapter_dir / "adapter_model.safetensors"))
    assert set(exported) == set(published)
    for name in published:
        assert torch.equal(exported[name], published[name]), name
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    with torch.no_grad():
        _, lp = forward_log_probs(peft_model, batch, 1.0, False)
    assert (lp - probe["actor"])[m].abs().max() < 1e-5

    merged_dir = export_hf(runs["ckpt"], tmp_path / "merged", model_dir=tiny_model, merged=True)
    assert (merged_dir / "model.safetensors").is_file() and not (merged_dir / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir), dtype=torch.float32).eval()
    assert not any("lora" in n for n, _ in merged.named_parameters())
    with torch.no_grad():
        _, lp = forward_log_probs(merged, batch, 1.0, False)
    assert (lp - probe["actor"])[m].abs().max() < 1e-4
