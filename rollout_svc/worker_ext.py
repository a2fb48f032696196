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
        return stats

    def meshrl_param_checksum(self, name: str) -> float:
        """Sum of one model parameter (as named inside vLLM), for tests and diagnostics."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        return float(dict(model.named_parameters())[name].double().sum().item())
