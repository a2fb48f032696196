"""The engine's weight swaps: pause the scheduler, load, resume -- and the weight channel's
RPCs to the receiver that lives inside the vLLM worker (:mod:`rollout_svc.weight_stream`).

:class:`EngineWeights` belongs to one :class:`~rollout_svc.engine.RolloutEngine`
(``engine.weights``) and works on the engine's serving state: the served ``version``, the
``weights_dirty`` flag (a failed load left mixed weights: the scheduler stays paused until a
complete version is loaded), the update lock new requests wait on, the abort epoch that
tells a group to regenerate, and the last load's report and timing.

- ``on_weight_update="finish"``: the scheduler is paused with ``mode="keep"`` (requests stay
  frozen), the weights are reloaded, the running requests are preempted and the prefix cache
  reset (no KV computed by the old weights survives), the scheduler resumes.
- ``on_weight_update="abort_requeue"`` (and a canary's candidate, whatever the setting):
  in-flight requests are aborted; their groups are regenerated under the new version.

On an engine that serves several jobs' adapters (``RolloutEngine(..., adapter_slots=K)``)
each job's :class:`~rollout_svc.engine.AdapterEngine` has an ``EngineWeights`` of its own:
its RPCs name the job's slot (the worker keeps one channel per slot), its loads replace only
that slot's adapter, and its serving state (version, ``weights_dirty``, the update lock) is
the job's. The scheduler is the engine's, so swaps of different slots take turns (the
engine's swap lock); "abort" aborts only the job's own requests, and a failed load never
keeps the engine paused: only that job's requests wait until a complete version is in.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from rollout_svc.lora import LORA_ID
from rollout_svc.weight_check import WeightUpdateError, write_checked_file

log = logging.getLogger("rollout_svc.engine")


class EngineWeights:
    """Weight swaps of one engine and its worker's weight channel (module docstring)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        """The :class:`~rollout_svc.engine.RolloutEngine` (not imported: it imports this module)."""

    @property
    def cfg(self):
        return self.engine.cfg

    @property
    def slot(self) -> int:
        """The adapter slot these weights are (0: the engine's own weights)."""
        return getattr(self.engine, "lora_slot", 0)

    def _slot_args(self) -> tuple:
        return (self.slot,) if self.slot else ()

    def _own_weights(self) -> None:
        """An engine with several adapter slots has no weights of its own to load."""
        if getattr(self.engine, "adapter_slots", None) is not None and not self.slot:
            raise RuntimeError("this engine serves several adapters: load each job's versions through "
                               "engine.adapter(key).weights")

    # -- swaps ---------------------------------------------------------------------------------

    async def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, *, rollback: bool = False
    ) -> float:
        """Load a full set of checkpoint-format tensors held by this process as ``version``
        (local loads: tests, an operator's checkpoint); returns seconds spent.

        The whole set is checked before the engine is touched; on any error
        (:class:`WeightUpdateError`) the engine keeps serving the old weights and version.
        ``version`` must be newer than the served one unless ``rollback``. The weight
        channel does not come here: it streams into the worker (``load_from_channel``).
        """
        e = self.engine
        self._own_weights()
        self.check_version(version, rollback)
        t0 = time.perf_counter()
        fd, path = tempfile.mkstemp(prefix=f"meshrl-weights-v{version}-", suffix=".safetensors")
        os.close(fd)
        try:
            await asyncio.to_thread(write_checked_file, named_tensors, path, e.manifest, e.dtype)

            async def load() -> dict:
                if e.lora is not None:  # an adapter (one job's slot, or the replica's one adapter)
                    method, args = "meshrl_lora_load_file", (path, e.lora.adapter_dir, self.slot or LORA_ID)
                else:
                    method, args = "meshrl_load_safetensors", (path,)
                [res] = (await e.llm.collective_rpc(method, timeout=self.cfg.weight_update_timeout_s, args=args))[:1]
                return {"ok": True, **res}

            res = await self.swap(load, version)
        finally:
            Path(path).unlink(missing_ok=True)
        if not res.get("ok"):
            raise WeightUpdateError(f"loading v{version} failed: {res.get('error')}")
        e.last_weight_load_s = time.perf_counter() - t0
        return e.last_weight_load_s

    def check_version(self, version: int, rollback: bool) -> None:
        if version <= self.engine.version and not rollback:
            raise WeightUpdateError(f"version {version} is not newer than the served version {self.engine.version}")

    async def swap(self, load, version: int | None, on_loaded=None, abort: bool = False) -> dict:
        """Pause the scheduler, run ``load()`` (a worker RPC returning the worker's report;
        ``version`` None: the report names it),
        then resume -- unless the load failed after touching the model (``weights_dirty``):
        then stay paused until a later ``swap`` succeeds. ``abort``: abort the requests in
        flight (they are regenerated) whatever ``on_weight_update`` says.

        One adapter slot of a shared engine (module docstring): "abort" aborts the slot's own
        requests only, and the engine resumes whatever the load did (a dirty slot's requests
        wait in :meth:`AdapterEngine._wait_serving` instead)."""
        e = self.engine
        shared = bool(self.slot)
        async with e._update_lock, e._swap_lock:
            deadline = self.cfg.weight_update_timeout_s
            mode = "keep" if self.cfg.on_weight_update == "finish" and not abort else "abort"
            clock = time.perf_counter()
            timing: dict[str, float] = {}

            def lap(key: str) -> None:
                nonlocal clock
                now = time.perf_counter()
                timing[key] = now - clock
                clock = now

            if shared:  # the engine is never left paused for one slot
                if mode == "abort":
                    e._abort_epoch += 1
                e.last_update_in_flight = e.in_flight
                await asyncio.wait_for(e.llm.pause_generation(mode="keep", clear_cache=False), deadline)
                if mode == "abort":  # (after the pause: a request on its way in is frozen by then, or waits)
                    await e.abort_own_requests()
            elif not e.weights_dirty:  # a dirty engine is paused already
                if mode == "abort":
                    e._abort_epoch += 1
                e.last_update_in_flight = e.in_flight
                await asyncio.wait_for(e.llm.pause_generation(mode=mode, clear_cache=(mode == "abort")), deadline)
            lap("pause_s")
            try:
                res = await load()
            except Exception as exc:  # the RPC itself failed (timeout, worker error): assume the worst
                res = {"ok": False, "touched": True, "refused": False, "error": f"{type(exc).__name__}: {exc}"}
            if res is None:
                res = {"ok": False, "touched": False, "refused": False, "error": None, "none": True}
            lap("load_rpc_s")
            res["timing"] = {**timing, **(res.get("timing") or {})}
            e.last_load = res
            if res.get("ok"):
                e.version = res["version"] if version is None else version
                e.weights_dirty = False
                if on_loaded is not None:  # e.g. the version's session, set together with it
                    on_loaded(res)
            elif res.get("touched"):
                if not e.weights_dirty:
                    log.error("a failed load of v%s left mixed weights (%s): not serving until a complete "
                              "version is loaded", version, res.get("error"))
                e.weights_dirty = True
            if shared or not e.weights_dirty:
                # A slot's new version has a LoRA name of its own (new prefix-cache keys); the
                # slot's frozen requests must still drop the KV of the old weights, and vLLM
                # preempts only all running requests at once (the other slots' recompute
                # theirs, with their unchanged adapters).
                if mode == "keep" and res.get("ok"):
                    await self._reset_prefix_cache(deadline)
                elif shared and e.weights_dirty:  # the slot's requests in vLLM would go on with unknown weights
                    e._abort_epoch += 1  # (their groups are made again once a complete version is in)
                    await e.abort_own_requests()
                lap("reset_s")
                await asyncio.wait_for(e.llm.resume_generation(), deadline)
                lap("resume_s")
                res["timing"].update(timing)
                log.info("%sserving v%s (%s)", f"adapter {e.key!r}: " if shared else "", e.version,
                         "loaded" if res.get("ok") else "load refused, unchanged")
            return res

    async def _reset_prefix_cache(self, deadline: float) -> None:
        """Frozen requests hold KV blocks, so a plain reset would fail and new prompts could
        reuse KV computed by the old weights. Preempting them frees every block (the reset
        then succeeds); they resume by recomputing their prompt + tokens so far with the new
        weights."""
        e = self.engine
        try:
            ok = await asyncio.wait_for(e.llm.reset_prefix_cache(reset_running_requests=True), deadline)
        except Exception as exc:  # noqa: BLE001 - never leave the engine paused over it
            log.warning("prefix cache reset after loading v%s raised %s: %s", e.version, type(exc).__name__, exc)
            ok = False
        if not ok:
            e.prefix_reset_failures += 1
            log.warning("prefix cache reset failed after loading v%s", e.version)

    # -- the weight channel, received inside the worker --------------------------------------

    async def _rpc(self, method: str, *args, timeout: float | None = None) -> list:
        """``method`` on every worker, this slot's channel (the slot is the last argument)."""
        return await self.engine.llm.collective_rpc(method, timeout=timeout or self.cfg.weight_update_timeout_s,
                                                    args=args + self._slot_args())

    async def open_channel(self, cfg, replica_id: str, served_session: int, notify_addr: str | None,
                           promoted_only: bool = False) -> dict:
        """Subscribe every worker to the publisher ``cfg`` (a WeightChannelConfig) describes
        (``promoted_only``: never as a canary)."""
        e = self.engine
        self._own_weights()
        manifest = e.manifest.to_json() if e.manifest is not None else None
        args = (cfg.model_dump_json(), replica_id, e.version, served_session, manifest, notify_addr, promoted_only)
        if self.slot:  # (the slot goes last, then its adapter's directory and the job's credential)
            args += (self.slot, e.lora.adapter_dir, getattr(e, "credential_file", None))
        states = await e.llm.collective_rpc("meshrl_weights_open", args=args,
                                            timeout=cfg.connect_timeout_s + self.cfg.weight_update_timeout_s)
        return states[0]

    async def channel_state(self) -> dict:
        """Worker 0's channel state; a fatal error of any worker wins."""
        states = await self._rpc("meshrl_weights_state")
        return next((s for s in states if s.get("fatal")), states[0])

    async def load_from_channel(self, version: int, *, rollback: bool = False, on_loaded=None,
                                abort: bool = False) -> dict:
        """Stream the pending channel ``version`` into the model (paused meanwhile).
        Returns the worker's report (``ok``, ``error``, ``refused``, ``touched``, bytes...).
        ``abort``: see ``swap`` (a canary's candidate)."""
        self.check_version(version, rollback)

        async def load() -> dict:
            return _combine(await self._rpc("meshrl_weights_load", version))

        t0 = time.perf_counter()
        res = await self.swap(load, version, on_loaded, abort)
        if res.get("ok"):
            self.engine.last_weight_load_s = time.perf_counter() - t0
        return res

    async def skip_update(self, version: int) -> dict:
        """Let the pending ``version`` arrive without loading it (not this replica's version)."""
        return _combine(await self._rpc("meshrl_weights_skip", version))

    async def load_snapshot(self, min_version: int, timeout_s: float, on_loaded=None,
                            abort: bool = False) -> dict | None:
        """Load the publisher's snapshot if it is at least ``min_version`` (the caller picks
        it so that any such snapshot supersedes the served weights); None when there is none.
        The report has the snapshot's ``version`` and ``session``. ``abort``: see ``swap``."""
        async def load() -> dict | None:
            res = await self._rpc("meshrl_weights_load_snapshot", min_version, timeout_s,
                                  timeout=timeout_s + self.cfg.weight_update_timeout_s)
            if any(r is None for r in res):
                return None
            return _combine(res)

        t0 = time.perf_counter()
        res = await self.swap(load, None, on_loaded, abort)
        if res.get("none"):
            return None
        if res.get("ok"):
            self.engine.last_weight_load_s = time.perf_counter() - t0
        return res

    async def snapshot_version(self) -> int:
        """Version of the publisher's snapshot (-1 when none)."""
        return int((await self._rpc("meshrl_weights_snapshot_version"))[0])

    async def report_loaded(self, version: int) -> None:
        await self._rpc("meshrl_weights_loaded", version)

    async def close_channel(self) -> None:
        if self.engine.llm is not None and self.engine.healthy:
            await self._rpc("meshrl_weights_close")

    # -- diagnostics ---------------------------------------------------------------------------

    async def worker_rss(self) -> dict:
        """Resident memory of worker 0's process (``VmRSS``, ``VmHWM`` in bytes)."""
        return (await self.engine.llm.collective_rpc("meshrl_rss_bytes", timeout=self.cfg.weight_update_timeout_s))[0]

    async def param_digest(self, name: str) -> dict:
        """dtype, shape and sha256 of one parameter inside vLLM (tests: bitwise checks)."""
        return (await self.engine.llm.collective_rpc("meshrl_param_digest", args=(name,)))[0]

    async def param_checksum(self, name: str) -> float:
        """Sum of one parameter inside vLLM (diagnostics/tests)."""
        res = await self.engine.llm.collective_rpc("meshrl_param_checksum", args=(name,))
        return float(res[0])


def _combine(results: list) -> dict:
    """One report from every worker's: ok when all are; else the first failure."""
    bad = next((r for r in results if not r.get("ok")), None)
    if bad is None:
        return results[0]
    out = dict(bad)
    out["touched"] = any(r.get("touched") for r in results)
    return out
