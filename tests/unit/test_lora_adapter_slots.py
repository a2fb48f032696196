"""Bookkeeping of an engine's adapter slots (rollout_svc/lora.py: AdapterSlots,
serving_problems): which job key holds which vLLM LoRA id, names that never repeat, and the
one-line refusals. No vLLM here; the engine side is tests/integration/test_rollout_multi_lora.py."""

from __future__ import annotations

import json

import pytest

from rollout_svc.lora import AdapterSlots, LoraServing, serving_problems

QWEN2 = {"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 128}


def test_keys_take_the_lowest_free_slot_and_give_it_back():
    slots = AdapterSlots(3)
    assert [slots.take(k) for k in ("a", "b", "c")] == [1, 2, 3]
    assert slots.free() == [] and len(slots) == 3 and "b" in slots
    assert slots.release("b") == 2
    assert "b" not in slots and slots.free() == [2]
    assert slots.take("d") == 2  # the freed slot is reused
    assert slots.slot("d") == 2 and sorted(slots.keys()) == ["a", "c", "d"]
    assert slots.release("a") == 1 and slots.release("c") == 3
    assert slots.take("e") == 1  # lowest first


def test_every_assignment_has_a_name_of_its_own():
    """A slot reused by another key (or the same key again) gets a new name: vLLM's prefix
    cache keys KV blocks by the LoRA's name, so nothing cached for the old holder is reused."""
    slots = AdapterSlots(2)
    slots.take("a")
    first = slots.name("a")
    slots.release("a")
    slots.take("b")
    assert slots.slot("b") == 1 and slots.name("b") != first
    slots.take("a")
    assert slots.name("a") not in (first, slots.name("b"))
    assert first.startswith("meshrl-s1-")


def test_full_engine_unknown_key_and_twice_the_same_key_are_refused_in_one_line():
    slots = AdapterSlots(2)
    slots.take("job-a")
    slots.take("job-b")
    with pytest.raises(RuntimeError) as full:
        slots.take("job-c")
    assert "\n" not in str(full.value) and "job-a" in str(full.value) and "all 2" in str(full.value)
    assert slots.free() == [] and "job-c" not in slots  # a refusal takes nothing
    with pytest.raises(ValueError, match="already holds slot 1"):
        slots.take("job-a")
    with pytest.raises(KeyError):
        slots.release("nobody")
    with pytest.raises(ValueError):
        slots.take("")
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError):
            AdapterSlots(bad)


def test_engine_args_ask_vllm_for_every_slot():
    args = LoraServing(rank=12, alpha=16, targets="all-linear").engine_args(4)
    assert args == {"enable_lora": True, "max_loras": 4, "max_cpu_loras": 4, "max_lora_rank": 16}
    assert LoraServing(rank=8, alpha=16, targets="all-linear").engine_args()["max_loras"] == 1  # one job: as before


def test_adapters_of_other_ranks_and_targets_fit_refusals_are_one_line(tmp_path):
    ok = [LoraServing(8, 16, "all-linear"), LoraServing(4, 8, ["q_proj", "v_proj"]), LoraServing(1, 2, ["down_proj"])]
    for job in ok:
        assert serving_problems(job, 8, QWEN2) == []
    assert serving_problems(LoraServing(16, 32, "all-linear"), 8, QWEN2) == [
        "adapter rank 16 exceeds this engine's max_lora_rank 8 (start the engine with a LoRA rank at least as large)"]
    bad = {
        "unknown module": LoraServing(4, 8, ["q_proj", "nope"]),
        "lm head": LoraServing(4, 8, ["lm_head"]),
        "rank 0": LoraServing(0, 8, "all-linear"),
        "rank above a layer's width": LoraServing(40, 8, ["k_proj"]),  # k_proj: 64 -> 32
    }
    for what, job in bad.items():
        problems = serving_problems(job, 64, QWEN2)
        assert problems and all("\n" not in p for p in problems), what
    # a starting adapter whose own config disagrees with the job's keys
    d = tmp_path / "adapter"
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
                                                       "target_modules": ["q_proj"]}))
    assert serving_problems(LoraServing(4, 8, ["q_proj"], adapter_dir=str(d)), 8, QWEN2) == []
    assert "differs" in serving_problems(LoraServing(8, 8, ["q_proj"], adapter_dir=str(d)), 8, QWEN2)[0]
    assert "no adapter_config.json" in serving_problems(LoraServing(4, 8, ["q_proj"], adapter_dir=str(tmp_path)),
                                                        8, QWEN2)[0]


def test_same_settings_decides_whether_a_key_may_be_attached_again():
    have = LoraServing(8, 16, ["q_proj", "v_proj"], adapter_dir="/x")
    assert have.same_settings(LoraServing(8, 16.0, ["v_proj", "q_proj"]))
    assert have.same_settings(LoraServing(8, 16, ["q_proj", "v_proj"], adapter_dir="/x"))
    assert not have.same_settings(LoraServing(8, 16, ["q_proj", "v_proj"], adapter_dir="/y"))
    assert not have.same_settings(LoraServing(4, 16, ["q_proj", "v_proj"]))
    assert not have.same_settings(LoraServing(8, 16, "all-linear"))
