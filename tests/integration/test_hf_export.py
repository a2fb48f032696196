"""``meshrl export``: a 2-rank FSDP2 checkpoint becomes a Hugging Face directory whose
weights equal the trainer's, that transformers loads and vLLM serves (real vLLM, CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

JOB = str(Path(__file__).with_name("trainer_step_job.py"))


@pytest.fixture(scope="module")
def trained(tiny_model, tmp_path_factory):
    """Two ranks take one step and checkpoint it; returns (checkpoint root, trainer params)."""
    from safetensors.torch import load_file

    from trainer_svc.launch import spawn_ranks

    tmp = tmp_path_factory.mktemp("export")
    spec = {"model": {"path": tiny_model}, "data": {"train_batch_size": 4}, "rollout": {"n": 2},
            "actor": {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 2, "optim": {"lr": 1e-2}}}
    (tmp / "spec.json").write_text(json.dumps(spec))
    code = spawn_ranks([JOB, str(tmp / "spec.json"), str(tmp / "out"), "--save", str(tmp / "ckpt")], 2,
                       threads=1, timeout_s=500)
    assert code == 0
    return tmp / "ckpt", load_file(str(tmp / "out" / "params.safetensors"))


def _meshrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "meshrl_cli", *args], capture_output=True, text=True, timeout=300)


def test_export_equals_trainer_weights_and_loads_in_transformers(trained, tiny_model, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt, params = trained
    out = tmp_path / "hf"
    r = _meshrl("export", str(ckpt), str(out), "--model", tiny_model)
    assert r.returncode == 0, r.stderr
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    on_disk = load_file(str(out / "model.safetensors"))
    for name, t in params.items():
        assert torch.equal(on_disk[name], t), name  # bit-equal to the trainer's full parameters
    base = load_file(str(Path(tiny_model) / "model.safetensors"))
    assert not torch.equal(on_disk["model.embed_tokens.weight"], base["model.embed_tokens.weight"])  # trained

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), params[name]), name
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.apply_chat_template([{"role": "user", "content": "1+2="}], add_generation_prompt=True, tokenize=False) \
        == AutoTokenizer.from_pretrained(tiny_model).apply_chat_template(
            [{"role": "user", "content": "1+2="}], add_generation_prompt=True, tokenize=False)
    meta = json.loads((out / "meshrl_export.json").read_text())
    assert meta["step"] == 1 and meta["policy_version"] == 1


def test_export_of_a_run_dir_finds_model_and_newest_checkpoint(trained, tiny_model, tmp_path):
    """A run dir as ``meshrl run`` leaves it: config/trainer.yaml (the trainer view) names the checkpoint dir and model."""
    import shutil

    import yaml

    ckpt, params = trained
    run = tmp_path / "run"
    shutil.copytree(ckpt, run / "checkpoints")
    (run / "config").mkdir()
    (run / "config" / "trainer.yaml").write_text(yaml.safe_dump(
        {"model": {"path": tiny_model}, "trainer": {"default_local_dir": str(run / "checkpoints")}}))
    r = _meshrl("export", str(run), str(tmp_path / "hf"))
    assert r.returncode == 0, r.stderr
    from safetensors.torch import load_file

    assert torch.equal(load_file(str(tmp_path / "hf" / "model.safetensors"))["model.norm.weight"], params["model.norm.weight"])
    r = _meshrl("export", str(run), str(tmp_path / "hf"))  # not over an existing export
    assert r.returncode != 0 and "exists" in r.stderr and "Traceback" not in r.stderr


def test_export_errors_are_one_line(tmp_path):
    r = _meshrl("export", str(tmp_path / "nope"), str(tmp_path / "out"))
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr
    r = _meshrl("export", str(tmp_path), str(tmp_path / "out"))
    assert r.returncode == 2 and "no checkpoint found" in r.stderr


@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_vllm_serves_the_export(trained, tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams

    from trainer_svc.hf_export import export_hf

    out = export_hf(trained[0], tmp_path / "hf", model_dir=tiny_model)
    ids = list(range(5, 25))

    def hf_logprobs(path):
        m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        with torch.no_grad():
            logits = m(torch.tensor([ids])).logits[0, :-1]
        return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)[-5:]

    expected, base = hf_logprobs(out), hf_logprobs(tiny_model)
    assert not torch.allclose(expected, base, atol=1e-3)
    llm = LLM(model=str(out), dtype="float32", enforce_eager=True, max_model_len=64)
    try:
        res = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=4, prompt_logprobs=0, temperature=0))
        pl = res[0].prompt_logprobs
        served = torch.tensor([pl[i][ids[i]].logprob for i in range(len(ids) - 5, len(ids))])
        torch.testing.assert_close(served, expected, atol=2e-3, rtol=0)
        assert len(res[0].outputs[0].token_ids) == 4
    finally:
        del llm
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
