"""The feeder's Prometheus metrics (its own ``/metrics``; names shared with the dashboards):

    meshrl_feeder_prompts_total                 counter  prompts put on the prompts stream
    meshrl_feeder_in_flight_prompts             gauge    fed and not yet finished (admission bound)
    meshrl_feeder_max_in_flight_prompts         gauge    the admission bound itself
    meshrl_queue_depth_items{stream}            gauge    unacknowledged items per stream
    meshrl_queue_<what>_total{stream,group}     counter  delivery counters of the feeder's queues
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from services.queues.stats import QueueMetrics


class FeederMetrics:
    """The metrics above in one registry (``self.registry``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.queues = QueueMetrics(r)  # pass to make_queue: depth() sets meshrl_queue_depth_items{stream}
        self.prompts_fed = Counter("meshrl_feeder_prompts", "Prompts put on the prompts stream", registry=r)
        self.in_flight = Gauge("meshrl_feeder_in_flight_prompts", "Prompts fed and not yet finished", registry=r)
        self.max_in_flight = Gauge(
            "meshrl_feeder_max_in_flight_prompts", "Admission bound: prompts in flight at most", registry=r
        )

    def fed(self, put: int, in_flight: int, bound: int) -> None:
        """After a round: ``put`` new prompts, ``in_flight`` now."""
        if put > 0:
            self.prompts_fed.inc(put)
        self.in_flight.set(in_flight)
        self.max_in_flight.set(bound)
