"""``weights.rollout.mode: canary``: a new version is tried on a few replicas and judged from
their samples before the others load it (docs/weights.md, "Promotion").

The publisher (rank 0) sends each candidate version to the canary replicas only. The
:class:`Canary` policy judges it from the canaries' samples of it, through the hooks of
:class:`~trainer_svc.promotion.base.PromotionPolicy`:

1. **Intake** (rank 0, ``screen`` / ``judging_due`` / ``start_judging``): a sample of the
   candidate version is *held*: neither trained nor acked. The error rate and the mean
   score of the candidate's samples are tallied against those of the promoted versions'
   recent samples. Once ``promote_after_samples`` of them were seen, the error and reward
   bounds are checked; failing one rejects the candidate at once, else the held groups go
   into the next batch, marked for judging (``meta_info[META_KEY]``). Promoted groups are
   *parked* for that batch when one more step would make them too stale (:meth:`park`).
2. **Step** (every rank, ``judge``: :func:`~trainer_svc.promotion.judging.judge`): the mean
   log-prob gap ``|log p_trainer - log p_rollout|`` of the candidate's sampled tokens,
   recomputed with the candidate's own weights (each rank keeps its shards of every version
   it offers: ``on_publish``), is compared with the gap the promoted version had when it
   was judged so; where those weights are not kept, with the step's current weights,
   against the promoted versions' rows of the same batch (without such rows, the last
   step's gap). A rejected candidate's rows leave the batch before the advantages and the
   update.
3. **Within the step**, once the verdict is in and before the updates (rank 0, ``decide``):
   the publisher promotes or rejects; a rejection is logged with its measurements and the
   job follows ``on_reject`` (``next_command`` stops the trainer, or ``wait_resumed`` holds
   it until the rollout is resumed).
4. **What next** (rank 0, ``next_command`` / ``offer`` / ``step_control``): which weights
   are offered as the next candidate (:func:`next_offer`), whether a step's version is
   gathered at all (not while a candidate is under test), and whether the judging step
   offers its starting weights as soon as its verdict promotes (:func:`offer_on_promotion`).

Samples of a rejected version are dropped wherever they turn up, counted as dropped for
their version (``dropped_stale``) and, apart, as ``dropped_rejected``.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from services.config.weights import REJECT_EXIT_CODE, RolloutGateConfig
from services.protocol import DataProto
from trainer_svc.intake import is_reward_failure, validate_experience
from trainer_svc.promotion.base import PromotionPolicy
from trainer_svc.promotion.judging import GAP_METRIC, JUDGE_KEY, judge
from trainer_svc.staleness import Staleness

logger = logging.getLogger("meshrl.trainer.canary")

META_KEY = JUDGE_KEY
"""``meta_info`` key of a batch that carries a candidate's samples to judge."""

__all__ = ["Canary", "CanaryIntake", "META_KEY", "GAP_METRIC", "judge", "next_offer", "offer_on_promotion", "park_limit", "Tally"]


def _mean(total: float, count: int) -> float:
    return total / count if count else float("nan")


@dataclass
class Tally:
    """Error and score sums over samples (the candidate's, or the promoted versions')."""

    samples: int = 0
    errors: int = 0
    score_sum: float = 0.0
    scored: int = 0

    def add(self, errors: torch.Tensor, scores: torch.Tensor) -> None:
        """``errors``: bool per sample (a rollout error); ``scores``: sequence score per sample."""
        self.samples += int(errors.numel())
        self.errors += int(errors.sum())
        ok = ~errors
        self.score_sum += float(scores[ok].sum())
        self.scored += int(ok.sum())

    @property
    def error_rate(self) -> float:
        return _mean(self.errors, self.samples)

    @property
    def reward(self) -> float:
        return _mean(self.score_sum, self.scored)


class _Window:
    """The promoted versions' most recent samples (a bounded window of per-item tallies)."""

    def __init__(self, max_samples: int) -> None:
        self.max_samples = max_samples
        self._parts: deque[Tally] = deque()

    def add(self, t: Tally) -> None:
        self._parts.append(t)
        while len(self._parts) > 1 and sum(p.samples for p in self._parts) - self._parts[0].samples >= self.max_samples:
            self._parts.popleft()

    def total(self) -> Tally:
        out = Tally()
        for p in self._parts:
            out.samples += p.samples
            out.errors += p.errors
            out.score_sum += p.score_sum
            out.scored += p.scored
        return out


def sample_errors_and_scores(data: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample: a rollout error (no usable response), and the sequence score."""
    n = len(data)
    errs = data.non_tensor_batch.get("error") if data.non_tensor_batch is not None else None
    failed = torch.tensor([bool(e) and not is_reward_failure(e) for e in errs], dtype=torch.bool) \
        if errs is not None else torch.zeros(n, dtype=torch.bool)
    scores = data.batch["token_level_scores"].float().reshape(n, -1).sum(-1)
    return failed, scores


@dataclass
class Candidate:
    """What the intake holds of the candidate version under test."""

    version: int
    tally: Tally = field(default_factory=Tally)
    held: dict[str, Any] = field(default_factory=dict)  # entry id -> the newest lease of the item
    parked: set[str] = field(default_factory=set)  # of held: promoted versions' items kept for the judging batch
    judging: bool = False  # its groups went into a batch; the step decides


class CanaryIntake(PromotionPolicy):
    """The canary gate's state and its intake side (module docstring, 1-3): the candidate's
    held samples and their tallies, parked groups, the judging batch, and the decision.
    :class:`Canary` adds what the loop asks (4). ``publisher``: rank 0's
    :class:`~trainer_svc.weights.publisher.WeightPublisher` (its ``rollout`` state, ``promote``,
    ``reject``, ``latest_version``); None on the other ranks, which only judge and keep the
    offered weights. ``max_staleness``: the trainer's :class:`Staleness` (or its bound);
    ``park_limit``: :func:`park_limit`; ``window``: the feeder's admission bound in prompts
    (``async.max_in_flight``; 0: unknown)."""

    name = "canary"

    def __init__(self, cfg: RolloutGateConfig, publisher: Any, batch_samples: int, max_staleness: int | Staleness = 1,
                 park_limit: int = 0, window: int = 0) -> None:
        super().__init__(max_staleness)
        self.cfg = cfg
        self.park_limit = park_limit
        """Promoted versions' groups kept at most for a judging batch (see :meth:`park`)."""
        self.window = window
        """The feeder's admission bound in prompts (``async.max_in_flight``; 0: unknown)."""
        self.publisher = publisher
        self.rollout = None if publisher is None else publisher.rollout
        self.needed = cfg.samples_to_decide(batch_samples)
        """Samples of a candidate to see before judging it (``promote_after_samples``)."""
        self.baseline = _Window(max(4 * self.needed, 64))
        self.candidate: Candidate | None = None
        self._released: list[Any] = []  # held items whose version was decided: screen them again
        self.last_gap: float | None = None  # the promoted rows' log-prob gap of the last step
        self.reference_gap: float | None = None
        """The promoted version's log-prob gap when it was judged at lag 0 (None: not known):
        what the next candidate judged at lag 0 is compared with (:func:`judge`)."""
        self.failed = ""  # on_reject=fail: why (the trainer stops)
        self._offered_again = -1  # the version under which rejected weights were offered again (see offer)

    @property
    def max_staleness(self) -> int:
        return self.staleness.max_versions

    # ------------------------------------------------------------------ intake (rank 0)
    def candidate_version(self) -> int | None:
        """The version under test (samples of it are held), None when there is none."""
        v = self.rollout.candidate
        if self.candidate is None or self.candidate.version != v:
            if self.candidate is not None:  # decided elsewhere (never in practice): screen its items again
                self._released.extend(self.candidate.held.values())
            self.candidate = None if v is None else Candidate(v)
        return v

    def rejected(self, versions: torch.Tensor) -> torch.Tensor:
        """Bool per sample: its version was rejected."""
        bad = list(self.rollout.rejected)
        return torch.isin(versions, torch.tensor(bad, dtype=versions.dtype)) if bad else torch.zeros_like(versions,
                                                                                                         dtype=torch.bool)

    def screen(self, item: Any, data: DataProto, version: int) -> bool:
        """Hold ``item`` when it has samples of the candidate under test (True); else note its
        samples of promoted versions in the baseline, and park it for the judging batch when
        the trainer (at ``version``) is to wait for the verdict (:meth:`park`)."""
        candidate = self.candidate_version()
        if self.is_held(item.id):  # our own held lease, idle past lease_idle_s, handed back
            self.hold(item)
            return True
        try:
            validate_experience(data)
        except ValueError:
            return False  # the intake's screen drops it, naming the column
        versions = data.batch["policy_version"].long().reshape(len(data))
        errors, scores = sample_errors_and_scores(data)
        if candidate is not None and bool((versions == candidate).any()):
            mine = versions == candidate
            self.hold(item, errors[mine], scores[mine])
            return True
        ok = ~self.rejected(versions)
        self.observe_promoted(errors[ok], scores[ok])
        return candidate is not None and not bool((~ok).any()) and self.park(item, version)

    def hold(self, item: Any, errors: torch.Tensor | None = None, scores: torch.Tensor | None = None) -> None:
        """Keep ``item`` until the candidate is decided, tallying its candidate samples'
        ``errors`` and ``scores`` (none for a redelivery of a held item: its new lease
        replaces the old)."""
        c = self.candidate
        assert c is not None
        if errors is not None and scores is not None and item.id not in c.held:
            c.tally.add(errors, scores)
        c.held[item.id] = item

    def park(self, item: Any, current_version: int) -> bool:
        """Keep ``item`` (samples of promoted or older versions) for the batch that judges the
        candidate, when another step before the verdict would make the promoted replicas'
        samples too stale to train (:meth:`Staleness.at_limit`). Then the trainer waits for
        the canary instead of racing ahead and dropping what every other replica makes. At
        most ``park_limit`` groups (:func:`park_limit`), so the trainer can always fill a
        batch or finish the judging one: past it the trainer steps on (True: parked)."""
        c = self.candidate
        if (c is None or not self.staleness.at_limit(self.rollout.promoted, current_version)
                or len(c.parked) >= self.park_limit):
            return False
        c.held[item.id] = item
        c.parked.add(item.id)
        return True

    def observe_promoted(self, errors: torch.Tensor, scores: torch.Tensor) -> None:
        """Samples of promoted (or older) versions, as the intake sees them: the baseline."""
        t = Tally()
        t.add(errors, scores)
        self.baseline.add(t)

    def can_fill(self, batch_groups: int) -> bool:
        """Whether a judging batch may wait for a whole batch: the groups still held (not in
        it) leave the admission window room for ``batch_groups`` unfinished prompts, so the
        rest of the batch can still be admitted, made and delivered. Else it closes with the
        groups at hand (waiting could wait for ever)."""
        held = len(self.candidate.held) if self.candidate is not None else 0
        return self.window - held >= batch_groups

    def is_held(self, entry_id: str) -> bool:
        return self.candidate is not None and entry_id in self.candidate.held

    def ready(self) -> bool:
        """Enough of the candidate's samples were seen to judge it (and it is not being judged)."""
        c = self.candidate
        return c is not None and not c.judging and c.tally.samples >= self.needed

    def judging_due(self) -> bool:
        return self.ready()

    def intake_verdict(self) -> tuple[list[str], dict[str, float]]:
        """The bounds the intake can check (error rate, reward): failed ones, and the figures."""
        c, base = self.candidate, self.baseline.total()
        assert c is not None
        m = {"samples": float(c.tally.samples), "error_rate": c.tally.error_rate,
             "promoted_error_rate": base.error_rate if base.samples else 0.0,
             "reward": c.tally.reward, "promoted_reward": base.reward}
        reasons = []
        if m["error_rate"] - m["promoted_error_rate"] > self.cfg.max_error_rate_increase:
            reasons.append(f"error rate {m['error_rate']:.3f} vs promoted {m['promoted_error_rate']:.3f} "
                           f"(+{m['error_rate'] - m['promoted_error_rate']:.3f} > {self.cfg.max_error_rate_increase})")
        drop = m["promoted_reward"] - m["reward"]
        if self.cfg.max_reward_drop is not None and math.isfinite(drop) and drop > self.cfg.max_reward_drop:
            reasons.append(f"reward {m['reward']:.3f} vs promoted {m['promoted_reward']:.3f} "
                           f"(-{drop:.3f} > {self.cfg.max_reward_drop})")
        return reasons, {k: v for k, v in m.items() if math.isfinite(v)}

    def start_judging(self, room: int) -> tuple[list[Any], dict[str, Any] | None, list[Any]]:
        """Enough samples of the candidate were seen: reject it at once when its error rate
        or reward is out of bounds (its held items are returned, to be dropped), else take
        its held groups for the judging batch, whose step judges the log-prob gap."""
        reasons, measurements = self.intake_verdict()
        if reasons:
            return [], None, self.reject_at_intake(reasons, measurements)
        items, spec = self.take_for_judging(room)
        return items, spec, []

    def take_for_judging(self, limit: int) -> tuple[list[Any], dict[str, Any]]:
        """Up to ``limit`` held items for the batch that judges the candidate, and the batch's
        ``meta_info[META_KEY]``; the rest stay held until the verdict."""
        c = self.candidate
        assert c is not None
        c.judging = True
        _, measurements = self.intake_verdict()
        # the candidate's own groups first (they are what the batch judges), then parked ones
        ordered = sorted(c.held.values(), key=lambda it: it.id in c.parked)
        items = ordered[:limit]
        for it in items:
            del c.held[it.id]
            c.parked.discard(it.id)
        return items, {"version": c.version, "max_logprob_gap_increase": self.cfg.max_logprob_gap_increase,
                       "promoted_logprob_gap": self.last_gap, "reference_gap": self.reference_gap,
                       "measurements": measurements}

    def reject_at_intake(self, reasons: list[str], measurements: dict[str, float]) -> list[Any]:
        """The candidate failed a bound the intake checks: reject it; returns its held items
        (to be dropped; parked items of promoted versions are released instead)."""
        c = self.candidate
        assert c is not None
        items = [it for i, it in c.held.items() if i not in c.parked]
        self._released.extend(it for i, it in c.held.items() if i in c.parked)
        c.held.clear()  # dropped by the caller, or released
        self.decide({"version": c.version, "promoted": False, "reason": "; ".join(reasons),
                     "measurements": measurements})
        return items

    def take_released(self) -> list[Any]:
        out, self._released = self._released, []
        return out

    def released(self) -> list[Any]:
        return self.take_released()

    # ------------------------------------------------------------------ the decision
    def decide(self, verdict: dict[str, Any]) -> None:
        """Tell the publisher (``verdict`` from :func:`judge` or the intake); a rejection's
        action follows ``on_reject`` (``self.failed`` / the publisher's pause)."""
        version, m = int(verdict["version"]), verdict.get("measurements", {})
        if "promoted_logprob_gap" in m:
            self.last_gap = m["promoted_logprob_gap"]
        if verdict["promoted"]:
            self.publisher.promote(version, m)
            # judged at lag 0 it becomes the reference; otherwise the promoted version's is unknown
            self.reference_gap = m.get("logprob_gap") if m.get("judged_lag") == 0 else None
        else:
            self.publisher.reject(version, verdict["reason"], m, pause=self.cfg.on_reject == "pause")
            logger.error("canary: v%d rejected: %s; measurements %s; weights.rollout.on_reject=%s", version,
                         verdict["reason"], m, self.cfg.on_reject)
            if self.cfg.on_reject == "fail":
                self.failed = f"v{version} rejected at the canary: {verdict['reason']}"
        if self.candidate is not None and self.candidate.version == version:
            self._released.extend(self.candidate.held.values())
            self.candidate = None

    def observe_step(self, metrics: dict[str, float]) -> None:
        """A step without a candidate's rows (every row of promoted or older versions): its
        log-prob gap is the baseline of a judging batch that has no promoted rows."""
        gap = metrics.get(GAP_METRIC)
        if gap is not None and math.isfinite(gap):
            self.last_gap = gap

    # ------------------------------------------------------------------ reporting (rank 0)
    @property
    def paused(self) -> str:
        """Why the rollout is paused after a rejection ("" when it is not)."""
        return self.rollout.paused

    def held_samples(self) -> int:
        c = self.candidate
        return c.tally.samples if c else 0

    def state(self) -> dict[str, Any]:
        """For the trainer's ``/status``."""
        return {**self.rollout.as_dict(), "held_samples": self.held_samples(), "failed": self.failed}

class Canary(CanaryIntake):
    """The canary gate as the trainer's promotion policy: :class:`CanaryIntake` and the
    hooks the loop calls around it (what to offer, what a step publishes, what it reports)."""

    name = "canary"

    # ------------------------------------------------------------------ what next (rank 0)
    def next_command(self, version: int) -> dict[str, Any] | None:
        if self.failed:
            logger.error("%s; stopping (weights.rollout.on_reject=fail)", self.failed)
            return {"cmd": "stop", "checkpoint": True, "code": REJECT_EXIT_CODE}
        return self.offer(version)

    def offer(self, version: int) -> dict[str, Any] | None:
        """The command that offers the trainer's current weights (at ``version``) as the next
        candidate (:func:`next_offer`), or None when there is nothing to offer."""
        if self.rollout is None:
            return None
        rollout = self.rollout
        what = next_offer(rollout, version, self.publisher.latest_version, self._offered_again, self.staleness)
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
            self.failed = (f"v{version}, the weights of the rejected v{version - 1} offered again, was rejected "
                           f"too, and every promoted sample is too stale to train (promoted v{rollout.promoted}, "
                           f"async.max_staleness {self.max_staleness})")
            return {"cmd": "stop", "checkpoint": True, "code": REJECT_EXIT_CODE}
        return None

    def wait_resumed(self, version: int, heartbeat: Callable[[], None],
                     should_stop: Callable[[], bool]) -> dict[str, Any] | None:
        """The rollout is paused after a rejection: train nothing until it is resumed
        (``meshrl canary RUN_DIR --resume``) or the trainer is stopped; then offer the current
        weights (made after the rejected candidate) as the next candidate first -- the
        promoted replicas' samples may all be too stale to step on."""
        if self.rollout is None or not self.paused:
            return None
        logger.warning("canary: %s; training paused until resumed (meshrl canary <run_dir> --resume)", self.paused)
        while self.paused and not should_stop():
            heartbeat()
            time.sleep(0.5)
        if should_stop():
            return None
        logger.warning("canary: resumed; the next version is the next candidate")
        return self.offer(version)

    # ------------------------------------------------------------------ the step
    def step_control(self, batch: DataProto, version: int) -> dict[str, Any]:
        """The step's version goes to nobody while a candidate is under test: skip gathering
        it; a judging step offers its starting weights as soon as its verdict promotes."""
        if self.rollout is None:
            return {}
        judging = self.judges(batch)
        out = {"publish": self.rollout.wants_next() or judging}
        if judging and offer_on_promotion(self.rollout, version, self.publisher.latest_version):
            out["offer_on_promotion"] = True
        return out

    def after_step(self, result: Any) -> None:
        if result.verdict is None:
            self.observe_step(result.metrics)

    def on_publish(self, worker: Any, initial: bool) -> None:
        """Every publish after the first offers a candidate: every rank keeps its shards of
        those weights, to judge the candidate with them (``TrainerWorker.keep_offered``)."""
        if not initial:
            worker.keep_offered()

    # ------------------------------------------------------------------ reporting (rank 0)
    def status(self) -> dict[str, Any]:
        return {"canary": None if self.rollout is None else self.state()}

    def report(self, result: Any) -> dict[str, Any]:
        """The verdict on a candidate, with its measurements, in the step's metrics line."""
        return {} if result.verdict is None else {"canary": result.verdict}


def park_limit(window: int, batch_groups: int, needed_groups: int) -> int:
    """How many promoted groups the intake may park for a judging batch, ``window`` being
    the feeder's admission bound (``async.max_in_flight``, by default
    ``(async.max_staleness + 1) * data.train_batch_size`` prompts: held and parked groups
    are unfinished, so they count against it).

    Progress needs one of two things: the candidate reaches ``needed_groups`` held groups
    (the judging batch closes), or the trainer fills a batch of ``batch_groups`` from what
    it does not hold. Parking at most ``window - batch_groups - needed_groups`` keeps both
    possible: with the candidate short of its groups, a full batch still fits beside what
    is held. Half the window (the first rule) deadlocked at ``max_staleness: 1``: one
    batch parked, the candidate one group short, and the rest of the window a batch that
    could never fill -- every prompt admitted was sitting in the trainer.
    """
    return max(0, window - batch_groups - needed_groups)


def next_offer(rollout: Any, version: int, published: int, offered_again: int,
               max_staleness: int | Staleness) -> str | None:
    """What the trainer, at ``version``, offers the publisher's gate (``rollout``: its
    :class:`~trainer_svc.weights.rollout_state.RolloutState`; ``published``: the newest version
    number the publisher took, held back or not) when it could offer a candidate:

    * ``"new"``: its current weights never reached the gate (weights made while a candidate
      was under test are not gathered), so they are the next candidate;
    * ``"renumber"``: the same, but their version number was taken by a publish that was
      held back (the step that judged a candidate publishes its own version, and a pause
      after the verdict holds it back): the weights go out under the next number;
    * ``"again"``: its current weights *were* the candidate just rejected, and no sample of
      the promoted version is fresh enough to step on at ``version`` (``max_staleness``: the
      trainer's :class:`Staleness`; the trainer would lease and drop for ever). The same
      weights go out again under the next version number; the rejected number stays
      rejected. What the gate catches is a fault in delivering or serving the weights, so a
      second delivery can pass;
    * ``"fail"``: that second offer (``offered_again``) was rejected too: the trainer's own
      weights fail the gate and nothing can be trained;
    * None: nothing to offer (the gate takes no candidate now, or the trainer can step).
    """
    if not rollout.wants_next():
        return None
    seen = max([rollout.promoted, -1 if rollout.candidate is None else rollout.candidate, *rollout.rejected])
    if version > seen:
        return "new" if version > published else "renumber"
    if version in rollout.rejected and not Staleness.of(max_staleness).trainable(rollout.promoted, version):
        return "fail" if version == offered_again else "again"
    return None


def offer_on_promotion(rollout: Any, version: int, published: int) -> bool:
    """Whether the step that judges the candidate offers its starting weights (``version``,
    never gathered: made while the candidate was under test) as the next candidate as soon
    as the verdict promotes it, before the step's updates, rather than its own version at
    its end. The weights are the same either way until the optimizer steps; offered within
    the step, the next candidate reaches the canary a step sooner, and every step's
    version can be a candidate instead of every other one (the promoted replicas then trail
    the trainer by about one version less). ``published``: the newest version number the
    publisher took."""
    if rollout.candidate is None:
        return False
    seen = max([rollout.promoted, rollout.candidate, *rollout.rejected])
    return version > seen and version > published
