"""The tiny model builder writes a directory transformers loads, deterministically."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from services.modelling.hf_dir import count_parameters
from services.modelling.tiny import CHAT_TEMPLATE, TinyModelSpec, build_tiny_model


def test_loads_with_transformers(tiny_model: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.eos_token_id != tok.pad_token_id
    assert model.config.vocab_size >= len(tok) and model.config.vocab_size % 64 == 0
    assert model.config.eos_token_id == tok.eos_token_id
    assert 2e5 <= count_parameters(tiny_model) <= 5e6
    text = "Natalia sold 48 clips. 48 / 2 = 24. #### 72 \\boxed{72} (3*4-1)=11!"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text  # byte-level: lossless round trip
    msgs = [{"role": "user", "content": "What is 2 + 3?"}]
    chat = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    out = model(torch.tensor([ids]))
    assert out.logits.shape == (1, len(ids), model.config.vocab_size)
    assert torch.isfinite(out.logits).all()


def test_special_tokens_are_single_ids(tiny_model: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    for s in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert len(tok(s, add_special_tokens=False)["input_ids"]) == 1
    cfg = json.loads((Path(tiny_model) / "tokenizer_config.json").read_text())
    assert cfg["chat_template"] == CHAT_TEMPLATE


def test_deterministic_and_seeded(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    small = TinyModelSpec(hidden_size=64, intermediate_size=128, num_hidden_layers=1)
    a = load_file(str(build_tiny_model(tmp_path / "a", small) / "model.safetensors"))
    b = load_file(str(build_tiny_model(tmp_path / "b", small) / "model.safetensors"))
    c = load_file(str(build_tiny_model(tmp_path / "c", TinyModelSpec(hidden_size=64, intermediate_size=128, num_hidden_layers=1, seed=1)) / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_refuses_to_overwrite_foreign_dir(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        build_tiny_model(tmp_path)
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_services_never_import_the_test_model_builder() -> None:
    """Only tools (the CLI, tests, benchmarks) build the tiny model; the services load a
    model directory that exists (no ``tiny:DIR`` path form)."""
    root = Path(__file__).resolve().parents[2]
    tool_dirs = {root / "services" / "cli", root / "services" / "modelling"}
    offenders, scanned = [], 0
    for pkg in ("services", "trainer_svc", "rollout_svc", "reward_svc"):
        for path in (root / pkg).rglob("*.py"):
            if any(path.is_relative_to(d) for d in tool_dirs):
                continue
            scanned += 1
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                if any(n == "services.modelling" or n.startswith("services.modelling.") for n in names):
                    offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert scanned > 100
    assert offenders == []


def test_cli_subcommand(tmp_path: Path) -> None:
    out = tmp_path / "m"
    r = subprocess.run(
        [sys.executable, "-m", "meshrl_cli", "make-tiny-model", str(out), "--hidden-size", "64", "--intermediate-size", "128"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "parameters" in r.stdout
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 64
