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
    """Worker-side weight loading for meshrl replicas (mixed into vLLM's Worker class).

    The weight channel's state is kept per adapter slot: slot 0 is the engine's own channel
    (full weights, or a one-job replica's adapter), slot ``s > 0`` the channel of the job
    whose adapter is served under vLLM LoRA id ``s`` (an engine with several adapter slots).
    Every ``meshrl_weights_*`` call takes the slot last (default 0), so several jobs' channels
    are open at once, each loading only into its own slot."""

    _meshrl_streams: dict | None = None
    _meshrl_lora_dir: str | None = None

    # -- the weight channel, received in this process ---------------------------------------

    def meshrl_weights_open(self, cfg_json: str, replica_id: str, served_version: int, served_session: int,
                            manifest_json: str | None, notify_addr: str | None,
                            promoted_only: bool = False, slot: int = 0,
                            adapter_dir: str | None = None, credential_file: str | None = None) -> dict[str, Any]:
        """Subscribe to the publisher (closing the slot's earlier subscription); returns ``state()``.
        ``promoted_only``: never a canary (canary mode; the live-policy endpoint). ``slot`` >
        0: versions are the adapter served under that LoRA id (``adapter_dir`` holds its config).
        ``credential_file``: the job credential this channel presents (a fleet's replica serves
        several jobs, each with its own); None: the process's."""
        from rollout_svc.weight_stream import WorkerWeightStream

        if slot and not adapter_dir:
            raise ValueError(f"slot {slot}: an adapter slot's channel needs the adapter's directory")
        self.meshrl_weights_close(slot)
        rank = getattr(self, "rank", 0) or 0
        rid = replica_id if rank == 0 else f"{replica_id}.w{rank}"
        stream = WorkerWeightStream(self, cfg_json, rid, served_version, served_session, manifest_json, notify_addr,
                                    promoted_only, lora_slot=slot, adapter_dir=adapter_dir,
                                    credential_file=credential_file)
        state = stream.connect()
        if self._meshrl_streams is None:
            self._meshrl_streams = {}
        self._meshrl_streams[slot] = stream
        return state

    def _stream(self, slot: int = 0):
        stream = (self._meshrl_streams or {}).get(slot)
        if stream is None:
            raise RuntimeError("meshrl_weights_open() first" if not slot else f"slot {slot}: meshrl_weights_open() first")
        return stream

    def meshrl_weights_state(self, slot: int = 0) -> dict[str, Any]:
        return self._stream(slot).state()

    def meshrl_weights_load(self, version: int, slot: int = 0) -> dict[str, Any]:
        return self._stream(slot).load(version)

    def meshrl_weights_skip(self, version: int, slot: int = 0) -> dict[str, Any]:
        return self._stream(slot).skip(version)

    def meshrl_weights_load_snapshot(self, min_version: int, timeout_s: float, slot: int = 0) -> dict[str, Any] | None:
        return self._stream(slot).load_snapshot(min_version, timeout_s)

    def meshrl_weights_snapshot_version(self, slot: int = 0) -> int:
        return self._stream(slot).snapshot_version()

    def meshrl_weights_loaded(self, version: int, slot: int = 0) -> None:
        self._stream(slot).loaded(version)

    def meshrl_weights_close(self, slot: int = 0) -> None:
        stream = (self._meshrl_streams or {}).pop(slot, None)
        if stream is not None:
            stream.close()

    def meshrl_lora_setup(self, adapter_dir: str | None) -> bool:
        """This replica serves LoRA adapters (rollout_svc/lora.py). ``adapter_dir``: the one
        job's adapter config, and every version from the slot-0 channel replaces that adapter's
        weights; None: an engine with several adapter slots, each loaded through its own slot's
        channel. On CPU the LoRA layers run one product per adapter, not per token
        (:mod:`rollout_svc.lora_kernels`)."""
        from rollout_svc.lora_kernels import install

        self._meshrl_lora_dir = adapter_dir
        install()
        return True

    def meshrl_lora_assign(self, slot: int, name: str, adapter_dir: str) -> bool:
        """Serve the adapter in ``adapter_dir`` under LoRA id ``slot`` (a job attached to the
        slot), replacing what the slot served."""
        from rollout_svc.lora import assign_slot

        if not slot:
            raise ValueError("adapter slots are LoRA ids 1..max_loras")
        assign_slot(self, slot, name, adapter_dir)
        return True

    def meshrl_lora_release(self, slot: int) -> bool:
        """A job left the slot: close its channel, free the slot (nothing is served under it)."""
        from rollout_svc.lora import free_slot

        if not slot:
            raise ValueError("adapter slots are LoRA ids 1..max_loras")
        self.meshrl_weights_close(slot)
        return free_slot(self, slot)

    def meshrl_lora_load_file(self, path: str, adapter_dir: str, slot: int) -> dict[str, Any]:
        """Local loads of an adapter: the checked tensors in ``path`` replace the adapter of ``slot``."""
        from rollout_svc.lora import load_adapter_file

        return load_adapter_file(self, path, adapter_dir, slot)

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
