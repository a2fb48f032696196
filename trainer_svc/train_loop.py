"""The trainer service loop, run by every rank (rank 0 leads).

Per step:

1. rank 0 leases a batch from the intake (``wait`` time) -- while waiting it broadcasts
   ``wait`` heartbeats so the other ranks' collectives never hit their deadline;
2. rank 0 broadcasts ``train`` + the batch (a ``services.wire`` frame) to every rank;
3. every rank runs :meth:`TrainerWorker.step` (``compute`` time);
4. every rank gathers full parameters layer by layer, rank 0 feeds the weight publisher
   (``publish`` time) -- only when the step changed the weights;
5. rank 0 commits the batch (acks its queue items) -- only now is the step committed;
6. a checkpoint every ``save_freq`` steps, and on SIGTERM / at the end.

SIGTERM (forwarded by the launcher to every rank) sets a flag; rank 0 notices it between
polls and broadcasts ``stop``; all ranks then save a checkpoint and exit 0.

How a new version reaches the replicas is the trainer's promotion policy
(:class:`trainer_svc.promotion.base.PromotionPolicy`, built once from the view): the loop
calls the same hooks whatever the policy -- what to do instead of leasing a batch
(``next_command``, ``offer``, ``wait_resumed``), what to add to a step's control
(``step_control``), the verdict on a candidate a batch carries (``judge``, inside the step)
and what to do with it (``decide``, before the step's updates), and what follows a step or a
publish (``after_step``, ``on_publish``). A step's control may say that its version goes
nowhere (``publish: False``: not gathered at all), or that its starting weights are to be
offered as soon as its verdict promotes (``offer_on_promotion``); a ``publish`` command
offers the current weights, ``again`` under the next version number.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import signal
import time
from collections.abc import Callable
from typing import Any

from services.config.views import TrainerView
from trainer_svc.checkpoint import CheckpointManager
from trainer_svc.comm import broadcast_message
from trainer_svc.fsdp import DistContext
from trainer_svc.loop_metrics import TrainerMetrics
from trainer_svc.promotion import PromotionPolicy, make_policy
from trainer_svc.worker import StepResult, TrainerWorker

logger = logging.getLogger("meshrl.trainer")

class TrainerService:
    """Drives one rank. ``source`` (rank 0 only) is a ``QueueIntake`` or ``SyntheticIntake``;
    ``publisher`` (rank 0 only) has ``publish(version, named_tensors)`` or is ``None``;
    ``policy``: the promotion policy (:func:`trainer_svc.promotion.make_policy` of the view
    when not given), which the worker's step uses too."""

    def __init__(
        self,
        spec: TrainerView,
        ctx: DistContext,
        worker: TrainerWorker,
        *,
        source: Any = None,
        publisher: Any = None,
        metrics: TrainerMetrics | None = None,
        on_ready: Callable[[], None] | None = None,
        policy: PromotionPolicy | None = None,
    ) -> None:
        self.spec, self.ctx, self.worker = spec, ctx, worker
        self.policy = policy if policy is not None else make_policy(spec, publisher)
        worker.policy = self.policy
        self.source, self.publisher, self.metrics = source, publisher, metrics
        self.ckpt = CheckpointManager(spec.trainer.default_local_dir, ctx, spec.trainer.max_ckpt_to_keep)
        self.step_no = 0
        self._saved_step = 0
        self.stop_requested = False
        self.ready = False
        self.on_ready = on_ready  # called once, when ready (rank 0 announces readiness)
        self.last_result: StepResult | None = None
        self._consecutive_nonfinite = 0
        self._loop = asyncio.new_event_loop() if ctx.rank == 0 else None
        self._t_start = time.monotonic()
        self._t_wait = 0.0

    # ------------------------------------------------------------------ setup

    def install_signal_handlers(self) -> None:
        def on_term(signum, _frame):
            logger.warning("rank %d: signal %d received, stopping after the current step", self.ctx.rank, signum)
            self.stop_requested = True

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)

    def resume(self) -> None:
        """Load the latest checkpoint when ``trainer.resume == "auto"`` and one exists."""
        if self.spec.trainer.resume != "auto":
            return
        step = self.ckpt.latest_step()
        if step is None:
            return
        state = self.ckpt.load(step, self.worker)
        self.step_no = self._saved_step = state["step"]
        if self.source is not None:
            self.source.restore(state)
            self._sync_counters()  # the sample counters continue from the checkpoint

    def status(self) -> dict[str, Any]:
        r = self.last_result
        return {
            "step": self.step_no,
            "version": self.worker.version,
            "last": None if r is None else {"metrics": r.metrics, "applied": r.applied, "seconds": r.seconds},
            "intake": None if self.source is None else self.source.counters.as_dict(),
            **self.policy.status(),
        }

    # ------------------------------------------------------------------ loop

    def run(self) -> int:
        """Train until ``trainer.total_steps`` or a stop signal; returns an exit code."""
        spec = self.spec
        if self.metrics is not None:  # a resumed trainer serves its checkpoint's version before its first step
            self.metrics.version.set(self.worker.version)
        self._publish(initial=True)
        self.ready = True
        if self.on_ready is not None:
            self.on_ready()
        while True:
            control, batch, pending = self._next_command()
            if control["cmd"] in ("publish", "wait"):  # no step (rank 0 alone sees "wait")
                if control["cmd"] == "publish":
                    if control.get("again"):  # the same weights, offered again under the next version number
                        self.worker.version += 1
                    self._publish()
                continue
            if control["cmd"] == "stop":
                if control.get("checkpoint", True) and self.step_no > self._saved_step:
                    self._save()
                self._join_export()
                return int(control.get("code", 0))
            t0 = time.perf_counter()
            failed: list[BaseException] = []  # rank 0: the policy's decision, made within the step

            early = {"offered": False, "seconds": 0.0}  # the step's starting weights, offered within it

            def on_verdict(verdict: dict, removed: Any) -> None:
                if (exc := self._decide(pending, verdict, removed)) is not None:
                    failed.append(exc)

            def after_verdict(verdict: dict) -> None:  # every rank: the same control, the same verdict
                if control.get("offer_on_promotion") and verdict["promoted"]:
                    t = time.perf_counter()
                    self._publish()
                    early.update(offered=True, seconds=time.perf_counter() - t)

            result = self.worker.step(batch, on_verdict=on_verdict if self.ctx.rank == 0 else None,
                                      after_verdict=after_verdict)
            t1 = time.perf_counter()
            if failed:
                raise failed[0]  # now that the step's collectives are done
            self.policy.after_step(result)
            # offered within the step: its own version goes nowhere (that offer is the candidate now)
            if result.applied and control.get("publish", True) and not early["offered"]:
                self._publish()
            t1 -= early["seconds"]  # the within-step offer counts as publishing, not computing
            t2 = time.perf_counter()
            nothing_left = result.samples == 0  # every row was a rejected candidate's: nothing to train
            if self.ctx.rank == 0:
                self._loop.run_until_complete(self.source.commit(pending, applied=result.applied or nothing_left))
            self.step_no += 1
            self.last_result = result
            if not nothing_left:
                self._consecutive_nonfinite = 0 if result.applied else self._consecutive_nonfinite + 1
            t3 = time.perf_counter()
            # or early: the items held for the next checkpoint would fill the experience stream
            if (spec.trainer.save_freq > 0 and self.step_no % spec.trainer.save_freq == 0) or control.get("save"):
                self._save()
            t4 = time.perf_counter()
            self._report(result, pending, {"compute": t1 - t0, "publish": t2 - t1, "commit": t3 - t2, "checkpoint": t4 - t3})

    def _next_command(self):
        """Rank 0 decides what happens next and tells everyone; returns (control, batch, pending)."""
        spec = self.spec
        if self.ctx.rank != 0:
            while True:
                control, batch = broadcast_message(None, None, group=self.ctx.cpu_group)
                if control["cmd"] != "wait":
                    return control, batch, None
        pending = None
        if self.step_no >= spec.trainer.total_steps:
            control = {"cmd": "stop", "checkpoint": True}
        elif self._consecutive_nonfinite >= spec.trainer.stop_on_nonfinite:
            logger.error("%d consecutive steps had non-finite losses; stopping", self._consecutive_nonfinite)
            control = {"cmd": "stop", "checkpoint": False, "code": 3}
        elif self.stop_requested:
            control = {"cmd": "stop", "checkpoint": True}
        elif (command := self.policy.next_command(self.worker.version)) is not None:
            control = command
        else:
            t0 = time.perf_counter()
            last_beat = [time.monotonic()]
            beat_every = min(10.0, spec.trainer.collective_timeout_s / 4)

            def heartbeat() -> None:
                self._sync_counters()  # drops count as finished at once (admission control)
                if time.monotonic() - last_beat[0] >= beat_every:
                    broadcast_message({"cmd": "wait"}, None, group=self.ctx.cpu_group)
                    last_beat[0] = time.monotonic()

            resumed_offer = self.policy.wait_resumed(self.worker.version, heartbeat, lambda: self.stop_requested)
            if resumed_offer is not None:
                pending, control = None, resumed_offer
            else:
                try:
                    pending = self._loop.run_until_complete(
                        self.source.next_batch(
                            self.worker.version,
                            timeout=spec.trainer.batch_wait_timeout_s,
                            should_stop=lambda: self.stop_requested,
                            heartbeat=heartbeat,
                        )
                    )
                except TimeoutError as exc:
                    logger.error("%s", exc)
                    pending, control = None, {"cmd": "stop", "checkpoint": True, "code": 4}
                else:
                    control = {"cmd": "train"} if pending is not None else {"cmd": "stop", "checkpoint": True}
                    if pending is not None and pending.data is None:  # the policy decided at the intake
                        pending, control = None, self.policy.offer(self.worker.version) or {"cmd": "wait"}
                    if pending is not None and getattr(self.source, "needs_checkpoint", lambda: False)():
                        control["save"] = True
                    if pending is not None:
                        control.update(self.policy.step_control(pending.data, self.worker.version))
            wait = time.perf_counter() - t0
            self._t_wait += wait
            if self.metrics is not None:
                self.metrics.phase.labels("wait").inc(wait)
                self.metrics.last.labels("wait").set(wait)
        batch = pending.data if pending is not None else None
        broadcast_message(control, batch, group=self.ctx.cpu_group)
        return control, batch, pending

    def _decide(self, pending: Any, verdict: dict, removed: Any) -> BaseException | None:
        """Rank 0, inside the step that judged a candidate, between the old log-probs and the
        updates: account for the rows the verdict leaves out, then let the policy act on it
        (a promoted version goes out while the step updates). An error is returned, to be
        raised once the step's collectives are done (raising here would leave the other
        ranks waiting in them)."""
        try:
            if removed is not None and bool(removed.any()):
                pending.remove(removed, rejected=not verdict["promoted"])
            self.policy.decide(verdict)
        except Exception as exc:
            return exc
        return None

    def _publish(self, initial: bool = False) -> None:
        """Gather full parameters (all ranks); rank 0 streams them to the publisher."""
        if self.spec.weights is None:
            return
        self.policy.on_publish(self.worker, initial)
        it = self.worker.full_params()
        if self.ctx.rank != 0:
            for _ in it:
                pass
            return
        counted = {"bytes": 0, "tensors": 0}

        def counting():
            for name, t in it:
                counted["bytes"] += t.numel() * t.element_size()
                counted["tensors"] += 1
                yield name, t

        gen = counting()
        t0 = time.perf_counter()
        try:
            report = self.publisher.publish(self.worker.version, gen, promote=initial)
            if getattr(report, "error", None):
                logger.warning("weights v%d: transfer to some replicas failed: %s", self.worker.version, report.error)
        except Exception as exc:  # a publisher failure must not desync the ranks or kill training
            logger.error("weights v%d: publish failed: %s", self.worker.version, exc)
        finally:
            for _ in gen:  # drain: the other ranks are inside the same all-gathers
                pass
        logger.info("weights v%d: published %d tensors, %d bytes (%s)", self.worker.version, counted["tensors"],
                    counted["bytes"], "LoRA adapter" if self.spec.model.lora else "full weights")
        if self.metrics is not None and not initial:
            self.metrics.weight_bytes.inc(counted["bytes"])
            self.metrics.weight_seconds.set(time.perf_counter() - t0)

    def _save(self) -> None:
        extra = self.source.state() if self.ctx.rank == 0 and self.source is not None else {}
        path = self.ckpt.save(self.step_no, self.worker, extra)
        self._saved_step = self.step_no
        if self.ctx.rank == 0 and "hf_model" in self.spec.actor.checkpoint.save_contents:
            self._export(path)
        acks_due = getattr(self.source, "acks_due", None) if self.ctx.rank == 0 else None
        if acks_due is not None:
            try:
                self._loop.run_until_complete(acks_due())
            except Exception as exc:  # noqa: BLE001 - left leased: covered by the checkpoint, acked on restart
                logger.error("acking the items of checkpoint %d failed (acked after a restart): %s", self.step_no, exc)

    def _export(self, path) -> None:
        """Write ``<checkpoint>/huggingface`` from the checkpoint just saved, on a thread of
        rank 0 (training goes on; the next export and the exit wait for it)."""
        import threading

        from trainer_svc.hf_export import export_hf

        self._join_export()
        model = self.spec.model

        def work() -> None:
            try:
                export_hf(path, path / "huggingface", model_dir=model.path, tokenizer_dir=model.tokenizer_path,
                          overwrite=True)
                logger.info("checkpoint %s: Hugging Face copy in %s", path.name, path / "huggingface")
            except Exception as exc:  # noqa: BLE001 - the checkpoint itself is complete; only the copy is missing
                logger.error("checkpoint %s: writing the Hugging Face copy failed: %s", path.name, exc)

        self._export_thread = threading.Thread(target=work, name="hf-export", daemon=True)
        self._export_thread.start()

    def _join_export(self, timeout: float = 600.0) -> None:
        t = getattr(self, "_export_thread", None)
        if t is not None:
            t.join(timeout)

    def _sync_counters(self) -> None:
        """Bring the Prometheus sample counters up to the intake's running totals."""
        mt, src = self.metrics, self.source
        if mt is None or src is None:
            return
        c = src.counters
        seen = self.__dict__.setdefault("_seen", {})
        totals = {"samples": c.samples_trained + c.samples_nonfinite, "stale": c.dropped_stale,
                  "error": c.dropped_error, "failed": c.scored_failed, "rejected": c.dropped_rejected}
        mt.held.set(self.policy.held_samples())
        for key, metric in (("samples", mt.samples), ("stale", mt.stale), ("error", mt.errors), ("failed", mt.failed),
                            ("rejected", mt.rejected)):
            now = totals[key]
            if now > seen.get(key, 0):
                metric.inc(now - seen.get(key, 0))
            seen[key] = max(now, seen.get(key, 0))

    def _report(self, result: StepResult, pending: Any, seconds: dict[str, float]) -> None:
        if self.ctx.rank != 0:
            return
        m = result.metrics
        logger.info(
            "step %d version %d %s loss=%.5f grad_norm=%.4f samples=%d compute=%.2fs",
            self.step_no, result.version, "applied" if result.applied else
            "trained nothing (every row was a rejected candidate's)" if result.verdict is not None and result.samples == 0
            else "SKIPPED (non-finite)",
            m.get("actor/loss", float("nan")), m.get("actor/grad_norm", float("nan")), result.samples,
            seconds["compute"],
        )
        if self.spec.trainer.metrics_file:
            line = {
                "step": self.step_no, "time": time.time(), "version": result.version, "applied": result.applied,
                "skipped_steps": result.skipped_steps, "samples": result.samples,
                "staleness": pending.staleness, "seconds": seconds, "metrics": m,
            }
            line.update(self.policy.report(result))  # e.g. a verdict on a candidate, with its measurements
            with open(self.spec.trainer.metrics_file, "a") as f:
                f.write(json.dumps(line) + "\n")
        mt = self.metrics
        if mt is None:
            return
        for phase, s in seconds.items():
            mt.phase.labels(phase).inc(s)
            mt.last.labels(phase).set(s)
        mt.steps.inc()
        mt.skipped.inc(result.skipped_steps)
        mt.version.set(result.version)
        mt.tokens.inc(result.tokens)
        for lag in pending.staleness:
            mt.staleness.observe(lag)
        for key, gauge in mt.gauges.items():
            if key in m and math.isfinite(m[key]):
                gauge.set(m[key])
        self._sync_counters()
        total = time.monotonic() - self._t_start
        mt.idle.set(self._t_wait / total if total > 0 else 0.0)
