"""``weights.rollout.mode: all``: every published version goes to every replica at once.

Nothing is held, parked, judged or decided: each hook keeps the behaviour of
:class:`~trainer_svc.promotion.base.PromotionPolicy`, so the loop trains on whatever is
fresh enough (:class:`~trainer_svc.staleness.Staleness`) and publishes every version it makes.
"""

from __future__ import annotations

from typing import Any

from trainer_svc.promotion.base import PromotionPolicy


class AllAtOnce(PromotionPolicy):
    """Every version is promoted as it is published (by the publisher, at once)."""

    name = "all"

    def status(self) -> dict[str, Any]:
        return {"canary": None}  # the trainer's /status has always named the gate, null without one
