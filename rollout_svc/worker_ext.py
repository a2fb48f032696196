"""Methods mixed into every vLLM worker (``worker_extension_cls``), called by ``collective_rpc``.

vLLM's async engine runs the model in a worker process; control messages reach it as
msgpack (no pickle), so tensors are not handed over in the RPC itself. Instead the replica
writes one policy version as a safetensors file (on tmpfs, ``/dev/shm`` when it exists) and
asks every worker to stream that file into its model in place with the worker's own
``reload_weights(weights_iterator=...)`` -- the path that re-applies vLLM's kernel-format
processing (weight repacking on CPU, fused QKV/gate-up on every device). The same code runs
on CPU and GPU workers: checkpoint-format tensors are copied to the worker's device by each
parameter's ``weight_loader``.

This module is imported inside the worker process by qualified name; it must stay light.
"""

from __future__ import annotations

from typing import Any


def refresh_embedding_kernels(model: Any) -> int:
    """Rebuild the CPU matmul kernels of embedding-type layers from their current weights.

    On CPU, vLLM packs each embedding's weight into a GEMM kernel once, after loading, for
    its use as an LM head (tied embeddings: ``lm_head`` *is* ``embed_tokens``). An in-place
    ``reload_weights`` updates the weight but not that packed copy, so the replica would
    keep computing logits with the old LM head while the trainer moves on. Linear layers
    are unaffected (their kernels are rebuilt by the reload). No-op on GPUs, where the LM
    head reads the weight directly. Returns how many layers were refreshed."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    count = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        weight = getattr(module, "weight", None)
        if isinstance(method, UnquantizedEmbeddingMethod) and weight is not None and weight.numel() > 0:
            method.process_weights_after_loading(module)
            count += 1
    return count


class MeshWorkerExtension:
    """Worker-side weight loading for meshrl replicas (mixed into vLLM's Worker class)."""

    def meshrl_load_safetensors(self, path: str) -> dict[str, Any]:
        """Load every tensor of the safetensors file ``path`` into the live model, in place.

        Tensors are in HuggingFace checkpoint format (names and shapes as in the model
        directory). Returns ``{"tensors": count, "bytes": total}``.
        """
        from safetensors import safe_open

        stats = {"tensors": 0, "bytes": 0}

        def named_tensors():
            with safe_open(path, framework="pt", device="cpu") as f:
                for name in f.keys():
                    t = f.get_tensor(name)
                    stats["tensors"] += 1
                    stats["bytes"] += t.numel() * t.element_size()
                    yield name, t

        self.reload_weights(weights_iterator=named_tensors())  # type: ignore[attr-defined]
        stats["refreshed_kernels"] = refresh_embedding_kernels(self.model_runner.get_model())  # type: ignore[attr-defined]
        return stats

    def meshrl_param_checksum(self, name: str) -> float:
        """Sum of one model parameter (as named inside vLLM), for tests and diagnostics."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        return float(dict(model.named_parameters())[name].double().sum().item())
