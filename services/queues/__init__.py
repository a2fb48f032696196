"""Streams between meshrl's services: one interface, two backends.

    from services.queues import make_queue
    q = make_queue(cfg.queues, stream="rollouts", group="reward", consumer="reward-0")
    await q.put([group_dataproto])                  # producer side
    for item in await q.get(max_items=8, timeout=1.0):
        ...  # write downstream, then
        await q.ack(item)

Backends: ``redis`` (Redis Streams, :mod:`.redis_backend`) and ``embedded`` (the gRPC
QueueService hosted by the controller, :mod:`.embedded_client` / :mod:`.broker`).
Semantics (docs/queues.md): at-least-once delivery + dedupe on ``sample_id`` = each
sample effectively once; a sample ledger records the stage each sample reached.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.queues.base import (
    STAGES,
    Leased,
    MalformedEntryError,
    Queue,
    QueueError,
    QueueFullError,
    QueueUnavailableError,
    RawItem,
    RawLeased,
)
from services.queues.stats import QueueMetrics, QueueStats

if TYPE_CHECKING:
    from services.auth import JobCredential
    from services.config.queues import EmbeddedQueueConfig, RedisQueueConfig


def make_queue(
    cfg: "RedisQueueConfig | EmbeddedQueueConfig",
    *,
    stream: str,
    group: str,
    consumer: str,
    metrics: QueueMetrics | None = None,
    credential: "JobCredential | None" = None,
) -> Queue:
    """The queue for ``stream`` read by consumer ``group`` as ``consumer``, on the backend
    ``cfg.type`` selects. Build one :class:`QueueMetrics` per service registry and pass it
    to every queue of that service to export the counters. ``credential``: the job credential
    the embedded broker requires (default: the process's, :func:`services.auth.current`)."""
    if cfg.type == "redis":
        from services.queues.redis_backend import RedisQueue

        return RedisQueue(cfg, stream=stream, group=group, consumer=consumer, metrics=metrics)
    if cfg.type == "embedded":
        from services.queues.embedded_client import EmbeddedQueue

        return EmbeddedQueue(cfg, stream=stream, group=group, consumer=consumer, metrics=metrics, credential=credential)
    raise ValueError(f"unknown queue backend {cfg.type!r}")


__all__ = [
    "STAGES", "Leased", "MalformedEntryError", "Queue", "QueueError", "QueueFullError",
    "QueueUnavailableError", "QueueMetrics", "QueueStats", "RawItem", "RawLeased", "make_queue",
]
