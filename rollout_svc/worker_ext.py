"""Methods mixed into every vLLM worker (``worker_extension_cls``), called by ``collective_rpc``.

vLLM's async engine runs the model in a worker process; control messages reach it as
msgpack (no pickle), so tensors never travel in these calls. The weight channel's
receiving side runs right here, in the worker (``meshrl_weights_*``, see
:mod:`rollout_svc.weight_stream`): buckets arrive on the worker's device and stream into
the model with the worker's own ``reload_weights(weights_iterator=...)``. The same code
runs on CPU and GPU workers: checkpoint-format tensors are copied into each parameter by
its ``weight_loader``. ``meshrl_load_safetensors`` loads a file that is already on disk
(local loads: tests, an operator's checkpoint).

This module is imported inside the worker process by qualified name; it must stay light.
"""

from __future__ import annotations

from typing import Any

from rollout_svc.weight_stream import expected_reload_gaps, refresh_embedding_kernels  # noqa: F401  (re-exported)


class MeshWorkerExtension:
    """Worker-side weight loading for meshrl replicas (mixed into vLLM's Worker class)."""

    _meshrl_stream = None

    # -- the weight channel, received in this process ---------------------------------------

    def meshrl_weights_open(self, cfg_json: str, replica_id: str, served_version: int, served_session: int,
                            manifest_json: str | None, notify_addr: str | None,
                            promoted_only: bool = False) -> dict[str, Any]:
        """Subscribe to the publisher (closing an earlier subscription); returns ``state()``.
        ``promoted_only``: never a canary (canary mode; the live-policy endpoint)."""
        from rollout_svc.weight_stream import WorkerWeightStream

        self.meshrl_weights_close()
        rank = getattr(self, "rank", 0) or 0
        rid = replica_id if rank == 0 else f"{replica_id}.w{rank}"
        stream = WorkerWeightStream(self, cfg_json, rid, served_version, served_session, manifest_json, notify_addr,
                                    promoted_only)
        state = stream.connect()
        self._meshrl_stream = stream
        return state

    def _stream(self):
        if self._meshrl_stream is None:
            raise RuntimeError("meshrl_weights_open() first")
        return self._meshrl_stream

    def meshrl_weights_state(self) -> dict[str, Any]:
        return self._stream().state()

    def meshrl_weights_load(self, version: int) -> dict[str, Any]:
        return self._stream().load(version)

    def meshrl_weights_skip(self, version: int) -> dict[str, Any]:
        return self._stream().skip(version)

    def meshrl_weights_load_snapshot(self, min_version: int, timeout_s: float) -> dict[str, Any] | None:
        return self._stream().load_snapshot(min_version, timeout_s)

    def meshrl_weights_snapshot_version(self) -> int:
        return self._stream().snapshot_version()

    def meshrl_weights_loaded(self, version: int) -> None:
        self._stream().loaded(version)

    def meshrl_weights_close(self) -> None:
        stream, self._meshrl_stream = self._meshrl_stream, None
        if stream is not None:
            stream.close()

    def meshrl_lora_setup(self, adapter_dir: str) -> bool:
        """This replica serves a LoRA adapter (rollout_svc/lora.py): every version from the
        channel replaces the adapter's weights; ``adapter_dir`` holds its config. On CPU the
        LoRA layers run one product per adapter, not per token (:mod:`rollout_svc.lora_kernels`)."""
        from rollout_svc.lora_kernels import install

        self._meshrl_lora_dir = adapter_dir
        install()
        return True

    def meshrl_rss_bytes(self) -> dict[str, int]:
        """This worker process's resident memory now and at its peak (``VmRSS``/``VmHWM``)."""
        out = {}
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0]) * 1024
        return out

    # -- local loads --------------------------------------------------------------------------

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

        with expected_reload_gaps(self):
            self.reload_weights(weights_iterator=named_tensors())  # type: ignore[attr-defined]
        stats["refreshed_kernels"] = refresh_embedding_kernels(self.model_runner.get_model())  # type: ignore[attr-defined]
        return stats

    def meshrl_param_digest(self, name: str) -> dict[str, Any]:
        """dtype, shape and sha256 of one model parameter's bytes (as named inside vLLM)."""
        import hashlib

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        p = dict(model.named_parameters())[name].detach().cpu().contiguous()
        raw = p.reshape(-1).view(__import__("torch").uint8).numpy().tobytes()
        return {"dtype": str(p.dtype).removeprefix("torch."), "shape": list(p.shape),
                "sha256": hashlib.sha256(raw).hexdigest()}

    def meshrl_param_checksum(self, name: str) -> float:
        """Sum of one model parameter (as named inside vLLM), for tests and diagnostics."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        return float(dict(model.named_parameters())[name].double().sum().item())
