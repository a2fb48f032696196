"""Prometheus metrics of the weight publisher (``meshrl_weights_*``)."""

from __future__ import annotations

from services.weights.report import PublishReport


class PublisherMetrics:
    """Prometheus metrics of the publisher (registered in the caller's registry)."""

    def __init__(self, registry):
        from prometheus_client import Counter, Gauge

        self.version = Gauge("meshrl_weights_published_version", "newest published policy version", registry=registry)
        self.bytes = Counter("meshrl_weights_published_bytes_total", "tensor bytes published", registry=registry)
        self.seconds = Gauge("meshrl_weights_publish_seconds", "duration of the last publish", registry=registry)
        self.failures = Counter("meshrl_weights_transfer_failures_total", "publishes whose transfer failed",
                                registry=registry)
        self.served_version = Gauge("meshrl_weights_replica_served_version", "policy version a replica serves",
                                    ["replica"], registry=registry)

    def published(self, r: PublishReport) -> None:
        self.version.set(r.version)
        self.bytes.inc(r.tensor_bytes)
        self.seconds.set(r.seconds)
        if r.error:
            self.failures.inc()

    def served(self, replica: str, version: int) -> None:
        self.served_version.labels(replica=replica).set(version)
