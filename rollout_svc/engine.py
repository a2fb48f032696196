"""The vLLM side of a replica: an ``AsyncLLM`` (continuous batching), sampling, weight swaps.

``RolloutEngine`` turns one prompt (token ids) into ``n`` :class:`~rollout_svc.packing.Sample`
objects, each an independent vLLM request with its own seed (derived from the config's seed
and the sample id, so results do not depend on what else is batched), and swaps weights in
place while requests are in flight:

- ``on_weight_update="finish"``: the scheduler is paused with ``mode="keep"`` (requests stay
  frozen), the weights are reloaded, the running requests are preempted and the prefix cache
  reset (no KV computed by the old weights survives), the scheduler resumes; the frozen
  requests recompute their KV and continue with the new weights, and their samples keep the
  version they started with (the oldest one used).
- ``on_weight_update="abort_requeue"``: in-flight requests are aborted, and every group with
  an aborted sample is regenerated from scratch under the new version.

A canary replica (``weights.rollout.mode: canary``) loads a candidate version with its
requests in flight aborted and regenerated, whatever ``on_weight_update`` says: every sample
of a candidate is then made by that version alone, so a rejected version's samples are
exactly the ones that carry its number.

Weights from the weight channel are received inside the vLLM worker process and streamed
into the model bucket by bucket (:mod:`rollout_svc.weight_stream`); ``engine.weights``
(:class:`~rollout_svc.engine_weights.EngineWeights`) pauses and resumes the scheduler around
each load and drives the worker's channel; this class keeps the served version. A load that
failed after some tensors reached the model leaves ``weights_dirty`` set: the scheduler stays
paused (nothing is served) until a complete version is loaded.

**Several jobs' adapters in one engine.** ``RolloutEngine(..., lora=LoraServing(...),
adapter_slots=K)`` starts vLLM with ``K`` LoRA slots (``max_loras = max_cpu_loras = K``,
``max_lora_rank`` from ``lora.rank``). ``await engine.adapter(key, lora)`` gives a job an
:class:`AdapterEngine` on a slot of its own: what a ``Replica`` and the weight subscriber
use from an engine (generation with the job's ``LoRARequest``, its own ``version``,
``weights_dirty``, ``weights``, counters), so each job runs its own ``Replica`` and
subscriber on the shared engine, and vLLM batches every job's requests together.
``await engine.release_adapter(key)`` aborts the job's requests, closes its channel and frees
the slot for the next key. The engine's own ``generate_*`` serve the base model then.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import uuid
import zlib
from collections.abc import Iterable

import numpy as np
import torch

from rollout_svc.engine_adapters import EngineAdapters
from rollout_svc.engine_weights import EngineWeights
from rollout_svc.lora import LoraServing
from rollout_svc.packing import Sample
from rollout_svc.weight_check import WeightManifest
from services.config.rollout import RolloutConfig, SamplingConfig

log = logging.getLogger(__name__)

WORKER_EXTENSION = "rollout_svc.worker_ext.MeshWorkerExtension"


class EngineDeadError(RuntimeError):
    """vLLM's engine died; the replica must stop (its launcher restarts it)."""


class RolloutEngine:
    """One vLLM ``AsyncLLM`` plus the bookkeeping a replica needs.

    Args:
        cfg: the rollout block (``prompt_length`` / ``response_length`` must be resolved).
        model: model directory or hub id (passed to vLLM as is).
        dtype: dtype when ``cfg.dtype == "auto"``.
        initial_version: policy version of the weights loaded at start.
        tokenizer: tokenizer directory when it differs from ``model``.
        trust_remote_code: let vLLM run the checkpoint's own modelling code.
        lora: serve the job's LoRA adapter (rollout_svc/lora.py): every version is the adapter's tensors.
        adapter_slots: serve up to this many jobs' adapters at once (needs ``lora``, whose rank
            is then the largest an adapter may have): see :meth:`adapter`. None: one job.
    """

    def __init__(
        self,
        cfg: RolloutConfig,
        model: str,
        *,
        dtype: str = "float32",
        initial_version: int = 0,
        tokenizer: str | None = None,
        trust_remote_code: bool = False,
        lora: LoraServing | None = None,
        adapter_slots: int | None = None,
    ) -> None:
        if cfg.prompt_length is None or cfg.response_length is None:
            raise ValueError("RolloutEngine needs cfg.prompt_length and cfg.response_length resolved")
        if adapter_slots is not None and lora is None:
            raise ValueError("adapter_slots needs lora=LoraServing(...) (its rank is the largest an adapter may have)")
        self.cfg = cfg
        self.model = model
        self.tokenizer = tokenizer
        self.trust_remote_code = trust_remote_code
        self.dtype = dtype if cfg.dtype == "auto" else cfg.dtype
        self.version = initial_version
        self.llm = None
        self.vocab_size = 0
        self.pad_token_id = 0
        self.eos_token_ids: list[int] = []
        self.manifest: WeightManifest | None = None
        self.last_weight_load_s = 0.0
        self._update_lock = asyncio.Lock()
        self._swap_lock = asyncio.Lock()  # one pause/load/resume at a time (several adapter slots take turns)
        self._abort_epoch = 0  # bumped by every abort-mode weight update
        # vLLM request ids: unique per engine; a counter is cheaper than a uuid per sample
        self._request_prefix = uuid.uuid4().hex[:8]
        self._request_seq = itertools.count()
        self.in_flight = 0
        self.tokens_generated = 0
        self.prefix_reset_failures = 0
        self.last_update_in_flight = 0  # requests in flight when the last update paused the engine
        self.weights_dirty = False  # a failed load left mixed weights: paused until a good one loads
        self.last_load: dict = {}  # the worker's report of the last load (bytes, seconds, error)
        self.weights = EngineWeights(self)
        """Weight swaps and the worker's weight channel (rollout_svc/engine_weights.py)."""
        self.lora = lora
        """The job's LoRA adapter, served on every request (rollout_svc/lora.py); None: full weights."""
        self.lora_request = None
        self.adapter_slots = adapter_slots
        """Adapter slots (several jobs' adapters, :meth:`adapter`); None: one job's weights or adapter."""
        self._adapters = EngineAdapters(self, adapter_slots) if adapter_slots is not None else None
        self._live: set[str] = set()  # vLLM request ids in flight

    # -- lifecycle ---------------------------------------------------------------------------

    def engine_args(self):
        """The ``AsyncEngineArgs`` this replica starts vLLM with."""
        from vllm.engine.arg_utils import AsyncEngineArgs

        c = self.cfg
        max_len = c.max_model_len or (c.prompt_length + c.response_length)
        chunked = c.enable_chunked_prefill
        batched_tokens = c.max_num_batched_tokens
        extra = {}
        if chunked is None and c.seed is not None:
            from vllm.platforms import current_platform

            if current_platform.is_cpu():
                chunked = False  # see RolloutConfig.enable_chunked_prefill
        if c.block_size is not None:
            extra["block_size"] = c.block_size
        if chunked is not None:
            extra["enable_chunked_prefill"] = chunked
            if not chunked:  # every prompt must fit one step
                batched_tokens = max(batched_tokens or 0, max_len, 4096)
        return AsyncEngineArgs(
            model=self.model,
            tokenizer=self.tokenizer,
            trust_remote_code=self.trust_remote_code,
            dtype=self.dtype,
            seed=c.seed or 0,
            max_model_len=max_len,
            gpu_memory_utilization=c.gpu_memory_utilization,
            enforce_eager=c.enforce_eager,
            max_num_seqs=c.max_num_seqs,
            max_num_batched_tokens=batched_tokens,
            tensor_parallel_size=c.tensor_model_parallel_size,
            enable_prefix_caching=c.enable_prefix_caching,
            worker_extension_cls=WORKER_EXTENSION,
            logprobs_mode="processed_logprobs",
            disable_log_stats=True,
            **(self.lora.engine_args(self.adapter_slots or 1) if self.lora is not None else {}),
            **extra,
        )

    async def start(self) -> None:
        """Start vLLM (bounded by ``cfg.engine_startup_timeout_s``) and read token ids."""
        if self.cfg.kv_cache_space_gib is not None:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(max(1, round(self.cfg.kv_cache_space_gib)))))
        from vllm.platforms import current_platform

        if self.cfg.enforce_eager and current_platform.is_cpu():
            # Even in eager mode vLLM torch.compiles a few sampler helpers (the logprob rank
            # count among them) on their first call; on CPU inductor builds them with the C++
            # compiler: 7-23 s of the first batch here (a job's first validation round: 100
            # greedy prompts then take 0.4 s), and later batches are no faster for it. The
            # engine's processes are spawned, so they read this before importing torch.
            os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
        if current_platform.is_cpu() and self.cfg.tensor_model_parallel_size == 1:
            # One worker: run it inside vLLM's engine-core process (the "uni" executor, as
            # vLLM does on GPUs) instead of a third process. vLLM's CPU platform forces its
            # multiprocess executor unless this is 0; the engine core itself stays a process of
            # its own (AsyncLLM always spawns it). Each spawned process imports torch and vLLM
            # again: the third one made a replica's start about twice as long (docs/performance.md).
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm.v1.engine.async_llm import AsyncLLM

        def build():
            if self.lora is not None:
                self.lora.prepare(self.model, self.trust_remote_code)
            return AsyncLLM.from_engine_args(self.engine_args())

        self.llm = await asyncio.wait_for(asyncio.to_thread(build), timeout=self.cfg.engine_startup_timeout_s)
        mc = self.llm.model_config
        self.vocab_size = mc.get_vocab_size()
        tok = self.llm.get_tokenizer()
        hf_eos = getattr(mc.hf_config, "eos_token_id", None)
        eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        if isinstance(hf_eos, int):
            eos.add(hf_eos)
        elif isinstance(hf_eos, list):
            eos.update(int(e) for e in hf_eos)
        self.eos_token_ids = sorted(eos)
        self.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else self.eos_token_ids[0]
        self.manifest = WeightManifest.from_model(self.model, tied=bool(getattr(mc.hf_config, "tie_word_embeddings", False)))
        if self.adapter_slots is not None:  # each job's adapter has its own slot, manifest and versions
            self.manifest = None
            await self.llm.collective_rpc("meshrl_lora_setup", args=(None,))
        elif self.lora is not None:  # versions are the adapter's tensors
            self.manifest = self.lora.manifest()
            self.lora_request = self.lora.request()
            await self.llm.collective_rpc("meshrl_lora_setup", args=(self.lora.adapter_dir,))

    def served_dtype(self) -> str:
        """The dtype vLLM actually runs the model in (from its model config once started)."""
        dtype = getattr(getattr(self.llm, "model_config", None), "dtype", None)
        return str(dtype).removeprefix("torch.") if dtype is not None else self.dtype

    @property
    def healthy(self) -> bool:
        """True while the engine is loaded and has not died."""
        return self.llm is not None and not self.llm.errored

    def shutdown(self) -> None:
        """Stop vLLM. Its engine-core processes are killed first: their own teardown (freeing
        the model and the KV cache, then a ``gc.collect`` over the whole heap) took 3.5-4 s
        and 3.2 CPU s of a replica's every stop, for memory the process's exit frees anyway."""
        if self.llm is not None:
            manager = getattr(getattr(getattr(self.llm, "engine_core", None), "resources", None), "engine_manager", None)
            stopped = getattr(manager, "manager_stopped", None)
            if stopped is not None:
                stopped.set()  # its liveness monitor then takes the exits below as the shutdown they are
            for proc in getattr(manager, "processes", None) or []:
                if getattr(proc, "is_alive", lambda: False)():
                    proc.kill()
                    proc.join(5)
            self.llm.shutdown()
            self.llm = None

    # -- generation --------------------------------------------------------------------------

    def check_prompt(self, prompt_ids) -> str:
        """Return why ``prompt_ids`` cannot be generated from ("" when it can)."""
        if prompt_ids is None or isinstance(prompt_ids, (str, bytes, dict)) or not hasattr(prompt_ids, "__len__"):
            return f"prompt is not a list of token ids (got {type(prompt_ids).__name__})"
        if len(prompt_ids) == 0:
            return "empty prompt"
        if len(prompt_ids) > self.cfg.prompt_length:
            return f"prompt of {len(prompt_ids)} tokens exceeds prompt_length {self.cfg.prompt_length}"
        try:
            arr = np.asarray(prompt_ids)
        except (ValueError, TypeError) as exc:
            return f"prompt is not a flat list of token ids ({exc})"
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            bad = next((t for t in prompt_ids if isinstance(t, bool) or not isinstance(t, (int, np.integer))), None)
            return f"prompt contains a non-integer token {bad!r}"
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= self.vocab_size:
            t = lo if lo < 0 else hi
            return f"prompt token id {t} is outside the vocabulary [0, {self.vocab_size})"
        return ""

    def sampling_params(self, sampling: SamplingConfig, seed: int | None, *, max_tokens: int | None = None,
                        stop: list[str] | None = None, n: int = 1):
        """vLLM ``SamplingParams`` for one request of ``n`` samples (vLLM seeds its ``k``-th
        with ``seed + k``); ``max_tokens`` / ``stop`` (added to ``rollout.stop``): one
        request's own."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        c = self.cfg
        greedy = (not sampling.do_sample) or sampling.temperature == 0.0
        return SamplingParams(
            n=n,
            temperature=0.0 if greedy else sampling.temperature,
            top_p=1.0 if greedy else sampling.top_p,
            top_k=0 if greedy or sampling.top_k <= 0 else sampling.top_k,
            seed=None if greedy else seed,
            max_tokens=c.response_length if max_tokens is None else int(max_tokens),
            stop=[*c.stop, *(stop or [])] or None,
            stop_token_ids=list(c.stop_token_ids) or None,
            ignore_eos=c.ignore_eos,
            logprobs=0 if c.calculate_log_probs else None,
            detokenize=bool(c.stop or stop),
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    def sample_seed(self, sample_id: str) -> int | None:
        """Per-sample seed: config seed mixed with a hash of the sample id (None if unseeded)."""
        if self.cfg.seed is None:
            return None
        return (self.cfg.seed * 1_000_003 + zlib.crc32(sample_id.encode())) % (2**31 - 1)

    async def generate_one(self, prompt_ids: list[int], sampling: SamplingConfig, sample_id: str, *,
                           max_tokens: int | None = None, seed_key: str | None = None,
                           stop: list[str] | None = None) -> Sample:
        """Generate one sample; failures become ``Sample.error`` (never raised). Keywords as
        ``_generate_checked`` (the OpenAI endpoint sets them per request)."""
        err = self.check_prompt(prompt_ids)
        if err:
            return Sample(prompt_ids=[], policy_version=self.version, finish_reason="error", error=err)
        return await self._generate_checked([int(t) for t in prompt_ids], sampling, sample_id, max_tokens=max_tokens,
                                            seed_key=seed_key, stop=stop)

    async def _generate_checked(
        self, ids: list[int], sampling: SamplingConfig, sample_id: str, *, max_tokens: int | None = None,
        seed_key: str | None = None, stop: list[str] | None = None,
    ) -> Sample:
        """``generate_one`` for a prompt ``check_prompt`` accepted (``ids``: a list of ints).
        ``max_tokens`` caps this request (default ``response_length``); ``seed_key`` replaces
        ``sample_id`` in the seed (the agent loop seeds each turn of a trajectory on its own);
        ``stop``: stop strings of this request, on top of ``rollout.stop``."""
        params = self.sampling_params(sampling, self.sample_seed(seed_key or sample_id), max_tokens=max_tokens,
                                      stop=stop)
        request_id = f"{sample_id}#{self._request_prefix}-{next(self._request_seq)}"
        return (await self._request(ids, params, request_id, 1))[0]

    async def _wait_serving(self) -> str:
        """Wait until a request may be stamped with the served version; returns why it may not
        be served at all ("" when it may)."""
        if self._update_lock.locked():
            # a weight swap is under way: vLLM holds new requests until it resumes, so this one
            # runs wholly on the weights being loaded. Stamped with the old version it would look
            # a version staler than it is (dropped as too stale where the trainer is already at
            # the new one); waiting here costs nothing, the engine is paused anyway.
            async with self._update_lock:
                pass
        return ""

    async def _request(self, ids: list[int], params, request_id: str, n: int) -> list[Sample]:
        """One vLLM request of ``n`` samples (``params.n``), as ``n`` Samples in vLLM's order;
        failures become ``Sample.error`` (never raised, unless the engine died)."""
        refused = await self._wait_serving()
        if refused:
            return [Sample(prompt_ids=[], policy_version=self.version, finish_reason="error", error=refused)
                    for _ in range(n)]
        version = self.version
        self.in_flight += n
        self._live.add(request_id)
        try:
            final = None
            # an already-rendered token input: vLLM validates it in place (a raw prompt dict
            # would be "rendered" on its tokenizer thread pool, a thread hop per request)
            async for out in self.llm.generate({"type": "token", "prompt_token_ids": ids}, params,
                                               request_id=request_id, lora_request=self.lora_request):
                final = out
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a request vLLM rejects must not take the replica down
            if not self.healthy:
                raise EngineDeadError(f"vLLM engine died: {exc}") from exc
            return [Sample(prompt_ids=[], policy_version=version, finish_reason="error", error=f"vllm: {exc}")
                    for _ in range(n)]
        finally:
            self.in_flight -= n
            self._live.discard(request_id)
        comps = sorted(final.outputs, key=lambda c: c.index) if final is not None else []
        out = [self._sample(ids, c, final.finished, version) for c in comps]
        # samples a request aborted before they finished (a weight swap in abort mode)
        out += [Sample(prompt_ids=ids, policy_version=version, finish_reason="abort") for _ in range(n - len(out))]
        return out

    def _sample(self, ids: list[int], comp, finished: bool, version: int) -> Sample:
        """One of a request's completions as a Sample (generated with ``version``)."""
        toks = list(comp.token_ids)
        lps: list[float] = []
        if self.cfg.calculate_log_probs and comp.logprobs is not None:
            lps = [float(step[t].logprob) for step, t in zip(comp.logprobs, toks)]
        self.tokens_generated += len(toks)
        reason = comp.finish_reason or ("abort" if not finished else "stop")
        return Sample(prompt_ids=ids, response_ids=toks, log_probs=lps, policy_version=version, finish_reason=reason)

    async def generate_group(self, prompt_ids: list[int], sampling: SamplingConfig, sample_ids: list[str]) -> list[Sample]:
        """Generate ``len(sample_ids)`` samples of one prompt: one vLLM request with ``n`` of
        them, which vLLM fans out to ``n`` sequences in its engine core (one request instead
        of ``n`` costs the replica's loop far less CPU: docs/performance.md). Sample ``k`` is
        seeded with ``sample_seed(sample_ids[0]) + k``, vLLM's rule for the samples of a
        seeded request: the same ids give the same samples whatever else is batched, and
        sample 0 is what ``generate_one`` makes for its id.

        With ``on_weight_update="abort_requeue"`` a group that lost samples to a weight
        update is regenerated whole (so every sample of a group has one version).
        """
        err = self.check_prompt(prompt_ids)  # once per group, not per sample
        if err:
            return [Sample(prompt_ids=[], policy_version=self.version, finish_reason="error", error=err)
                    for _ in sample_ids]
        ids = [int(t) for t in prompt_ids]
        n = len(sample_ids)
        while True:
            epoch = self._abort_epoch
            params = self.sampling_params(sampling, self.sample_seed(sample_ids[0]), n=n)
            request_id = f"{sample_ids[0]}#{self._request_prefix}-{next(self._request_seq)}"
            samples = await self._request(ids, params, request_id, n)
            aborted = any(s.finish_reason == "abort" for s in samples)
            if not aborted or self.llm is None or self._abort_epoch == epoch:
                return samples
            log.info("group %s aborted by a weight update; regenerating", sample_ids[0])

    # -- weights (see rollout_svc/engine_weights.py) -------------------------------------------

    async def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, *, rollback: bool = False
    ) -> float:
        """Load a full set of checkpoint-format tensors held by this process as ``version``;
        returns seconds spent (:meth:`EngineWeights.update_weights`)."""
        return await self.weights.update_weights(named_tensors, version, rollback=rollback)

    async def _swap(self, load, version: int | None, on_loaded=None, abort: bool = False) -> dict:
        """Pause, run ``load()``, resume (:meth:`EngineWeights.swap`)."""
        return await self.weights.swap(load, version, on_loaded, abort)

    async def param_digest(self, name: str) -> dict:
        """dtype, shape and sha256 of one parameter inside vLLM (tests: bitwise checks)."""
        return await self.weights.param_digest(name)

    # -- several adapters (adapter_slots; rollout_svc/engine_adapters.py) ---------------------

    @property
    def adapters(self) -> dict[str, "AdapterEngine"]:
        """The attached jobs' adapters, by key ({} on a one-job engine)."""
        return self._adapters.adapters if self._adapters is not None else {}

    @property
    def free_adapter_slots(self) -> int:
        """Adapter slots no job holds (0 on a one-job engine)."""
        return self._adapters.free if self._adapters is not None else 0

    async def adapter(self, key: str, lora: LoraServing | None = None, *, cfg: RolloutConfig | None = None,
                      initial_version: int = 0) -> "AdapterEngine":
        """The :class:`AdapterEngine` of job ``key``: the one it has, or a new one on a free slot
        (:meth:`EngineAdapters.attach`: ``lora`` the job's adapter, None for the engine's
        settings from a zero adapter; ``cfg`` the job's rollout block). Raises ValueError (one
        line) for an adapter this engine cannot serve, RuntimeError when every slot is held."""
        if self._adapters is None:
            raise RuntimeError("this engine serves one job; start it with adapter_slots=K to serve several adapters")
        return await self._adapters.attach(key, lora, cfg, initial_version, AdapterEngine)

    async def release_adapter(self, key: str) -> None:
        """Job ``key`` leaves (:meth:`EngineAdapters.release`); stop its ``Replica`` and weight
        subscriber first."""
        if self._adapters is None:
            raise RuntimeError("this engine serves one job; it has no adapter slots")
        await self._adapters.release(key)


class AdapterEngine(RolloutEngine):
    """One job's adapter on a shared :class:`RolloutEngine` (``await engine.adapter(key)``).

    It is what ``Replica`` and the weight subscriber use from an engine: ``generate_group``
    / ``generate_one`` with the job's ``LoRARequest``, the job's served ``version``,
    ``weights_dirty``, ``last_weight_load_s``, ``weights`` (an :class:`EngineWeights` whose
    worker channel, checks and swaps are the job's slot's), ``manifest`` (the job's adapter),
    ``tokens_generated`` / ``in_flight`` of its own requests. The vLLM engine, tokenizer and
    token ids are the shared engine's; ``start`` and ``shutdown`` are the shared engine's
    business (``release_adapter`` ends a job).

    Every version of the slot has a ``LoRARequest`` name of its own (the slot's assignment
    name and the version): vLLM's prefix cache keys KV blocks by that name, so no request of
    another slot, or of another version of this slot, ever reuses this one's cached KV.
    """

    def __init__(self, parent: RolloutEngine, key: str, slot: int, name: str, lora: LoraServing,
                 cfg: RolloutConfig, initial_version: int = 0) -> None:
        # not RolloutEngine.__init__: vLLM and the tokenizer's facts are the parent's
        self.parent = parent
        self.key = key
        self.lora_slot = slot
        self.lora = lora
        self.slot_name = name
        self.cfg = cfg
        self.adapter_slots = None
        self._adapters = None
        self.released = False
        self._clean = asyncio.Event()
        self._clean.set()
        self._dirty = False
        self._version = initial_version
        self.lora_request = lora.request(slot, self._lora_name(initial_version))
        self.manifest = lora.manifest()
        self.last_weight_load_s = 0.0
        self._update_lock = asyncio.Lock()
        self._abort_epoch = 0
        self._request_prefix = uuid.uuid4().hex[:8]
        self._request_seq = itertools.count()
        self._live = set()
        self.in_flight = 0
        self.tokens_generated = 0
        self.prefix_reset_failures = 0
        self.last_update_in_flight = 0
        self.last_load = {}
        self.credential_file: str | None = None
        """The job credential the job's weight channel presents (a fleet's replica serves
        several jobs, each with its own); None: the process's."""
        self.weights = EngineWeights(self)

    # -- the shared engine's -----------------------------------------------------------------

    model = property(lambda self: self.parent.model)
    tokenizer = property(lambda self: self.parent.tokenizer)
    trust_remote_code = property(lambda self: self.parent.trust_remote_code)
    dtype = property(lambda self: self.parent.dtype)
    llm = property(lambda self: self.parent.llm)
    vocab_size = property(lambda self: self.parent.vocab_size)
    pad_token_id = property(lambda self: self.parent.pad_token_id)
    eos_token_ids = property(lambda self: self.parent.eos_token_ids)
    _swap_lock = property(lambda self: self.parent._swap_lock)

    @property
    def healthy(self) -> bool:
        return not self.released and self.parent.healthy

    def served_dtype(self) -> str:
        return self.parent.served_dtype()

    async def start(self) -> None:
        raise RuntimeError("an adapter runs on its engine: start the RolloutEngine")

    def shutdown(self) -> None:
        raise RuntimeError("an adapter runs on its engine: release_adapter() ends it, shutdown() the RolloutEngine")

    # -- the job's serving state ---------------------------------------------------------------

    def _lora_name(self, version: int) -> str:
        return f"{self.slot_name}-v{version}"

    @property
    def version(self) -> int:
        return self._version

    @version.setter
    def version(self, value: int) -> None:
        if value != self._version:
            self._version = value
            self.lora_request = self.lora.request(self.lora_slot, self._lora_name(value))

    @property
    def weights_dirty(self) -> bool:
        return self._dirty

    @weights_dirty.setter
    def weights_dirty(self, value: bool) -> None:
        # a slot's failed load does not pause the engine: the slot's own requests wait instead
        self._dirty = bool(value)
        if self._dirty:
            self._clean.clear()
        else:
            self._clean.set()

    async def _wait_serving(self) -> str:
        await super()._wait_serving()
        while self._dirty and not self.released:
            await self._clean.wait()
        return f"adapter {self.key!r} was released from this engine" if self.released else ""

    async def abort_own_requests(self) -> None:
        """Abort this job's requests in flight (never another job's)."""
        ids = list(self._live)
        if ids and self.llm is not None:
            await self.llm.abort(ids)

    async def _request(self, ids: list[int], params, request_id: str, n: int) -> list[Sample]:
        self.parent.in_flight += n
        try:
            return await super()._request(ids, params, request_id, n)
        finally:
            self.parent.in_flight -= n

    def _sample(self, ids: list[int], comp, finished: bool, version: int) -> Sample:
        sample = super()._sample(ids, comp, finished, version)
        self.parent.tokens_generated += len(sample.response_ids)
        return sample

    async def param_digest(self, name: str) -> dict:
        raise RuntimeError("an adapter's weights are not model parameters")

    def status(self) -> dict:
        """The slot's state (for a fleet's status page)."""
        return {"key": self.key, "slot": self.lora_slot, "lora_name": self.lora_request.lora_name,
                "rank": self.lora.rank, "served_version": self.version, "weights_dirty": self.weights_dirty,
                "requests_in_flight": self.in_flight, "tokens_generated": self.tokens_generated,
                "released": self.released}
