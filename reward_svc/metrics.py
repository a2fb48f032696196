"""Prometheus metrics of the reward service (one registry per service instance).

Names: ``meshrl_reward_<what>_<unit>``. ``samples_per_second`` is a gauge over the last
few seconds, for dashboards that want the number without a PromQL ``rate``.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class RewardMetrics:
    """All reward-service metrics, registered in ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None, window_s: float = 10.0) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.samples = Counter("meshrl_reward_samples_total", "Samples scored", registry=r)
        self.groups = Counter("meshrl_reward_groups_total", "Groups (items) scored", ["path"], registry=r)
        self.errors = Counter("meshrl_reward_errors_total", "Samples whose scorer failed, by kind", ["kind"], registry=r)
        self.timeouts = Counter("meshrl_reward_timeouts_total", "Scorer calls that missed their deadline", registry=r)
        self.malformed = Counter("meshrl_reward_malformed_total", "Malformed inputs rejected", ["path"], registry=r)
        self.put_failures = Counter("meshrl_reward_put_failures_total", "Failed writes to the output stream", registry=r)
        self.restarts = Gauge("meshrl_reward_worker_restarts", "Sandbox worker replacements so far", registry=r)
        self.latency = Histogram(
            "meshrl_reward_batch_latency_seconds",
            "Wall time to decode and score one batch of groups",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=r,
        )
        self.score_mean = Gauge("meshrl_reward_score_mean", "Mean score since start, by data_source", ["data_source"], registry=r)
        self.score_count = Counter("meshrl_reward_scored_total", "Samples scored, by data_source", ["data_source"], registry=r)
        self.rate = Gauge("meshrl_reward_samples_per_second", "Samples scored per second (recent window)", registry=r)
        self._lock = threading.Lock()
        self._sums: dict[str, tuple[float, int]] = {}
        self._window: deque[tuple[float, int]] = deque()
        self._window_n = 0
        self._window_s = window_s

    def observe(self, data_sources: list[str], scores: list[float], error_kinds: list[str | None]) -> None:
        """Record one scored group."""
        n = len(scores)
        self.samples.inc(n)
        now = time.monotonic()
        with self._lock:
            for src, s in zip(data_sources, scores, strict=True):
                total, count = self._sums.get(src, (0.0, 0))
                self._sums[src] = (total + s, count + 1)
            for src in set(data_sources):
                total, count = self._sums[src]
                self.score_mean.labels(src).set(total / count)
            self._window.append((now, n))
            self._window_n += n
            while self._window and now - self._window[0][0] > self._window_s:
                self._window_n -= self._window.popleft()[1]
            span = max(now - self._window[0][0], 1e-3) if len(self._window) > 1 else self._window_s
            self.rate.set(self._window_n / span)
        for src in set(data_sources):
            self.score_count.labels(src).inc(data_sources.count(src))
        for kind in error_kinds:
            if kind is not None:
                self.errors.labels(kind).inc()
                if kind == "timeout":
                    self.timeouts.inc()

    def mean_scores(self) -> dict[str, float]:
        """Mean score per data_source since start."""
        with self._lock:
            return {k: t / c for k, (t, c) in self._sums.items()}
