"""The replica loop: lease prompt groups, generate, deliver, acknowledge.

``Replica`` ties a :class:`~rollout_svc.engine.RolloutEngine` to the ``prompts`` and
``rollouts`` streams (``services.queues``):

1. lease up to ``rollout.max_groups_in_flight`` prompt items (one DataProto per prompt,
   docs/contracts.md "Items on the three streams");
2. generate ``n`` samples for each row (``meta_info["n"]``, the one source of the group
   size: the feeder writes ``rollout.n``, a validation round ``val_kwargs.n``; sampling with
   ``val_kwargs`` when ``meta_info["validate"]``), all groups concurrently in one vLLM
   engine (continuous batching);
3. put one packed DataProto per group into ``rollouts`` (layout: :mod:`rollout_svc.packing`),
   then ack the prompt item -- only after the downstream write succeeded, so a crash
   loses nothing (the lease is reclaimed by another replica and consumers dedupe on
   ``sample_id``). Items that finish while a write is in flight are written together by
   the next one (one put and one ack per batch, not per group: fewer round trips, and the
   CPU they would cost is the engine's on a small machine).

A bad prompt becomes samples with an ``error`` message; nothing a peer sends can stop the
loop. Per-group varying information (timing, epoch, replica) goes to
``meta_info["metrics"]`` so that ``DataProto.concat`` of groups from different replicas works.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from rollout_svc.engine import RolloutEngine
from rollout_svc.metrics import RolloutMetrics
from rollout_svc.packing import pack_group
from services.config.rollout import RolloutConfig

log = logging.getLogger(__name__)

_RESERVED = ("sample_id", "error", "finish_reason")


class RateTracker:
    """Tokens per second over a sliding window of recent (time, cumulative) points."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._pts: deque[tuple[float, int]] = deque()

    def add(self, total: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._pts.append((now, total))
        while len(self._pts) > 2 and now - self._pts[0][0] > self.window_s:
            self._pts.popleft()

    def rate(self, now: float | None = None) -> float:
        """Tokens/s between the oldest point inside the window and ``now`` (0 when idle)."""
        now = time.monotonic() if now is None else now
        pts = [p for p in self._pts if now - p[0] <= self.window_s]
        if not pts:
            return 0.0
        t0, n0 = pts[0]
        n1 = self._pts[-1][1]
        if len(pts) == 1 and n1 == n0:
            return 0.0
        return (n1 - n0) / (now - t0) if now > t0 else 0.0


RESERVE_MAX_S = 5.0
"""Longest a canary keeps prompt groups for its next version (far below the queue's lease
idle time, so no other replica takes them over); after that it makes them with the one it
serves (no candidate came: a paused rollout, a slow trainer)."""


def _stream_id_age_s(entry_id: str) -> float | None:
    """Age of a Redis-stream-style id ``"<ms>-<seq>"`` in seconds (None if not that form)."""
    head, _, tail = entry_id.partition("-")
    if not (head.isdigit() and tail.isdigit()):
        return None
    return max(0.0, time.time() - int(head) / 1000.0)


def _column_value(col: np.ndarray | None, i: int) -> Any:
    return None if col is None else col[i]


def _pack_agent(pack_trajectories):
    """``pack_group``'s signature for trajectories (their masks come from the turns, not eos)."""

    def pack(samples, *, eos_token_ids=None, **kwargs):
        return pack_trajectories(samples, **kwargs)

    return pack


class Replica:
    """One rollout replica's generation logic and stream loop.

    Args:
        engine: a started :class:`RolloutEngine`.
        cfg: the rollout block (same object the engine got).
        name: replica name (consumer name on ``prompts``).
        prompts / rollouts: ``services.queues`` queues (None for direct-call-only use).
        metrics: the replica's :class:`RolloutMetrics`.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        cfg: RolloutConfig,
        *,
        name: str = "rollout-0",
        prompts=None,
        rollouts=None,
        metrics: RolloutMetrics | None = None,
        agent=None,
    ) -> None:
        self.engine = engine
        self.agent = agent  # rollout_svc.agent.loop.AgentLoop when rollout.multi_turn.enable
        self.cfg = cfg
        self.name = name
        self.prompts = prompts
        self.rollouts = rollouts
        self.metrics = metrics or RolloutMetrics()
        self.metrics.bind(self)
        self.paused = False
        self.groups_in_flight = 0
        self.groups_done = 0
        self.weight_updates = 0
        self.weights_session = 0  # weight-channel session of the served version (0: initial weights)
        self.weights_canary: bool | None = None  # canary mode: whether this replica is a canary (None: mode all)
        self.promoted_only = False  # never a canary: serve promoted versions only (the live-policy endpoint)
        self.rate = RateTracker()
        self._tasks: set[asyncio.Task] = set()
        self._leased_ids: set[Any] = set()  # entry ids of the prompt items being generated
        self._slot_free = asyncio.Event()
        # canary mode: prompt items leased and kept unstarted for the next version (see _keep_for_next)
        self._reserve: list[Any] = []
        self._started = (self._served_version(), 0)  # (served version, groups started with it)
        self._reserve_since = 0.0
        # finished items waiting to be written: (lease, packed groups, done future)
        self._outbox: list[tuple[Any, list, asyncio.Future]] = []
        self._outbox_ready = asyncio.Event()
        self._writer: asyncio.Task | None = None

    # -- generation ----------------------------------------------------------------------------

    async def generate_row(self, data, i: int):
        """Generate the group of row ``i`` of a prompts item; returns one packed DataProto."""
        nt = data.non_tensor_batch or {}
        meta = data.meta_info or {}
        validate = bool(meta.get("validate", False))
        sampling = self.cfg.sampling_for(validate)
        n = meta.get("n")  # the item says how many samples: rollout.n from the feeder, val_kwargs.n in validation
        err = ""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= int(n) <= 4096:
            err, n = f"meta_info n={n!r} is not an integer in [1, 4096] (the samples to draw for the prompt)", 1
        n = int(n)
        uid = _column_value(nt.get("uid"), i)
        if uid is None:
            uid = _column_value(nt.get("sample_id"), i)
        uid = str(uid) if uid is not None else f"{self.name}-{time.time_ns()}-{i}"
        sample_ids = [f"{uid}/{k}" for k in range(n)]
        prompt = _column_value(nt.get("raw_prompt_ids"), i)
        if prompt is None and not err:
            err = "prompt item has no raw_prompt_ids column"
        if isinstance(prompt, np.ndarray):
            prompt = prompt.tolist()
        t0 = time.perf_counter()
        if err:
            from rollout_svc.packing import Sample

            samples = [Sample(prompt_ids=[], policy_version=self.engine.version, finish_reason="error", error=err)] * n
        elif self.agent is not None:
            extra = _column_value(nt.get("extra_info"), i)
            tools_kwargs = extra.get("tools_kwargs") if isinstance(extra, dict) else None
            samples = await self.agent.run_group(prompt, sampling, sample_ids, tools_kwargs)
        else:
            samples = await self.engine.generate_group(prompt, sampling, sample_ids)
        gen_s = time.perf_counter() - t0
        cols = {}
        for key, col in nt.items():
            if key in _RESERVED:
                continue
            arr = np.empty(n, dtype=object)
            for k in range(n):
                arr[k] = col[i]
            cols[key] = arr
        if "uid" not in cols:
            cols["uid"] = np.array([uid] * n, dtype=object)
        versions = [s.policy_version for s in samples]
        pack = pack_group
        if self.agent is not None:
            from rollout_svc.agent.trajectory import Trajectory, pack_trajectories

            samples = [s if isinstance(s, Trajectory) else Trajectory(**vars(s)) for s in samples]
            pack = _pack_agent(pack_trajectories)
        out = pack(
            samples,
            prompt_length=self.cfg.prompt_length,
            response_length=self.cfg.response_length,
            pad_token_id=self.engine.pad_token_id,
            # with ignore_eos the tokens after an eos were generated too: keep them in the mask
            eos_token_ids=[] if self.cfg.ignore_eos else self.engine.eos_token_ids,
            non_tensors=cols,
            sample_ids=sample_ids,
            meta_info={
                "validate": validate,
                "eos_token_id": self.engine.eos_token_ids[0] if self.engine.eos_token_ids else None,
                "pad_token_id": self.engine.pad_token_id,
                "metrics": {
                    "timing/generate_s": gen_s,
                    "rollout/replica": self.name,
                    "rollout/policy_version_min": min(versions),
                    "rollout/epoch": meta.get("epoch"),
                },
            },
        )
        if self.agent is not None:
            out.meta_info["metrics"].update({
                "agent/turns_mean": float(np.mean([s.assistant_turns for s in samples])),
                "agent/tool_calls": int(sum(s.tool_calls for s in samples)),
                "agent/tool_errors": int(sum(s.tool_errors for s in samples)),
                "agent/tool_latency_s": float(sum(s.tool_latency_s for s in samples)),
            })
        n_tok = int(out.batch["response_mask"].sum())
        n_err = sum(1 for s in samples if s.error)
        self.metrics.observe_group(tokens=n_tok, errors=n_err, generate_s=gen_s)
        self.rate.add(self.engine.tokens_generated)
        return out

    async def generate_item(self, data) -> list:
        """All groups of one prompts item (B rows -> B DataProtos), generated concurrently."""
        b = len(data)
        return list(await asyncio.gather(*(self.generate_row(data, i) for i in range(b))))

    # -- the stream loop -------------------------------------------------------------------------

    #: most prompt items one write carries (bounds a put's size and a failed batch's redo)
    MAX_WRITE_ITEMS = 64

    async def _deliver(self, leased, outs: list) -> None:
        """Write ``outs`` to ``rollouts``, then ack ``leased``; returns when both are done
        (raises what the write or the ack raised). Batched with other items by the writer."""
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_loop())
        done = asyncio.get_running_loop().create_future()
        self._outbox.append((leased, outs, done))
        self._outbox_ready.set()
        await done

    async def _write_loop(self) -> None:
        """Drain the outbox: one put of every waiting item's groups, then one ack."""
        while True:
            if not self._outbox:
                self._outbox_ready.clear()
                await self._outbox_ready.wait()
                continue
            batch, self._outbox = self._outbox[: self.MAX_WRITE_ITEMS], self._outbox[self.MAX_WRITE_ITEMS :]
            try:
                # the ledger records "generated" once: a redo (after a crash) must not set back
                # samples a later stage already reached
                first = [g for leased, outs, _ in batch if leased.delivery_count <= 1 for g in outs]
                again = [g for leased, outs, _ in batch if leased.delivery_count > 1 for g in outs]
                if first:
                    await self.rollouts.put(first, stage="generated")
                if again:
                    await self.rollouts.put(again)
                await self.prompts.ack([leased for leased, _, _ in batch])
            except asyncio.CancelledError:
                for *_, done in batch:
                    done.cancel()
                raise
            except Exception as exc:  # every item of the batch stays leased (reclaimed, retried)
                for *_, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                continue
            for *_, done in batch:
                if not done.done():
                    done.set_result(None)

    async def _process(self, leased) -> None:
        try:
            outs = await self.generate_item(leased.data)
            await self._deliver(leased, outs)
            self.groups_done += len(outs)
            samples = sum(len(o) for o in outs)
            self.metrics.samples.inc(samples)
            if leased.delivery_count > 1:
                self.metrics.regenerated.inc(samples)
        except asyncio.CancelledError:
            raise
        except Exception:  # keep the lease: the item is reclaimed and retried, never lost
            log.exception("replica %s: group %s failed; leaving it leased for reclaim", self.name, leased.id)
            self.metrics.failed_items.inc()
        finally:
            self._leased_ids.discard(leased.id)
            self.groups_in_flight -= 1
            self._slot_free.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Lease, generate, deliver, ack until ``stop`` is set; then finish what is in flight."""
        if self.prompts is None or self.rollouts is None:
            raise RuntimeError("Replica.run needs the prompts and rollouts queues")
        limit = self.cfg.max_groups_in_flight
        while not stop.is_set():
            if self._reserve and (not self.weights_canary or time.monotonic() - self._reserve_since > RESERVE_MAX_S):
                self.weights_loaded()  # no longer a canary, or no version came (a pause): make them now
            free = limit - self.groups_in_flight
            if self.paused or free <= 0:
                self._slot_free.clear()
                try:
                    await asyncio.wait_for(self._slot_free.wait(), timeout=self.cfg.lease_timeout_s)
                except TimeoutError:
                    pass
                continue
            try:
                items = await self.prompts.get(max_items=min(free, 64), timeout=self.cfg.lease_timeout_s)
            except Exception:
                log.exception("replica %s: leasing prompts failed; retrying", self.name)
                await asyncio.sleep(min(1.0, self.cfg.lease_timeout_s))
                continue
            for it in items:
                if it.id in self._leased_ids:
                    # our own lease, idle past queues.lease_idle_s while its group generates
                    # (a slow machine, a long weight update), handed back to us: generating it
                    # twice would only waste the engine; the first run acks it
                    continue
                self._leased_ids.add(it.id)
                age = _stream_id_age_s(str(it.id))
                if age is not None:
                    self.metrics.queue_lag.observe(age)
                if self._keep_for_next():
                    if not self._reserve:
                        self._reserve_since = time.monotonic()
                    self._reserve.append(it)
                else:
                    self._start(it)
        if self._reserve:  # stopping: make what was kept rather than leave it leased until it idles out
            self.weights_loaded()
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self._writer is not None:  # nothing is waiting on it any more
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
            self._writer = None

    def _served_version(self) -> int:
        return getattr(self.engine, "version", 0)  # (no engine: the delivery tests)

    def _start(self, item) -> None:
        version, count, now = *self._started, self._served_version()
        self._started = (now, count + 1 if version == now else 1)
        self.groups_in_flight += 1
        task = asyncio.create_task(self._process(item))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _keep_for_next(self) -> bool:
        """Canary mode: whether a newly leased prompt group waits, unstarted, for the next
        version this canary loads. A candidate is judged on its first
        ``rollout.canary_reserve_groups`` groups; on a trainer-bound job every prompt the
        admission window allows is already made when the candidate loads, so the canary had
        nothing to make with it until the trainer's step ended and freed room, and the
        candidate was judged a step later than it could be. Once it has started that many
        groups with the version it serves, a canary keeps up to as many more in reserve and
        starts them the moment it loads the next version (:meth:`weights_loaded`)."""
        n = self.cfg.canary_reserve_groups
        if not n or not self.weights_canary or len(self._reserve) >= n:
            return False
        version, count = self._started
        return version == self._served_version() and count >= n

    def weights_loaded(self) -> None:
        """The engine serves a new version (the weight subscriber calls this): start the
        groups kept for it, whose samples are then of this version."""
        kept, self._reserve = self._reserve, []
        for it in kept:
            self._start(it)

    def pause(self) -> None:
        """Stop leasing new prompt groups (in-flight groups finish)."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._slot_free.set()

    # -- weights ---------------------------------------------------------------------------------

    async def apply_weights(
        self, version: int, named_tensors: Iterable[tuple[str, torch.Tensor]], *, session: int | None = None
    ) -> float:
        """Load ``version`` into the engine in place (see ``RolloutEngine.update_weights``).

        ``session``: the weight-channel session the version belongs to. A version of a new
        session replaces the served one even when its number is not higher (see
        ``supersedes``)."""
        rollback = session is not None and self.other_line(session)
        secs = await self.engine.update_weights(named_tensors, version, rollback=rollback)
        if session is not None:
            self.weights_session = session
        self.weight_updates += 1
        self.metrics.weight_load.observe(secs)
        log.info("replica %s now serves policy version %d (loaded in %.3fs)", self.name, version, secs)
        return secs

    def other_line(self, session: int) -> bool:
        """True when the served weights came from a weight-channel session other than
        ``session`` (not the initial weights): that session's version numbers are not
        comparable with the served one."""
        return self.weights_session not in (0, session)

    def supersedes(self, version: int, session: int) -> bool:
        """Whether ``version`` of weight-channel ``session`` should replace the served weights:
        it is newer, or the served version came from another session. A trainer that
        restarted from a checkpoint numbers its versions again from that checkpoint, below
        what the run that died had published; its versions are the ones that count."""
        return version > self.engine.version or self.other_line(session)

    def status(self) -> dict[str, Any]:
        """A JSON-able snapshot of the replica's state (also ``/status`` and gRPC Status)."""
        return {
            "replica": self.name,
            "model": self.engine.model,
            "served_version": self.engine.version,
            "weights_role": {True: "canary", False: "promoted", None: "all"}[self.weights_canary],
            "ready": self.engine.healthy and not self.engine.weights_dirty,
            "paused": self.paused,
            "requests_in_flight": self.engine.in_flight,
            "groups_in_flight": self.groups_in_flight,
            "tokens_generated": self.engine.tokens_generated,
            "tokens_per_s": self.rate.rate(),
            "last_weight_load_s": self.engine.last_weight_load_s,
            "weight_updates": self.weight_updates,
            "groups_done": self.groups_done,
        }
