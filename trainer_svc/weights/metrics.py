"""Prometheus metrics of the weight publisher (``meshrl_weights_*``)."""

from __future__ import annotations

from trainer_svc.weights.rollout_state import RolloutState
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
        # the canary gate (weights.rollout); in mode all the promoted version is the latest one
        self.promoted = Gauge("meshrl_weights_promoted_version",
                              "policy version every non-canary replica is to serve", registry=registry)
        self.candidate = Gauge("meshrl_weights_candidate_version",
                               "candidate version under test at the canaries (-1: none)", registry=registry)
        self.decisions = Counter("meshrl_weights_canary_decisions_total", "candidate versions promoted or rejected",
                                 ["verdict"], registry=registry)
        self.held_back = Counter("meshrl_weights_held_back_versions_total",
                                 "versions published while a candidate was under test (sent to nobody)",
                                 registry=registry)
        self.paused = Gauge("meshrl_weights_rollout_paused", "1 while the rollout is paused after a rejection",
                            registry=registry)
        self.canary = Gauge("meshrl_weights_replica_canary", "1 when the replica is a canary", ["replica"],
                            registry=registry)
        self.candidate.set(-1)
        self.promoted.set(-1)
        for verdict in ("promoted", "rejected"):  # exported at 0 from the start (the alert's rate needs a series)
            self.decisions.labels(verdict=verdict)

    def published(self, r: PublishReport, rollout: RolloutState) -> None:
        self.version.set(r.version)
        if r.route != "held_back":
            self.bytes.inc(r.tensor_bytes)
            self.seconds.set(r.seconds)
        if r.error:
            self.failures.inc()
        self.rollout(rollout, held_back=r.route == "held_back")

    def rollout(self, state: RolloutState, canaries: dict[str, bool] | None = None, held_back: bool = False) -> None:
        """The gate's state now (``canaries``: replica -> is a canary, when roles changed)."""
        self.promoted.set(state.promoted)
        self.candidate.set(-1 if state.candidate is None else state.candidate)
        self.paused.set(1 if state.paused else 0)
        if held_back:
            self.held_back.inc()
        for replica, is_canary in (canaries or {}).items():
            self.canary.labels(replica=replica).set(1 if is_canary else 0)

    def decided(self, verdict: str) -> None:
        self.decisions.labels(verdict=verdict).inc()

    def served(self, replica: str, version: int) -> None:
        self.served_version.labels(replica=replica).set(version)
