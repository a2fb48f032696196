"""The LoRA keys of a job spec (verl's model.lora_rank / lora_alpha / target_modules /
lora_adapter_path): their defaults, the views that carry them, and one-line errors for
impossible combinations -- checked on their own, against the model's config.json (no
weights loaded) and against a starting adapter's adapter_config.json."""

from __future__ import annotations

import json

import pytest

from services.config.job import JobSpecError, parse_job
from services.config.lora import linear_widths_from_config, lora_problems, vllm_max_lora_rank
from services.config.names import name_problems
from services.config.views import derive_view


def _raw(model: str = "/nonexistent/model") -> dict:
    return {"name": "lora", "model": {"path": model}, "data": {"train_files": ["x.parquet"], "train_batch_size": 2},
            "rollout": {"n": 2}, "actor": {"ppo_mini_batch_size": 1}}


@pytest.fixture(scope="module")
def smol_like(tmp_path_factory) -> str:
    """A model directory with only a config.json: SmolLM2-135M's shapes (Llama)."""
    d = tmp_path_factory.mktemp("smol")
    (d / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
        "intermediate_size": 1536, "num_hidden_layers": 30}))
    return str(d)


def test_off_by_default_and_carried_to_trainer_and_rollout_views():
    spec = parse_job(_raw())
    assert (spec.model.lora_rank, spec.model.lora_alpha, spec.model.target_modules) == (0, 16.0, "all-linear")
    assert not spec.model.lora
    spec = parse_job(_raw(), ["model.lora_rank=16", "model.lora_alpha=32", "model.target_modules=[q_proj,v_proj]"])
    assert spec.model.lora and spec.model.target_modules == ["q_proj", "v_proj"]
    for service in ("trainer", "rollout"):
        m = derive_view(spec, service).model
        assert (m.lora_rank, m.lora_alpha, m.target_modules) == (16, 32.0, ["q_proj", "v_proj"]), service


@pytest.mark.parametrize("overrides, message", [
    (["model.lora_adapter_path=/some/adapter"], "lora_adapter_path is set but model.lora_rank is 0"),
    (["model.lora_rank=8", "model.target_modules=qproj"], "'qproj' is neither 'all-linear' nor a list"),
    (["model.lora_rank=8", "model.target_modules=[]"], "an empty list targets nothing"),
    (["model.lora_rank=8", "model.target_modules=[lm_head]"], "['lm_head'] cannot carry an adapter"),
    (["model.lora_rank=8", "model.target_modules=[q_proj,q_proj]"], "names a module twice"),
    (["model.lora_rank=1024"], "exceeds 512, the largest rank vLLM serves"),
    (["model.lora_rank=-1"], "greater than or equal to 0"),
    (["model.lora_rank=8", "model.lora_alpha=0"], "greater than 0"),
])
def test_static_errors_are_one_line_naming_the_key(overrides, message):
    with pytest.raises(JobSpecError) as err:
        parse_job(_raw(), overrides)
    text = str(err.value)
    assert message in text
    assert sum(1 for line in text.splitlines() if line.strip().startswith("model")) == 1, text


def test_widths_from_config_without_weights(smol_like):
    w = linear_widths_from_config(json.loads(open(f"{smol_like}/config.json").read()))
    assert w["q_proj"] == (576, 576) and w["k_proj"] == (576, 192) and w["down_proj"] == (1536, 576)
    assert linear_widths_from_config({"model_type": "gpt_neox"}) is None  # unknown layout: the trainer checks


def test_model_dependent_errors(smol_like, tiny_model):
    ok = parse_job(_raw(smol_like), ["model.lora_rank=16"])
    assert lora_problems(ok) == [] and name_problems(ok) == []
    too_wide = parse_job(_raw(smol_like), ["model.lora_rank=256"])
    [line] = lora_problems(too_wide)
    assert "model.lora_rank (256) exceeds the width of the smallest targeted layer (k_proj: 576 -> 192" in line
    # only the attention's query: 576 wide, so 256 fits
    assert lora_problems(parse_job(_raw(smol_like), ["model.lora_rank=256", "model.target_modules=[q_proj]"])) == []
    unknown = parse_job(_raw(smol_like), ["model.lora_rank=8", "model.target_modules=[q_proj,query_key_value]"])
    [line] = name_problems(unknown)
    assert "model.target_modules: ['query_key_value'] are not linear layers" in line and "q_proj" in line
    # the tiny test model is Qwen2-shaped: its narrowest layer is k/v (hidden 128, 2 kv heads of 32)
    [line] = lora_problems(parse_job(_raw(tiny_model), ["model.lora_rank=128"]))
    assert "exceeds the width of the smallest targeted layer" in line


def test_starting_adapter_must_match(tmp_path, smol_like):
    (tmp_path / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}))
    good = parse_job(_raw(smol_like), ["model.lora_rank=8", f"model.lora_adapter_path={tmp_path}"])
    assert lora_problems(good) == []
    bad = parse_job(_raw(smol_like), ["model.lora_rank=16", "model.lora_alpha=32", "model.target_modules=[q_proj]",
                                      f"model.lora_adapter_path={tmp_path}"])
    problems = lora_problems(bad)
    assert any("model.lora_rank (16) differs from the starting adapter's rank (8)" in p for p in problems)
    assert any("model.lora_alpha (32.0) differs" in p for p in problems)
    assert any("model.target_modules (['q_proj']) differs" in p for p in problems)
    missing = parse_job(_raw(smol_like), ["model.lora_rank=8", f"model.lora_adapter_path={tmp_path / 'nope'}"])
    assert any("has no adapter_config.json" in p for p in lora_problems(missing))


def test_vllm_rank():
    assert [vllm_max_lora_rank(r) for r in (1, 2, 8, 9, 16, 300, 512)] == [1, 8, 8, 16, 16, 320, 512]
