"""The replica's end of the weight channel, inside the vLLM worker process.

One :class:`WorkerWeightStream` lives in each vLLM worker (created by
``MeshWorkerExtension.meshrl_weights_open``). It owns a
:class:`services.weights.WeightReceiver`, so the channel's buckets (gloo on CPU, NCCL on
GPU: the buffers are on the worker's own device) land in the process that holds the model,
and each version is streamed into the live model bucket by bucket through the worker's
``reload_weights(weights_iterator=...)`` -- vLLM's in-place path that re-applies its
kernel-format processing (repacked linear weights on CPU, fused QKV/gate-up everywhere).
No file, no second copy of the model: the receiver keeps at most ``pipeline_depth`` buckets
posted plus a few received ahead of the loader, and each bucket's memory is freed once vLLM
has copied its tensors.

The replica's main process drives it through ``collective_rpc`` (msgpack, no tensors):
``state()`` says whether a version is pending, ``load(version)`` streams it in (the caller
has paused the scheduler), ``load_snapshot(min_version)`` catches up from the publisher's
snapshot, ``loaded(version)`` reports the served version. The receiver's threads send a
one-word datagram to the main process (``notify_addr``, an abstract Unix socket) when
something happened, so the main process does not have to poll quickly.

Every tensor is checked (``rollout_svc.weight_check.VersionCheck``) before vLLM sees it. A
check or transfer that fails before any tensor reached the model leaves the old weights in
place; one that fails later leaves a mix of versions, reported as ``touched``: the replica
then keeps its scheduler paused (serves nothing) until a complete version is loaded.

This module is imported inside the worker process by ``rollout_svc.worker_ext``.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

from rollout_svc.weight_check import VersionCheck, WeightManifest, WeightUpdateError

log = logging.getLogger(__name__)


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


class _ExpectedReloadGaps(logging.Filter):
    """Drops vLLM's "<Layer>: Failed to load weights" warning for layers that have no
    tensor in a checkpoint by design, so it still shows for any other layer: rotary
    embeddings (computed buffers only) and, with tied embeddings, the LM head (it *is*
    ``embed_tokens``; vLLM keeps its tensors, which the reload of ``embed_tokens`` updated)."""

    LOGGER = "vllm.model_executor.model_loader.reload.layerwise"

    def __init__(self, tied_embeddings: bool, also: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.expected = {"RotaryEmbedding"} | ({"ParallelLMHead"} if tied_embeddings else set()) | set(also)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "%s: Failed to load weights" and record.args and record.args[0] in self.expected:
            return False
        return True


def _tied(worker: Any) -> bool:
    try:
        return bool(getattr(worker.vllm_config.model_config.hf_config, "tie_word_embeddings", False))
    except AttributeError:
        return False


class _SkippedOnPurpose(logging.Filter):
    """Drops vLLM's "weights were not loaded" summary when it names only parameters loaded
    outside the reload (``direct_embeddings``)."""

    LOGGER = "vllm.model_executor.model_loader.reload.inplace"

    def __init__(self, names: frozenset[str]) -> None:
        super().__init__()
        self.names = names

    def filter(self, record: logging.LogRecord) -> bool:
        if (self.names and record.msg == "Following weights were not loaded from checkpoint: %s" and record.args
                and isinstance(record.args[0], (set, frozenset)) and record.args[0] <= self.names):
            return False
        return True


@contextlib.contextmanager
def expected_reload_gaps(worker: Any, also: frozenset[str] = frozenset(),
                         skipped_names: frozenset[str] = frozenset()) -> Iterator[None]:
    """While a ``reload_weights`` runs in ``worker``: silence the warnings of
    :class:`_ExpectedReloadGaps` (and of the layer classes ``also`` and the parameters
    ``skipped_names``, loaded outside the reload)."""
    gaps = _ExpectedReloadGaps(_tied(worker), also)
    logger = logging.getLogger(_ExpectedReloadGaps.LOGGER)
    logger.addFilter(gaps)
    skipped = _SkippedOnPurpose(skipped_names)
    summary = logging.getLogger(_SkippedOnPurpose.LOGGER)
    summary.addFilter(skipped)
    try:
        yield
    finally:
        logger.removeFilter(gaps)
        summary.removeFilter(skipped)


def direct_embeddings(worker: Any) -> dict[str, tuple[str, str]]:
    """Checkpoint name -> (module path, class name) of the unquantized embedding matrices
    (``embed_tokens``; an untied ``lm_head``) whose checkpoint name is their module path.

    These are copied straight into their live parameter after ``reload_weights``, instead of
    through it: vLLM's in-place reload would materialise a fresh copy of the (largest) layer,
    copy the weight in, build the layer's CPU LM-head kernel and copy it all back -- and on
    CPU that kernel must be rebuilt from the live weight afterwards anyway
    (``refresh_embedding_kernels``). Their weight loaders only copy (and pad the vocabulary)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    model = worker.model_runner.get_model()
    tied = _tied(worker)
    out = {}
    for path, module in model.named_modules():
        if not isinstance(getattr(module, "quant_method", None), UnquantizedEmbeddingMethod):
            continue
        w = getattr(module, "weight", None)
        if w is None or w.numel() == 0 or (tied and path.split(".")[-1] == "lm_head"):
            continue  # a tied LM head is the embedding: its checkpoint tensor is skipped by vLLM
        out[f"{path}.weight"] = (path, type(module).__name__)
    return out


def _copy_into_embedding(model: Any, path: str, t) -> None:
    from vllm.model_executor.model_loader.reload.layerwise import _get_original_loader

    param = model.get_submodule(path).weight
    _get_original_loader(param)(param, t)


def load_into_worker(worker: Any, named_tensors, check: VersionCheck) -> dict[str, Any]:
    """Stream ``named_tensors`` into ``worker``'s live model, checking each one first.

    Returns ``{"ok", "tensors", "bytes", "seconds", "touched", "error", "refused"}``: never
    raises for a bad or broken version. ``touched``: some tensor reached the model before
    the failure (the model may now mix versions). ``refused``: the version itself was bad
    (a check failed), as opposed to a transfer that broke.
    """
    t0 = time.perf_counter()
    yielded = 0
    finished = False
    waited = checked = 0.0
    direct = direct_embeddings(worker)
    held: list[tuple[str, Any]] = []  # (module path, tensor): copied in once the reload is done

    def stream():
        nonlocal yielded, finished, waited, checked
        it = iter(named_tensors)
        while True:
            t1 = time.perf_counter()
            try:
                item = next(it)  # blocks while the next bucket is still on the wire
            except StopIteration:
                break
            t2 = time.perf_counter()
            name, t = check.check(item)
            waited += t2 - t1
            checked += time.perf_counter() - t2
            if name in direct:
                held.append((direct[name][0], t))
                continue
            yielded += 1
            yield name, t
        check.finish()
        finished = True

    result: dict[str, Any] = {"ok": False, "tensors": 0, "bytes": 0, "touched": False, "error": None, "refused": False}
    model = worker.model_runner.get_model()
    try:
        with expected_reload_gaps(worker, frozenset(c for _, c in direct.values()), frozenset(direct)):
            worker.reload_weights(weights_iterator=stream())
    except Exception as e:  # noqa: BLE001 -- reported to the main process, which decides
        result["error"] = f"{type(e).__name__}: {e}"
        result["refused"] = isinstance(e, WeightUpdateError)
        result["touched"] = yielded > 0  # (held embeddings never reached the model)
        if not finished:
            _restore_layers(worker)
    else:
        try:
            for path, t in held:  # the version is complete and checked: the embeddings go in now
                _copy_into_embedding(model, path, t)
        except Exception as e:  # noqa: BLE001
            result.update(error=f"{type(e).__name__}: {e}", touched=True)
        else:
            result.update(ok=True, tensors=len(check.seen), bytes=check.nbytes)
    held.clear()
    t3 = time.perf_counter()
    result["refreshed_kernels"] = refresh_embedding_kernels(model)
    t4 = time.perf_counter()
    result["seconds"] = t4 - t0
    # where the load's time went (diagnostics: logged by the replica, printed by the bench):
    # waiting for buckets, checking tensors, vLLM's reload (weight loaders, per-layer
    # kernel processing), rebuilding the LM-head kernel
    result["timing"] = {"wait_s": waited, "check_s": checked, "reload_s": (t3 - t0) - waited - checked,
                        "refresh_s": t4 - t3}
    return result


def _restore_layers(worker: Any) -> None:
    """After ``reload_weights`` stopped half-way: put every layer back on its device.

    vLLM's in-place reload moves layers to the meta device and buffers their weights until
    a layer is complete; an exception from the iterator skips its finalisation. Finalising
    here puts untouched layers' kernel tensors back (their old weights), so the model is
    whole again (maybe of mixed versions: the caller knows from ``touched``)."""
    from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

    try:
        finalize_layerwise_reload(worker.model_runner.get_model(), worker.vllm_config.model_config)
    except Exception:  # noqa: BLE001
        log.exception("restoring the model's layers after a failed reload failed")


class WorkerWeightStream:
    """The weight channel's receiving side in one vLLM worker (see module docstring)."""

    def __init__(self, worker: Any, cfg_json: str, replica_id: str, served_version: int, served_session: int,
                 manifest_json: str | None, notify_addr: str | None, promoted_only: bool = False,
                 lora_slot: int = 0, adapter_dir: str | None = None, credential_file: str | None = None):
        """``lora_slot`` > 0: every version is the adapter served under that vLLM LoRA id
        (``adapter_dir``: its config), on an engine serving several jobs' adapters."""
        from services.config.weights import WeightChannelConfig
        from rollout_svc.weights.receiver import WeightReceiver

        cfg = WeightChannelConfig.model_validate_json(cfg_json)
        if cfg.receive_ahead_buckets == 0:  # 0 = a whole version: never here, it would be a model copy
            cfg = cfg.model_copy(update={"receive_ahead_buckets": cfg.pipeline_depth})
        self.cfg = cfg
        self.worker = worker
        self.lora_slot = lora_slot
        self.adapter_dir = adapter_dir
        self.manifest = WeightManifest.from_json(manifest_json)
        self._notify_addr = notify_addr
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) if notify_addr else None
        if self._sock is not None:
            self._sock.setblocking(False)
        self._pending = None
        from services.weights.plan import DTYPE_NAMES

        serve_dtype = DTYPE_NAMES.get(worker.vllm_config.model_config.dtype, "")
        from services import auth

        credential = auth.JobCredential.load(credential_file) if credential_file else None
        self.rx = WeightReceiver(cfg, replica_id, served_version=served_version, served_session=served_session,
                                 credential=credential,
                                 on_event=self._notify, promoted_only=promoted_only,
                                 serve_dtype=serve_dtype if serve_dtype in ("float32", "bfloat16", "float16") else "")

    def _notify(self, kind: str) -> None:
        if kind == "update":  # carry the version, so the main process can start loading at once
            peek = self.rx.peek_update()
            if peek is not None:
                kind = f"update {peek[0]} {peek[1]}"
        if self._sock is not None:
            try:
                self._sock.sendto(kind.encode(), self._notify_addr)
            except OSError:  # the main process is busy or gone: it polls anyway
                pass

    def connect(self) -> dict[str, Any]:
        """Start subscribing in the background (the engine must not wait for a publisher that
        is not up yet); ``state()`` has session 0 until the publisher's WELCOME."""
        import threading

        def run() -> None:
            try:
                self.rx.connect()
            except Exception as e:  # noqa: BLE001 -- reported by state()
                self._connect_error = f"{type(e).__name__}: {e}"
                self._notify("fatal")

        self._connect_error: str | None = None
        threading.Thread(target=run, name="weights-connect", daemon=True).start()
        return self.state()

    def state(self) -> dict[str, Any]:
        """What the main process needs to decide its next step (never blocks)."""
        from services.weights import VersionError, WeightChannelError

        fatal = fatal_kind = None
        if getattr(self, "_connect_error", None):
            fatal, fatal_kind = self._connect_error, "channel"
        try:
            u = self.rx.wait_for_update(0) if self.rx.session else None
            if u is not None:
                self._pending = u  # a newer version replaces one nobody took
        except WeightChannelError as e:
            fatal, fatal_kind = str(e), ("version" if isinstance(e, VersionError) else "channel")
        p = self._pending
        serve = self.rx.serve  # one SERVE message's fields, read once
        return {
            "target_version": None if serve is None else serve[0],  # canary mode: the version to serve
            "canary": None if serve is None else serve[1],
            "target_from_snapshot": serve is not None and serve[2],  # its broadcast went out without us
            "session": self.rx.session,
            "latest_version": self.rx.latest_version,
            "snapshot_version": self.rx.snapshot_version,
            "pending_version": None if p is None else p.version,
            "pending_session": None if p is None else p.session,
            "fatal": fatal,
            "fatal_kind": fatal_kind,
        }

    def _take(self, version: int):
        """The pending update if it is ``version`` (taken), else None (a pending update of
        another version stays pending)."""
        if self.rx.peek_update() is not None:  # a version the main process has not asked about
            self._pending = self.rx.wait_for_update(0)  # (does not raise: one is there)
        u = self._pending
        if u is None or u.version != version:
            return None
        self._pending = None
        return u

    def load(self, version: int) -> dict[str, Any]:
        """Stream the pending ``version`` into the model (the scheduler is paused).

        The main process may call this straight from the worker's note that ``version``
        began, without asking ``state()`` first; when another version (or none) is pending
        by then, the report says ``not_pending`` and nothing was touched."""
        u = self._take(version)
        if u is None:
            p = self._pending
            return {"ok": False, "touched": False, "refused": False, "not_pending": True,
                    "pending_version": None if p is None else p.version,
                    "error": f"v{version} is not pending here"}
        check = VersionCheck(self.manifest)
        start = time.monotonic()
        result = self._load(u.tensors(), check)
        end = time.monotonic()
        # since BEGIN arrived here: when the load started, and how long it ran on after the
        # last bucket had arrived
        result["timing"].update(begin_to_load_s=start - u.began_at,
                                after_received_s=None if u.received_at is None else end - u.received_at)
        if not result["ok"] and result["refused"]:
            u.drain()  # let the rest arrive, so the transfer does not fail for the other replicas
        return result

    def _load(self, named_tensors, check: VersionCheck) -> dict[str, Any]:
        """Load one version: into the model's weights, or -- when the replica serves a LoRA
        adapter (``meshrl_lora_setup``), or this channel is one adapter slot's -- as that
        adapter's weights (rollout_svc/lora.py)."""
        if self.lora_slot:
            from rollout_svc.lora import load_adapter_into_worker

            return load_adapter_into_worker(self.worker, named_tensors, check, self.adapter_dir, self.lora_slot)
        adapter_dir = getattr(self.worker, "_meshrl_lora_dir", None)
        if adapter_dir:
            from rollout_svc.lora import load_adapter_into_worker

            return load_adapter_into_worker(self.worker, named_tensors, check, adapter_dir)
        return load_into_worker(self.worker, named_tensors, check)

    def skip(self, version: int) -> dict[str, Any]:
        """Receive the pending ``version`` without loading it (the replica serves newer)."""
        u = self._take(version)
        if u is not None:
            u.drain()
        return {"ok": True}

    def snapshot_version(self) -> int:
        """Version of the publisher's snapshot now (-1: none, or unreachable)."""
        from services.weights import WeightChannelError

        try:
            return int(self.rx.publisher_status(5.0).snapshot_version)
        except WeightChannelError:
            return -1

    def load_snapshot(self, min_version: int, timeout_s: float) -> dict[str, Any] | None:
        """Fetch the publisher's snapshot (>= ``min_version``) and load it; None if there is none.

        The snapshot arrives as one safetensors stream and is parsed whole before loading
        (this is the catch-up path after a failure or a late join, not the steady state)."""
        from services.weights import SnapshotError

        session = self.rx.session
        try:
            snap = self.rx.fetch_snapshot(min_version, timeout_s)
        except SnapshotError as e:
            return {"ok": False, "touched": False, "refused": False, "error": str(e), "version": -1,
                    "session": session}
        if snap is None:
            return None
        version = snap.version
        result = self._load(snap.tensors(), VersionCheck(self.manifest))
        del snap
        result.update(version=version, session=session)
        return result

    def loaded(self, version: int) -> None:
        self.rx.report_loaded(version, wait=False)  # the engine core waits for this RPC: don't wait for gRPC

    def close(self) -> None:
        self._pending = None
        self.rx.close()
        if self._sock is not None:
            self._sock.close()
