"""What one ``WeightPublisher.publish`` did: the publisher returns it, its metrics count it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PublishReport:
    """What one ``publish`` did.

    ``delivered``: replicas that acknowledged every bucket; ``failed``: members that did not
    (dead, hung, or aborted); ``error``: why the transfer failed (None when it did not).
    """

    version: int
    epoch: int
    num_buckets: int
    num_tensors: int
    tensor_bytes: int
    seconds: float
    delivered: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    error: str | None = None
    route: str = "all"
    """Canary mode: ``promote``, ``canaries`` or ``held_back`` (sent to nobody); else ``all``."""
