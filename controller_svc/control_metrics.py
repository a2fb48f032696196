"""Prometheus metrics of a job's controller (``meshrl run``, which hosts the embedded
broker; its ``/metrics`` URL is in ``status.json`` as ``metrics_url``): the queue depths and
the embedded broker's sample ledger. The feeder's own counters (``meshrl_feeder_*``) are on
the feeder's ``/metrics`` (``feeder_svc.metrics``).

    meshrl_queue_depth_items{stream}            gauge    unacknowledged items per stream
    meshrl_queue_<what>_total{stream,group}     counter  delivery counters of the controller's queues
    meshrl_ledger_samples{stage}                gauge    samples whose latest ledger stage is `stage`
                                                         (embedded broker only; the ledger keeps the
                                                         newest `queues.ledger_max` samples)
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Gauge

from services.queues.stats import QueueMetrics

#: Ledger stages always exported (0 until reached), so panels and alerts have a series to read.
LEDGER_STAGES = ("queued", "generating", "generated", "scored", "trained", "dropped")


class ControlMetrics:
    """The metrics above in one registry (``self.registry``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.queues = QueueMetrics(r)  # pass to make_queue: depth() sets meshrl_queue_depth_items{stream}
        self.ledger = Gauge(
            "meshrl_ledger_samples", "Samples whose latest ledger stage is `stage` (embedded broker)", ["stage"],
            registry=r,
        )  # fmt: skip
        self._ledger_counts: dict[str, int] = {}
        for stage in LEDGER_STAGES:
            self.ledger.labels(stage=stage).set(0)

    def set_ledger(self, stages: Iterable[str]) -> None:
        """Count the ledger's stages (call from the thread that owns the ledger)."""
        self.set_ledger_counts(Tally(s or "unknown" for s in stages))

    def set_ledger_counts(self, counts: Mapping[str, int]) -> None:
        """The ledger's samples per stage, as counted by the broker."""
        self._ledger_counts = {s: counts.get(s, 0) for s in set(LEDGER_STAGES) | set(counts)}
        for stage in set(LEDGER_STAGES) | set(counts):
            self.ledger.labels(stage=stage).set(counts.get(stage, 0))

    def ledger_counts(self) -> dict[str, int]:
        """The last :meth:`set_ledger` counts by stage (for ``status.json``)."""
        return dict(self._ledger_counts)


__all__ = ["ControlMetrics", "LEDGER_STAGES"]
