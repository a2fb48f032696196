"""Prometheus metrics of one rollout replica (its own ``CollectorRegistry``).

Names follow ``meshrl_rollout_<what>_<unit>``; gauges read the live replica state at
scrape time (``bind``), counters/histograms are updated by the replica loop.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class RolloutMetrics:
    """The replica's metric families, registered in ``self.registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.tokens = Counter("meshrl_rollout_tokens", "Response tokens generated (response_mask sum)", registry=r)
        self.groups = Counter("meshrl_rollout_groups", "Prompt groups generated", registry=r)
        self.samples = Counter("meshrl_rollout_samples", "Samples generated and delivered to the rollouts stream", registry=r)
        self.regenerated = Counter(
            "meshrl_rollout_regenerated_samples",
            "Samples generated again from a prompt item redelivered after a crash or an idle lease", registry=r,
        )
        self.sample_errors = Counter("meshrl_rollout_sample_errors", "Samples reported with an error", registry=r)
        self.failed_items = Counter(
            "meshrl_rollout_failed_items", "Prompt items left leased after a failure (retried via reclaim)", registry=r
        )
        self.generate_seconds = Histogram(
            "meshrl_rollout_group_generate_seconds", "Seconds to generate one prompt group", registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
        )
        self.weight_load = Histogram(
            "meshrl_rollout_weight_load_seconds", "Seconds to stage and load one policy version in place", registry=r,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.queue_lag = Histogram(
            "meshrl_rollout_queue_lag_seconds", "Seconds a prompt item waited in the prompts stream before its lease",
            registry=r, buckets=(0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800),
        )
        self.in_flight = Gauge("meshrl_rollout_requests_in_flight", "vLLM requests (samples) being generated", registry=r)
        self.groups_in_flight = Gauge("meshrl_rollout_groups_in_flight", "Prompt groups leased, not yet delivered", registry=r)
        self.served_version = Gauge("meshrl_rollout_served_version", "Policy version the engine serves", registry=r)
        self.tokens_per_s = Gauge("meshrl_rollout_tokens_per_second", "Recent generation throughput", registry=r)
        self.paused = Gauge("meshrl_rollout_paused", "1 when the stream loop is paused", registry=r)
        self.canary = Gauge("meshrl_rollout_canary", "weights.rollout.mode=canary: 1 when this replica is a canary "
                            "(serves candidates), 0 when it serves promoted versions; -1 in mode all", registry=r)

    def bind(self, replica: Any) -> None:
        """Make the gauges read ``replica``'s live state at scrape time."""
        self.in_flight.set_function(lambda: replica.engine.in_flight)
        self.groups_in_flight.set_function(lambda: replica.groups_in_flight)
        self.served_version.set_function(lambda: replica.engine.version)
        self.tokens_per_s.set_function(lambda: replica.rate.rate())
        self.paused.set_function(lambda: 1.0 if replica.paused else 0.0)
        self.canary.set_function(lambda: -1.0 if replica.weights_canary is None else float(replica.weights_canary))

    def observe_group(self, *, tokens: int, errors: int, generate_s: float) -> None:
        self.tokens.inc(tokens)
        self.groups.inc()
        if errors:
            self.sample_errors.inc(errors)
        self.generate_seconds.observe(generate_s)
