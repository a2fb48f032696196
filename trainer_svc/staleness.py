"""Staleness: whether a sample of policy version ``v`` may still be trained at trainer version ``t``.

One :class:`Staleness` is built per trainer process from its view (``async.max_staleness``,
which in canary mode the job's views have already sized: docs/weights.md, "How the canary
sizes itself") and handed to everything that asks: the intake's screen, the promotion
policy (which judges and parks against the promoted version) and the judging step. The
rule is written here only:

* a sample of version ``v`` is trainable at ``t`` when ``0 <= t - v <= max_versions``;
  a sample from a version *above* the trainer's is never trainable (it was made by a run
  that died after its last checkpoint: this trainer's versions of those numbers are other
  weights);
* a version ``p`` (the promoted one, in canary mode) is *at the limit* at ``t`` when one
  more step would make its samples untrainable: ``t + 1 - p > max_versions``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Staleness:
    """The staleness bound of one trainer: ``max_versions`` versions a sample may lag."""

    max_versions: int

    def __post_init__(self) -> None:
        if self.max_versions < 0:
            raise ValueError(f"max_versions must be >= 0, got {self.max_versions}")

    @classmethod
    def of(cls, bound: "int | Staleness") -> "Staleness":
        """``bound`` itself when it is a :class:`Staleness`, else one of ``bound`` versions."""
        return bound if isinstance(bound, Staleness) else cls(int(bound))

    def trainable(self, version: int, at: int) -> bool:
        """A sample of ``version`` may be trained at trainer version ``at``."""
        return 0 <= at - version <= self.max_versions

    def stale(self, versions: torch.Tensor, at: int) -> torch.Tensor:
        """Bool per sample of ``versions``: not trainable at ``at`` (too old, or from the future)."""
        lag = at - versions
        return (lag > self.max_versions) | (lag < 0)

    def at_limit(self, version: int, at: int) -> bool:
        """One more step from ``at`` makes a sample of ``version`` untrainable (it still is now, or
        already is not)."""
        return not self.trainable(version, at + 1)
