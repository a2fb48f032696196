"""The promotion policy: how a new policy version reaches the rollout replicas.

The trainer's loop (:mod:`trainer_svc.train_loop`), its intake (:mod:`trainer_svc.intake`)
and its step (:meth:`trainer_svc.worker.TrainerWorker.step`) call the hooks of one
:class:`PromotionPolicy`, always the same ones, whatever the policy:

=====================  ==============  ===================================================
hook                   where           what it says
=====================  ==============  ===================================================
``next_command``       rank 0, loop    a command to run instead of leasing a batch (offer
                                       weights, stop), or None
``offer``              rank 0, loop    the command that offers the current weights, or None
``wait_resumed``       rank 0, loop    hold training while the rollout is paused; then the
                                       command to run first, or None
``rejected``           rank 0, intake  bool per sample: its version may never be trained
``screen``             rank 0, intake  keep an item out of the batch for now (True)
``released``           rank 0, intake  items kept out earlier that may be screened again
``judging_due``        rank 0, intake  the batch being assembled should judge a candidate
``start_judging``      rank 0, intake  the items that judge it and the batch's judging spec
                                       (or the items to drop: rejected at the intake)
``can_fill``           rank 0, intake  a judging batch may wait to be filled
``step_control``       rank 0, loop    extra step control (publish the step's version?
                                       offer its starting weights on a promotion?)
``judge``              every rank,     the verdict on the candidate a batch carries, and
                       step            the rows to leave out
``decide``             rank 0, step    act on the verdict (promote / reject), before the
                                       step's updates
``after_step``         every rank      after the step (a baseline for the next judging)
``on_publish``         every rank      the current weights are being published
``held_samples``       rank 0          samples kept out of training, for the metrics
``status`` / ``report``  rank 0        the trainer's /status and the step's metrics line
=====================  ==============  ===================================================

:class:`~trainer_svc.promotion.all_at_once.AllAtOnce` (``weights.rollout.mode: all``): every
hook is a no-op. :class:`~trainer_svc.promotion.canary.Canary` (``mode: canary``): the gate
of docs/weights.md, "Promotion". :func:`trainer_svc.promotion.make_policy` builds the one of
a trainer's view.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from services.protocol import DataProto
from trainer_svc.promotion.judging import JUDGE_KEY, judge_marked
from trainer_svc.staleness import Staleness


class PromotionPolicy:
    """The hooks (module docstring), each with the behaviour of a policy that gates
    nothing: every version goes everywhere, every sample is screened on staleness alone."""

    name = "base"

    def __init__(self, staleness: Staleness | int) -> None:
        self.staleness = Staleness.of(staleness)
        """The trainer's staleness bound: the one the intake, the judging and the policy use."""

    # ------------------------------------------------------------------ what next (rank 0)
    def next_command(self, version: int) -> dict[str, Any] | None:
        """Before a batch is leased, the trainer at ``version``: a command to run instead
        (``{"cmd": "publish"}`` offers the current weights, ``"again": True`` under the next
        version number; ``{"cmd": "stop", ...}``), or None to lease a batch."""
        return None

    def offer(self, version: int) -> dict[str, Any] | None:
        """The command that offers the trainer's current weights, when there is one to
        offer now (after a decision made at the intake), else None."""
        return None

    def wait_resumed(self, version: int, heartbeat: Callable[[], None],
                     should_stop: Callable[[], bool]) -> dict[str, Any] | None:
        """While training is paused, call ``heartbeat`` until it is resumed or
        ``should_stop()``; then the command to run before the next batch, or None."""
        return None

    # ------------------------------------------------------------------ intake (rank 0)
    def rejected(self, versions: torch.Tensor) -> torch.Tensor:
        """Bool per sample: its version may never be trained."""
        return torch.zeros_like(versions, dtype=torch.bool)

    def screen(self, item: Any, data: DataProto, version: int) -> bool:
        """Keep ``item`` (a leased experience group, ``data`` its rows) out of the batch for
        now, the trainer at ``version``: True when kept (it comes back by :meth:`released`
        or in a judging batch)."""
        return False

    def released(self) -> list[Any]:
        """Items kept out earlier that are to be screened again now."""
        return []

    def judging_due(self) -> bool:
        """The batch being assembled should judge a candidate (:meth:`start_judging`)."""
        return False

    def start_judging(self, room: int) -> tuple[list[Any], dict[str, Any] | None, list[Any]]:
        """``(items, spec, dropped)``: up to ``room`` items for the judging batch and its
        judging spec (``meta_info[JUDGE_KEY]``); or, the candidate rejected at the intake,
        ``([], None, items to drop as rejected)``."""
        return [], None, []

    def can_fill(self, batch_groups: int) -> bool:
        """A judging batch may wait until it holds ``batch_groups`` groups (else it closes
        with the groups at hand)."""
        return True

    # ------------------------------------------------------------------ the step
    def step_control(self, batch: DataProto, version: int) -> dict[str, Any]:
        """Rank 0: keys added to the step's control: ``publish`` (False: the step's version
        goes nowhere, do not gather it), ``offer_on_promotion`` (offer the step's starting
        weights as soon as its verdict promotes)."""
        return {}

    def judges(self, batch: DataProto) -> bool:
        """``batch`` carries a candidate to judge (its old log-probs are all recomputed)."""
        return bool(batch.meta_info.get(JUDGE_KEY))

    def judge(self, batch: DataProto, worker: Any) -> tuple[dict[str, Any], torch.Tensor] | None:
        """Every rank, inside the step once the old log-probs are in: the verdict on the
        candidate ``batch`` carries and the rows to leave out of the update, or None. From
        the batch alone (:func:`~trainer_svc.promotion.judging.judge_marked`), so every rank
        agrees; a policy that marks no batch judges nothing."""
        return judge_marked(batch, worker, self.staleness)

    def decide(self, verdict: dict[str, Any]) -> None:
        """Rank 0, inside the step, before its updates: act on ``verdict``."""

    def after_step(self, result: Any) -> None:
        """After the step (``result``: its :class:`~trainer_svc.worker.StepResult`)."""

    def on_publish(self, worker: Any, initial: bool) -> None:
        """Every rank, before the current weights are gathered for the publisher
        (``initial``: the trainer's starting weights)."""

    # ------------------------------------------------------------------ reporting (rank 0)
    def held_samples(self) -> int:
        """Samples kept out of training until a decision."""
        return 0

    def status(self) -> dict[str, Any]:
        """Keys of the trainer's ``/status``."""
        return {}

    def report(self, result: Any) -> dict[str, Any]:
        """Keys of the step's line in ``trainer.metrics_file``."""
        return {}
