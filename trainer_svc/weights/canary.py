"""The publisher's side of the canary gate (``weights.rollout.mode: canary``).

:class:`CanaryGateMixin` is part of :class:`~trainer_svc.weights.publisher.WeightPublisher`:
what the trainer calls once it judged a candidate (``promote``, ``reject``, ``resume``),
how every replica is told the version it is to serve (a SERVE control message), and which
snapshot ``FetchSnapshot`` streams to whom. The decisions' bookkeeping is
:class:`~trainer_svc.weights.promotion.RolloutState` (``self.rollout``); the state it works on
(lock, subscribers, arena, pinned snapshot) is the publisher's.
"""

from __future__ import annotations

import logging

from services.pb import weights_pb2 as pb
from services.weights.errors import SnapshotError
from services.weights.messages import control

log = logging.getLogger("trainer_svc.weights.publisher")
K = pb.ControlKind


class CanaryGateMixin:
    """The canary gate's operations of the weight publisher (module docstring)."""

    def promote(self, version: int, measurements: dict[str, float] | None = None) -> None:
        """Canary mode: the candidate ``version`` passed; every replica is to serve it
        (those that did not receive it load its snapshot). ``VersionError`` if it is not
        the candidate."""
        with self._publish_lock:  # never while a publish fills the arena
            with self._lock:
                self.rollout.promote(version, measurements)
            if self._arena is not None and self._arena.version == version:
                self._pin()
        log.info("weights v%d promoted (%s)", version, measurements or {})
        if self._metrics is not None:
            self._metrics.decided("promoted")
        self._sync_targets()

    def reject(self, version: int, reason: str, measurements: dict[str, float] | None = None,
               pause: bool = False) -> None:
        """Canary mode: the candidate ``version`` failed; the canaries roll back to the
        promoted version (its snapshot). With ``pause`` no version is sent anywhere until
        ``resume()``."""
        with self._lock:
            self.rollout.reject(version, reason, measurements, pause)
        log.error("weights v%d rejected at the canary: %s", version, reason)
        if self._metrics is not None:
            self._metrics.decided("rejected")
        self._sync_targets()

    def resume(self, reason: str = "") -> None:
        """End a pause after a rejection (``VersionError`` when not paused)."""
        with self._lock:
            self.rollout.resume(reason)
        log.warning("weights: rollout resumed (%s)", reason or "no reason given")
        if self._metrics is not None:
            self._metrics.rollout(self.rollout)

    def _pin(self) -> None:
        """The arena's version is promoted: keep it pinned (the arena packs into the buffers
        of the version promoted before)."""
        if self._arena is not None and self._arena.version >= 0:
            self._pinned = self._arena.pin(recycle=self._pinned)

    def _sync_targets(self) -> None:
        """Canary mode: recompute the seats and send SERVE to every replica whose version
        to serve or role changed."""
        if not self.rollout.canary_mode:
            return
        with self._lock:
            subs = [s for s in self._subs.values() if s.connected]
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
                    s.outbox.put(control(K.CONTROL_KIND_SERVE, self.session, 0, target[0],
                                         serve=pb.Serve(canary=told[1], from_snapshot=told[2])))
        if self._metrics is not None:
            self._metrics.rollout(self.rollout, {s.replica_id: self.rollout.is_canary(s.replica_id) for s in subs})

    def snapshot_for(self, replica_id: str, min_version: int, chunk_bytes: int):
        """The chunks ``FetchSnapshot`` streams to ``replica_id`` (``SnapshotError`` when none):
        the latest version, or in canary mode the version that replica is to serve."""
        if self._arena is None:
            raise SnapshotError("this publisher keeps no snapshots (weights.snapshot=false)")
        with self._lock:
            target = self.rollout.target(replica_id)
            pinned = self._pinned
        if target is not None and pinned is not None and target[0] == pinned.version:
            return pinned.stream(chunk_bytes, min_version)
        if target is not None and target[0] != self._arena.version:
            raise SnapshotError(f"the snapshot of v{target[0]} is not ready yet")
        return self._arena.stream(chunk_bytes, min_version)
