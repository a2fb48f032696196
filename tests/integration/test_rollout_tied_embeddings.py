"""A weight update must reach the LM head of a tied-embedding model (real vLLM, CPU).

vLLM's CPU backend packs the embedding matrix into a GEMM kernel for the LM head once,
after loading; an in-place reload used to update the embedding but not that kernel, so a
replica silently computed logits with its *initial* LM head while the trainer moved on
(seen as a growing trainer-vs-replica probability gap with max_staleness=0).
"""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]


def _logprobs_hf(model, ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)


def test_reloaded_embeddings_reach_the_lm_head(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams

    hf = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    assert hf.config.tie_word_embeddings
    gen = torch.Generator().manual_seed(0)
    state = {k: v.clone() for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    emb = state["model.embed_tokens.weight"]
    state["model.embed_tokens.weight"] = emb + 0.05 * torch.randn(emb.shape, generator=gen)
    path = tmp_path / "v1.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    hf.load_state_dict(state, strict=False)
    hf.tie_weights()

    ids = list(range(5, 25))
    expected = _logprobs_hf(hf, ids)[-5:]
    llm = LLM(model=tiny_model, dtype="float32", enforce_eager=True, max_model_len=64,
              worker_extension_cls="rollout_svc.worker_ext.MeshWorkerExtension")
    try:
        def served():
            out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0))
            pl = out[0].prompt_logprobs
            return torch.tensor([pl[i][ids[i]].logprob for i in range(len(ids) - 5, len(ids))])

        before = served()
        assert not torch.allclose(before, expected, atol=1e-3)  # the update does change the logits
        stats = llm.collective_rpc("meshrl_load_safetensors", args=(str(path),))[0]
        assert stats["tensors"] == len(state)
        torch.testing.assert_close(served(), expected, atol=2e-3, rtol=0)
    finally:
        del llm
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
