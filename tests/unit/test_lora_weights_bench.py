"""bench/weights_e2e.py --lora-rank publishes what the trainer would (bench/_lora_weights.py):
on the tiny model, the adapter's tensors have exactly the names and shapes of the adapter a
replica with the same LoRA keys starts from (the manifest every version is checked against),
are finite with non-zero lora_B, and are a small fraction of the model's bytes. The timed run
itself starts vLLM replicas and is run by hand (docs/results/weights_e2e.md)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_adapter_matches_the_replicas_starting_adapter(tiny_model, tmp_path):
    import torch
    from safetensors.torch import load_file

    from rollout_svc.lora import LoraServing

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from _lora_weights import adapter_tensors, targets_of
    finally:
        sys.path.remove(str(ROOT / "bench"))

    rank, alpha = 8, 16.0
    tensors = adapter_tensors(Path(tiny_model), rank, alpha, targets_of("all-linear"))
    serving = LoraServing(rank, alpha, "all-linear", adapter_dir=None)
    serving.prepare(tiny_model)
    manifest = serving.manifest()
    assert {n: tuple(t.shape) for n, t in tensors} == manifest.shapes
    assert all(n.startswith("base_model.model.model.layers.") for n, _ in tensors)
    assert all(bool(torch.isfinite(t).all()) for _, t in tensors)
    assert all(bool(t.any()) for n, t in tensors if ".lora_B." in n)
    full = sum(t.numel() * t.element_size() for t in load_file(f"{tiny_model}/model.safetensors").values())
    assert sum(t.numel() * t.element_size() for _, t in tensors) < full / 5
    # a comma list of targets is the list the job's model.target_modules takes
    assert targets_of("q_proj, v_proj") == ["q_proj", "v_proj"]
