"""Several jobs' LoRA adapters on one engine: which job holds which slot, attaching and releasing.

:class:`EngineAdapters` belongs to a :class:`~rollout_svc.engine.RolloutEngine` started with
``adapter_slots=K`` (``engine.adapter(key)``, ``engine.release_adapter(key)`` call it). A
job that attaches gets the lowest free slot (a vLLM LoRA id in 1..K, bookkept by
:class:`~rollout_svc.lora.AdapterSlots`), its starting adapter (its ``lora_adapter_path``,
or a zero adapter written for its rank and targets) is loaded into that slot whole, and it
gets an :class:`~rollout_svc.engine.AdapterEngine`: the job's own serving state on the
shared vLLM engine. A job that leaves has its requests still in flight aborted, its weight
channel closed inside the worker and its slot freed, for the next key to take.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from rollout_svc.lora import AdapterSlots, LoraServing, serving_problems

log = logging.getLogger("rollout_svc.engine")


class EngineAdapters:
    """The adapter slots of one engine and the jobs attached to them (module docstring)."""

    def __init__(self, engine: Any, count: int) -> None:
        self.engine = engine
        """The :class:`~rollout_svc.engine.RolloutEngine` (not imported: it imports this module)."""
        self.slots = AdapterSlots(count)
        self.adapters: dict[str, Any] = {}
        """Key -> :class:`~rollout_svc.engine.AdapterEngine` of every attached job."""
        self._lock = asyncio.Lock()

    @property
    def free(self) -> int:
        return len(self.slots.free())

    def problems(self, job: LoraServing, cfg) -> list[str]:
        """Why the engine cannot serve ``job`` with rollout block ``cfg`` (one line each)."""
        e = self.engine
        hf = getattr(e.llm.model_config, "hf_config", None)
        out = serving_problems(job, e.lora.max_lora_rank, hf.to_dict() if hf is not None else None)
        limit = e.cfg.max_model_len or (e.cfg.prompt_length + e.cfg.response_length)
        if cfg.prompt_length is None or cfg.response_length is None:
            out.append("its rollout config needs prompt_length and response_length resolved")
        elif cfg.prompt_length + cfg.response_length > limit:
            out.append(f"prompt_length + response_length ({cfg.prompt_length} + {cfg.response_length}) exceeds "
                       f"the engine's max_model_len {limit}")
        return out

    async def attach(self, key: str, lora: LoraServing | None, cfg, initial_version: int, make):
        """Job ``key``'s adapter engine (``make``: the AdapterEngine class): the one it has (the
        same settings asked again), or a new one on the lowest free slot."""
        e = self.engine
        if e.llm is None:
            raise RuntimeError("start() the engine before attaching adapters")
        async with self._lock:
            have = self.adapters.get(key)
            if have is not None:
                if lora is not None and not have.lora.same_settings(lora):
                    raise ValueError(f"adapter {key!r} is attached with other settings (rank {have.lora.rank}, alpha "
                                     f"{have.lora.alpha}, targets {have.lora.targets}); release it first")
                return have
            job = lora if lora is not None else LoraServing(e.lora.rank, e.lora.alpha, e.lora.targets,
                                                             adapter_dir=e.lora.adapter_dir)
            cfg = cfg or e.cfg
            problems = self.problems(job, cfg)
            if problems:
                raise ValueError(f"adapter {key!r}: " + "; ".join(problems))
            slot = self.slots.take(key)  # RuntimeError (one line) when all are held
            name = self.slots.name(key)
            try:
                await asyncio.to_thread(job.prepare, e.model, e.trust_remote_code)
                await e.llm.collective_rpc("meshrl_lora_assign", args=(slot, name, job.adapter_dir),
                                           timeout=e.cfg.weight_update_timeout_s)
            except Exception as exc:
                self.slots.release(key)
                lines = str(exc).strip().splitlines()
                raise ValueError(f"adapter {key!r}: vLLM cannot serve {job.adapter_dir}: "
                                 f"{type(exc).__name__}: {lines[-1] if lines else ''}") from exc
            adapter = make(e, key, slot, name, job, cfg, initial_version)
            self.adapters[key] = adapter
            log.info("adapter %r: slot %d (rank %d), starting from %s", key, slot, job.rank, job.adapter_dir)
            return adapter

    async def release(self, key: str) -> None:
        """Job ``key`` leaves: its requests in flight are aborted, its weight channel closed,
        its slot freed (nothing is served under it until the next key takes it). Its
        ``AdapterEngine`` refuses requests from now on (``Sample.error``)."""
        e = self.engine
        async with self._lock:
            adapter = self.adapters.get(key)
            if adapter is None:
                raise KeyError(f"no adapter {key!r} on this engine")
            adapter.released = True
            adapter._clean.set()  # requests waiting on a dirty slot see the release
            try:
                if e.healthy:
                    async with adapter._update_lock, e._swap_lock:  # not in the middle of the slot's own load
                        await adapter.abort_own_requests()
                        await e.llm.collective_rpc("meshrl_lora_release", args=(adapter.lora_slot,),
                                                   timeout=e.cfg.weight_update_timeout_s)
            finally:
                del self.adapters[key]
                self.slots.release(key)
            log.info("adapter %r: released slot %d", key, adapter.lora_slot)
