"""The publisher's side of the canary gate (``weights.rollout.mode: canary``): :class:`Promotion`.

A :class:`Promotion` is owned by :class:`~trainer_svc.weights.publisher.WeightPublisher`
(``publisher.promotion``). It routes each published version (:meth:`Promotion.route`),
carries out what the trainer decides once it judged a candidate (``promote``, ``reject``,
``resume``; the publisher's methods of those names delegate here), tells every replica the
version it is to serve (a SERVE control message), keeps the promoted version's snapshot
pinned and picks which snapshot ``FetchSnapshot`` streams to whom. The decisions'
bookkeeping is :class:`~trainer_svc.weights.rollout_state.RolloutState` (``rollout``); the
subscribers and the lock are the publisher's :class:`~trainer_svc.weights.membership.Membership`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from services.pb import weights_pb2 as pb
from services.weights.errors import SnapshotError
from services.weights.messages import control
from trainer_svc.weights.arena import PinnedSnapshot, SnapshotArena
from trainer_svc.weights.membership import Membership, Subscriber
from trainer_svc.weights.metrics import PublisherMetrics
from trainer_svc.weights.rollout_state import RolloutEvent, RolloutState, replica_of

__all__ = ["Promotion", "RolloutEvent", "RolloutState", "replica_of"]

log = logging.getLogger("trainer_svc.weights.publisher")
K = pb.ControlKind


class Promotion:
    """The canary gate's operations of the weight publisher (module docstring)."""

    def __init__(self, rollout: RolloutState, membership: Membership, arena: SnapshotArena | None,
                 publish_lock: threading.Lock, metrics: PublisherMetrics | None = None):
        self.rollout = rollout
        self.m = membership
        self.arena = arena
        self.metrics = metrics
        self._publish_lock = publish_lock  # the publisher's: promote never while a publish fills the arena
        self.pinned: PinnedSnapshot | None = None  # canary mode: the promoted version's snapshot
        self._candidate_out: tuple[int, set[Subscriber]] | None = None
        """Canary mode: the last candidate whose broadcast ended, and the subscribers it
        reached. A canary seated after it (the first canary died) loads it from the snapshot."""

    # ------------------------------------------------------------------ publishing
    def route(self, promote: bool) -> str:
        """Where a newly published version goes (:meth:`RolloutState.route`)."""
        with self.m.lock:
            return self.rollout.route(promote)

    def begin_candidate(self, version: int) -> None:
        """``version`` goes to the canaries: they are told it (SERVE) before BEGIN."""
        with self.m.lock:
            self.rollout.candidate = version
        self.sync_targets()

    def drop_candidate(self) -> None:
        """The candidate's publish failed: it was not published, there is no candidate after all."""
        with self.m.lock:
            self.rollout.candidate = None
        self.sync_targets()

    def routed(self, version: int, route: str, reached: Iterable[Subscriber] = ()) -> None:
        """``version`` was published along ``route``; ``reached``: the members that received it."""
        with self.m.lock:
            self.rollout.routed(version, route)
            if route == "canaries":
                self._candidate_out = (version, set(reached))
        if route == "promote":
            self.pin()
        if route != "held_back":
            self.sync_targets()

    # ------------------------------------------------------------------ the trainer's decisions
    def promote(self, version: int, measurements: dict[str, float] | None = None) -> None:
        """See ``WeightPublisher.promote``."""
        with self._publish_lock:  # never while a publish fills the arena
            with self.m.lock:
                self.rollout.promote(version, measurements)
            if self.arena is not None and self.arena.version == version:
                self.pin()
        log.info("weights v%d promoted (%s)", version, measurements or {})
        if self.metrics is not None:
            self.metrics.decided("promoted")
        self.sync_targets()

    def reject(self, version: int, reason: str, measurements: dict[str, float] | None = None,
               pause: bool = False) -> None:
        """See ``WeightPublisher.reject``."""
        with self.m.lock:
            self.rollout.reject(version, reason, measurements, pause)
        log.error("weights v%d rejected at the canary: %s", version, reason)
        if self.metrics is not None:
            self.metrics.decided("rejected")
        self.sync_targets()

    def resume(self, reason: str = "") -> None:
        """See ``WeightPublisher.resume``."""
        with self.m.lock:
            self.rollout.resume(reason)
        log.warning("weights: rollout resumed (%s)", reason or "no reason given")
        if self.metrics is not None:
            self.metrics.rollout(self.rollout)

    # ------------------------------------------------------------------ replicas and snapshots
    def pin(self) -> None:
        """The arena's version is promoted: keep it pinned (the arena packs into the buffers
        of the version promoted before)."""
        if self.arena is not None and self.arena.version >= 0:
            self.pinned = self.arena.pin(recycle=self.pinned)

    def sync_targets(self) -> None:
        """Canary mode: recompute the seats and send SERVE to every replica whose version
        to serve or role changed."""
        if not self.rollout.canary_mode:
            return
        with self.m.lock:
            subs = [s for s in self.m.subs.values() if s.connected]
            self.rollout.assign((s.replica_id, s.promoted_only) for s in subs)
            out = self._candidate_out
            for s in subs:
                target = self.rollout.target(s.replica_id)
                if target is None:
                    continue
                # the candidate's broadcast is over and did not reach this canary: no use waiting
                told = (*target, target[1] and out is not None and out[0] == target[0] and s not in out[1])
                if told != s.told:
                    s.told = told
                    s.outbox.put(control(K.CONTROL_KIND_SERVE, self.m.session, 0, target[0],
                                         serve=pb.Serve(canary=told[1], from_snapshot=told[2])))
        if self.metrics is not None:
            self.metrics.rollout(self.rollout, {s.replica_id: self.rollout.is_canary(s.replica_id) for s in subs})

    def snapshot_for(self, replica_id: str, min_version: int, chunk_bytes: int):
        """See ``WeightPublisher.snapshot_for``."""
        if self.arena is None:
            raise SnapshotError("this publisher keeps no snapshots (weights.snapshot=false)")
        with self.m.lock:
            target = self.rollout.target(replica_id)
            pinned = self.pinned
        if target is not None and pinned is not None and target[0] == pinned.version:
            return pinned.stream(chunk_bytes, min_version)
        if target is not None and target[0] != self.arena.version:
            raise SnapshotError(f"the snapshot of v{target[0]} is not ready yet")
        return self.arena.stream(chunk_bytes, min_version)
