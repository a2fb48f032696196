"""How a new policy version reaches the replicas, as one policy the trainer's loop calls
(:class:`~trainer_svc.promotion.base.PromotionPolicy`): :class:`AllAtOnce` (``weights.rollout.mode:
all``) or :class:`Canary` (``mode: canary``). :func:`make_policy` builds a trainer's, once,
from its view."""

from __future__ import annotations

from typing import Any

from services.config.views import TrainerView
from trainer_svc.promotion.all_at_once import AllAtOnce
from trainer_svc.promotion.base import PromotionPolicy
from trainer_svc.staleness import Staleness

__all__ = ["AllAtOnce", "PromotionPolicy", "make_policy"]


def make_policy(spec: TrainerView, publisher: Any = None) -> PromotionPolicy:
    """The promotion policy of the trainer whose view is ``spec``, with the one
    :class:`Staleness` of this trainer (``async.max_staleness``: in canary mode the views
    sized it, docs/weights.md "How the canary sizes itself"). ``publisher``: rank 0's weight
    publisher; the other ranks pass None (they only judge, and keep offered weights). The
    canary gate decides on rank 0 only when it has the experience queue to hold samples in
    (with synthetic batches it judges nothing and offers nothing itself)."""
    staleness = Staleness(spec.async_.max_staleness)
    if spec.weights is None or not spec.weights.canary:
        return AllAtOnce(staleness)
    from trainer_svc.promotion.canary import Canary, park_limit

    batch = spec.data.train_batch_size
    window = spec.async_.max_in_flight_for(batch)
    return Canary(spec.weights.rollout, publisher if spec.queues is not None else None, batch * spec.rollout.n,
                  max_staleness=staleness, park_limit=park_limit(window, batch, spec.canary_groups), window=window)
