"""Delivery counters of a queue: a plain ``stats()`` dict plus optional Prometheus counters.

Every :class:`~services.queues.base.Queue` keeps its own :class:`QueueStats` (plain ints,
per queue object). If the service passes a :class:`QueueMetrics` (built once per
service registry), the same increments also feed labelled Prometheus counters
``meshrl_queue_<what>_total{stream,group}``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

COUNTERS = (
    "put",  # items accepted by the backend (first time)
    "delivered",  # items handed to the application by get()/reclaim()
    "redelivered",  # of those, items delivered before (lease expired, consumer died, restart)
    "deduplicated",  # samples dropped because their sample_id was already taken by another item
    "dropped",  # items removed without delivery (malformed, or every sample a duplicate)
    "malformed",  # entries that failed validation/decoding (also counted in dropped)
    "acked",  # items acknowledged
    "seq_gaps",  # producer sequence numbers skipped (items lost upstream)
    "seq_duplicates",  # puts the backend had already accepted (idempotent retries)
    "reconnects",  # calls retried after a connection error
)


@dataclass
class QueueStats:
    """Per-queue counters; see ``COUNTERS`` for their meaning."""

    put: int = 0
    delivered: int = 0
    redelivered: int = 0
    deduplicated: int = 0
    dropped: int = 0
    malformed: int = 0
    acked: int = 0
    seq_gaps: int = 0
    seq_duplicates: int = 0
    reconnects: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class QueueMetrics:
    """Prometheus counters for queues, registered once in a service's registry.

    Build one per registry and pass it to every ``make_queue`` call of that service
    (registering the same names twice in one registry is an error).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.counters: dict[str, Counter] = {
            name: Counter(
                f"meshrl_queue_{name}",
                f"Queue items/samples: {name.replace('_', ' ')} (per stream and consumer group)",
                ["stream", "group"],
                registry=registry,
            )
            for name in COUNTERS
        }
        self.depth = Gauge(
            "meshrl_queue_depth_items",
            "Unacknowledged items in the stream at the last depth() call",
            ["stream"],
            registry=registry,
        )


class StatsRecorder:
    """Increments a :class:`QueueStats` and, if given, the matching Prometheus counters."""

    def __init__(self, stream: str, group: str, metrics: QueueMetrics | None) -> None:
        self.stats = QueueStats()
        self._labels = {"stream": stream, "group": group}
        self._metrics = metrics

    def inc(self, name: str, n: int = 1) -> None:
        if n <= 0:
            return
        setattr(self.stats, name, getattr(self.stats, name) + n)
        if self._metrics is not None:
            self._metrics.counters[name].labels(**self._labels).inc(n)

    def set_depth(self, depth: int) -> None:
        if self._metrics is not None:
            self._metrics.depth.labels(stream=self._labels["stream"]).set(depth)
