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

With the canary gate (``weights.rollout.mode: canary``, :mod:`trainer_svc.canary`) a batch
may carry a candidate version's samples: the step judges them, rank 0 tells the publisher
(promote / reject) within the step, before its updates (so before the step's own version is
published); on a promotion, the step's starting weights -- made while the candidate was
under test, never gathered -- are gathered and offered as the next candidate there and then
(:func:`canary.offer_on_promotion`), and a version that would go nowhere (a candidate is
still under test) is not gathered at all. After a rejection the
loop follows ``on_reject``: it pauses (heartbeats only) until the rollout is resumed, or
stops with ``REJECT_EXIT_CODE``.
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

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.config.views import TrainerView
from services.config.weights import REJECT_EXIT_CODE
from trainer_svc import canary
from trainer_svc.checkpoint import CheckpointManager
from trainer_svc.comm import broadcast_message
from trainer_svc.fsdp import DistContext
from trainer_svc.worker import StepResult, TrainerWorker

logger = logging.getLogger("meshrl.trainer")

_GAUGES = {
    "actor/loss": ("meshrl_trainer_loss", "total actor loss of the last step"),
    "actor/pg_loss": ("meshrl_trainer_pg_loss", "policy-gradient loss of the last step"),
    "actor/pg_clipfrac": ("meshrl_trainer_pg_clipfrac_ratio", "fraction of tokens whose ratio was clipped"),
    "actor/ppo_kl": ("meshrl_trainer_ppo_kl", "approx KL(old || new) over the last step"),
    "actor/entropy": ("meshrl_trainer_entropy_nats", "mean token entropy of the policy"),
    "actor/kl_loss": ("meshrl_trainer_kl_loss", "KL(actor || ref) loss term"),
    "actor/grad_norm": ("meshrl_trainer_grad_norm", "global gradient L2 norm before clipping"),
    "actor/lr": ("meshrl_trainer_learning_rate", "current actor learning rate"),
    "critic/score/mean": ("meshrl_trainer_reward_mean", "mean sequence score of the last batch"),
    "training/rollout_probs_diff_mean": (
        "meshrl_trainer_rollout_probs_diff_mean", "mean |p_rollout - p_trainer| of the sampled tokens, last batch"
    ),
    "training/rollout_probs_diff_max": (
        "meshrl_trainer_rollout_probs_diff_max", "max |p_rollout - p_trainer| of the sampled tokens, last batch"
    ),
    "training/rollout_logprob_gap_mean": (
        "meshrl_trainer_rollout_logprob_gap_mean",
        "mean |log p_trainer - log p_rollout| of the sampled tokens, last batch (what the canary gate compares)",
    ),
}


class TrainerMetrics:
    """Prometheus metrics of the trainer (rank 0's registry)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = self.registry = registry
        self.phase = Counter("meshrl_trainer_phase_seconds_total", "seconds spent per phase", ["phase"], registry=r)
        self.last = Gauge("meshrl_trainer_step_seconds", "duration of the last step per phase", ["phase"], registry=r)
        self.steps = Counter("meshrl_trainer_steps_total", "committed training steps", registry=r)
        self.skipped = Counter(
            "meshrl_trainer_nonfinite_steps_total", "optimizer steps skipped for a NaN/inf loss", registry=r
        )
        self.version = Gauge("meshrl_trainer_policy_version", "current policy version", registry=r)
        self.samples = Counter("meshrl_trainer_samples_total",
                               "samples consumed by committed steps (trained, or skipped as non-finite)", registry=r)
        self.tokens = Counter("meshrl_trainer_tokens_total", "tokens (prompt+response) trained on", registry=r)
        self.stale = Counter("meshrl_trainer_dropped_stale_samples_total",
                             "samples dropped for their policy version (too stale, or rejected at the canary)",
                             registry=r)
        self.rejected = Counter("meshrl_trainer_dropped_rejected_samples_total",
                                "of the dropped_stale samples: those of a version rejected at the canary", registry=r)
        self.held = Gauge("meshrl_trainer_canary_held_samples",
                          "samples of the candidate version held until it is judged", registry=r)
        self.errors = Counter("meshrl_trainer_dropped_error_samples_total",
                              "samples dropped for a rollout error (no usable response)", registry=r)
        self.failed = Counter("meshrl_trainer_failed_score_samples_total",
                              "samples trained with score 0 because the reward function failed", registry=r)
        self.staleness = Histogram(
            "meshrl_trainer_staleness_versions", "policy-version lag of trained samples",
            buckets=(0, 1, 2, 3, 4, 6, 8, 16, 32, math.inf), registry=r,
        )
        self.weight_bytes = Counter("meshrl_trainer_weight_bytes_total", "parameter bytes published", registry=r)
        self.weight_seconds = Gauge("meshrl_trainer_weight_publish_seconds", "duration of the last publish", registry=r)
        self.idle = Gauge("meshrl_trainer_idle_ratio", "fraction of wall time spent waiting for data", registry=r)
        self.gauges = {k: Gauge(name, doc, registry=r) for k, (name, doc) in _GAUGES.items()}


class TrainerService:
    """Drives one rank. ``source`` (rank 0 only) is a ``QueueIntake`` or ``SyntheticIntake``;
    ``publisher`` (rank 0 only) has ``publish(version, named_tensors)`` or is ``None``."""

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
        gate: canary.CanaryGate | None = None,
    ) -> None:
        self.spec, self.ctx, self.worker = spec, ctx, worker
        self.gate = gate  # rank 0, canary mode
        self.source, self.publisher, self.metrics = source, publisher, metrics
        self.ckpt = CheckpointManager(spec.trainer.default_local_dir, ctx, spec.trainer.max_ckpt_to_keep)
        self.step_no = 0
        self._saved_step = 0
        self.stop_requested = False
        self.ready = False
        self.on_ready = on_ready  # called once, when ready (rank 0 announces readiness)
        self.last_result: StepResult | None = None
        self._consecutive_nonfinite = 0
        self._offered_again = -1  # the version under which rejected weights were offered again (see _offer)
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
            "canary": None if self.gate is None else self.gate.state(),
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
            if control["cmd"] in ("publish", "wait"):  # canary mode: no step (rank 0 alone sees "wait")
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
            failed: list[BaseException] = []  # rank 0: the gate's decision, made within the step

            early = {"offered": False, "seconds": 0.0}  # the step's starting weights, offered within it (canary)

            def on_verdict(verdict: dict, removed: Any) -> None:
                if (exc := self._decide(pending, verdict, removed)) is not None:
                    failed.append(exc)

            def after_verdict(verdict: dict) -> None:  # every rank: the same control, the same verdict
                if control.get("offer_on_promotion") and verdict["promoted"]:
                    t = time.perf_counter()
                    self._publish()
                    early.update(offered=True, seconds=time.perf_counter() - t)

            result = self.worker.step(batch, on_verdict=None if self.gate is None else on_verdict,
                                      after_verdict=after_verdict)
            t1 = time.perf_counter()
            if failed:
                raise failed[0]  # now that the step's collectives are done
            if self.gate is not None and result.canary is None:
                self.gate.observe_step(result.metrics)  # the baseline of a judging batch without promoted rows
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
        elif self.gate is not None and self.gate.failed:
            logger.error("%s; stopping (weights.rollout.on_reject=fail)", self.gate.failed)
            control = {"cmd": "stop", "checkpoint": True, "code": REJECT_EXIT_CODE}
        elif (offer := self._offer()) is not None:
            control = offer
        else:
            t0 = time.perf_counter()
            last_beat = [time.monotonic()]
            beat_every = min(10.0, spec.trainer.collective_timeout_s / 4)

            def heartbeat() -> None:
                self._sync_counters()  # drops count as finished at once (admission control)
                if time.monotonic() - last_beat[0] >= beat_every:
                    broadcast_message({"cmd": "wait"}, None, group=self.ctx.cpu_group)
                    last_beat[0] = time.monotonic()

            if self.gate is not None and self.gate.paused:
                self._wait_resumed(heartbeat)
                # resumed: offer the current weights (made after the rejected candidate) as the next
                # candidate first -- the promoted replicas' samples may all be too stale to step on
                resumed_offer = None if self.stop_requested else self._offer()
            else:
                resumed_offer = None
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
                    if pending is not None and pending.data is None:  # the gate decided at the intake
                        pending, control = None, self._offer() or {"cmd": "wait"}
                    if pending is not None and getattr(self.source, "needs_checkpoint", lambda: False)():
                        control["save"] = True
                    if pending is not None and self.gate is not None:
                        # the step's version goes to nobody while a candidate is under test: skip gathering it
                        judging = canary.META_KEY in pending.data.meta_info
                        control["publish"] = self.gate.rollout.wants_next() or judging
                        if judging and canary.offer_on_promotion(self.gate.rollout, self.worker.version,
                                                                 self.gate.publisher.latest_version):
                            control["offer_on_promotion"] = True
            wait = time.perf_counter() - t0
            self._t_wait += wait
            if self.metrics is not None:
                self.metrics.phase.labels("wait").inc(wait)
                self.metrics.last.labels("wait").set(wait)
        batch = pending.data if pending is not None else None
        broadcast_message(control, batch, group=self.ctx.cpu_group)
        return control, batch, pending

    def _offer(self) -> dict[str, Any] | None:
        """Rank 0, canary mode: the command that offers the trainer's current weights as the
        next candidate (:func:`canary.next_offer`), or None when there is nothing to offer."""
        if self.gate is None:
            return None
        version, rollout = self.worker.version, self.gate.rollout
        what = canary.next_offer(rollout, version, self.gate.publisher.latest_version, self._offered_again,
                                 self.spec.async_.max_staleness)
        if what == "new":
            return {"cmd": "publish"}
        if what == "renumber":
            logger.info("canary: v%d was held back (its number is taken); offering its weights as v%d",
                        version, version + 1)
            return {"cmd": "publish", "again": True}
        if what == "again":
            logger.warning("canary: v%d was rejected and v%d, %d versions behind, is promoted: no sample can be "
                           "trained; offering the same weights again as v%d", version, rollout.promoted,
                           version - rollout.promoted, version + 1)
            self._offered_again = version + 1
            return {"cmd": "publish", "again": True}
        if what == "fail":
            self.gate.failed = (f"v{version}, the weights of the rejected v{version - 1} offered again, was rejected "
                                f"too, and every promoted sample is too stale to train (promoted v{rollout.promoted}, "
                                f"async.max_staleness {self.spec.async_.max_staleness})")
            return {"cmd": "stop", "checkpoint": True, "code": REJECT_EXIT_CODE}
        return None

    def _wait_resumed(self, heartbeat: Callable[[], None]) -> None:
        """Rank 0, canary mode: the rollout is paused after a rejection; train nothing until
        it is resumed (``meshrl canary RUN_DIR --resume``) or the trainer is stopped."""
        logger.warning("canary: %s; training paused until resumed (meshrl canary <run_dir> --resume)",
                       self.gate.paused)
        while self.gate.paused and not self.stop_requested:
            heartbeat()
            time.sleep(0.5)
        if not self.stop_requested:
            logger.warning("canary: resumed; the next version is the next candidate")

    def _decide(self, pending: Any, verdict: dict, removed: Any) -> BaseException | None:
        """Rank 0, inside the step that judged a candidate, between the old log-probs and the
        updates: account for the rows the verdict leaves out, then tell the publisher (a
        promoted version goes out while the step updates). An error is returned, to be raised
        once the step's collectives are done (raising here would leave the other ranks
        waiting in them)."""
        try:
            if removed is not None and bool(removed.any()):
                pending.remove(removed, rejected=not verdict["promoted"])
            self.gate.decide(verdict)
        except Exception as exc:
            return exc
        return None

    def _publish(self, initial: bool = False) -> None:
        """Gather full parameters (all ranks); rank 0 streams them to the publisher."""
        if self.spec.weights is None:
            return
        if not initial and self.spec.weights.rollout.mode == "canary":
            self.worker.keep_offered()  # every publish after the first offers a candidate: judged with these
        it = self.worker.full_params()
        if self.ctx.rank != 0:
            for _ in it:
                pass
            return
        counted = {"bytes": 0}

        def counting():
            for name, t in it:
                counted["bytes"] += t.numel() * t.element_size()
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
        if self.gate is not None:
            mt.held.set(self.gate.state()["held_samples"])
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
            "trained nothing (every row was a rejected candidate's)" if result.canary is not None and result.samples == 0
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
            if result.canary is not None:  # the canary gate's verdict on a candidate, with its measurements
                line["canary"] = result.canary
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
