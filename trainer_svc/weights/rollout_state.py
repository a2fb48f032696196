"""The canary gate's bookkeeping (``RolloutState``): roles, the promoted and candidate versions.

With ``weights.rollout.mode: canary`` a published version is not pushed to every replica.
:class:`RolloutState` decides, per version, where it goes (:meth:`RolloutState.route`):

* the trainer's starting weights are **promoted** at once (every replica loads them);
* the next version becomes the **candidate**: it is broadcast to the canaries only, while
  every other replica keeps serving the promoted version;
* a version published while a candidate is under test (or while the rollout is paused) is
  **held back**: sent to nobody (each version is complete weights, so nothing is lost; the
  first version published after the decision is the next candidate).

The trainer decides (:meth:`promote` / :meth:`reject`); :meth:`target` then says which
version each replica is to serve. Roles are sticky: a canary keeps its seat while it is
subscribed; a free seat goes to the first subscriber by replica id, never to one that
asked for promoted versions only (the live-policy endpoint). Pure bookkeeping, no I/O:
the publisher holds its lock around every call and sends the resulting SERVE messages.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from services.config.weights import RolloutGateConfig
from services.weights.errors import VersionError

MAX_EVENTS = 64


@dataclass
class RolloutEvent:
    """One step of the gate's timeline (see ``RolloutEvent`` in proto/weights.proto)."""

    version: int
    kind: str  # promoted | rejected | candidate | held_back | paused | resumed
    reason: str = ""
    measurements: dict[str, float] = field(default_factory=dict)
    ts: float = field(default_factory=time.time)

    def as_dict(self) -> dict:
        return {"ts": self.ts, "version": self.version, "kind": self.kind, "reason": self.reason,
                "measurements": dict(self.measurements)}


class RolloutState:
    """Where each version goes and which version each replica serves (module docstring)."""

    def __init__(self, cfg: RolloutGateConfig) -> None:
        self.cfg = cfg
        self.promoted = -1
        self.candidate: int | None = None
        self.rejected: dict[int, str] = {}
        self.paused = ""
        self.canaries: set[str] = set()
        self.events: deque[RolloutEvent] = deque(maxlen=MAX_EVENTS)
        self.held_back = 0

    @property
    def canary_mode(self) -> bool:
        return self.cfg.mode == "canary"

    def _event(self, version: int, kind: str, reason: str = "", measurements: Mapping[str, float] | None = None) -> None:
        self.events.append(RolloutEvent(version, kind, reason, dict(measurements or {})))

    # ------------------------------------------------------------------ versions
    def route(self, promote: bool) -> str:
        """Where a newly published version goes: ``all`` (mode all), ``promote`` (promoted
        without a canary: the trainer's starting weights), ``canaries`` (the new candidate) or
        ``held_back`` (a candidate is under test, or the rollout is paused). Changes nothing:
        :meth:`routed` records it once the version is published."""
        if not self.canary_mode:
            return "all"
        if promote:
            return "promote"
        return "held_back" if self.candidate is not None or self.paused else "canaries"

    def wants_next(self) -> bool:
        """Whether the next version would go anywhere (else the trainer need not gather it)."""
        return self.route(False) != "held_back"

    def routed(self, version: int, route: str) -> None:
        """``version`` was published along ``route`` (see :meth:`route`)."""
        if route in ("all", "promote"):
            self.promoted, self.candidate = version, None
            if route == "promote":
                self._event(version, "promoted", "the trainer's starting weights")
        elif route == "canaries":
            self.candidate = version
            self._event(version, "candidate")
        else:
            self.held_back += 1

    def _check_candidate(self, version: int) -> None:
        if self.candidate != version:
            raise VersionError(f"v{version} is not the candidate under test (the candidate is {self.candidate})")

    def promote(self, version: int, measurements: Mapping[str, float] | None = None) -> None:
        """The candidate ``version`` passed: every replica is to serve it."""
        self._check_candidate(version)
        self.promoted, self.candidate = version, None
        self._event(version, "promoted", measurements=measurements)

    def reject(self, version: int, reason: str, measurements: Mapping[str, float] | None = None,
               pause: bool = False) -> None:
        """The candidate ``version`` failed: the canaries go back to the promoted version;
        with ``pause`` no new candidate is taken until :meth:`resume`."""
        self._check_candidate(version)
        self.candidate = None
        self.rejected[version] = reason
        self._event(version, "rejected", reason, measurements)
        if pause:
            self.paused = f"v{version} rejected: {reason}"
            self._event(version, "paused", self.paused)

    def resume(self, reason: str = "") -> None:
        """End a pause: the next published version is the next candidate."""
        if not self.paused:
            raise VersionError("the rollout is not paused")
        self.paused = ""
        self._event(self.promoted, "resumed", reason)

    # ------------------------------------------------------------------ replicas
    def assign(self, subscribers: Iterable[tuple[str, bool]]) -> None:
        """Recompute the canary seats from the connected ``(replica_id, promoted_only)``:
        canaries that are still here keep theirs; free seats go to the others by id. The
        workers of one tensor-parallel replica (``<id>.w<rank>``) share its seat."""
        if not self.canary_mode:
            return
        subs = sorted({(replica_of(rid), promoted_only) for rid, promoted_only in subscribers})
        self.canaries &= {rid for rid, _ in subs}
        for rid, promoted_only in subs:
            if len(self.canaries) >= self.cfg.canary_replicas:
                break
            if not promoted_only:
                self.canaries.add(rid)

    def is_canary(self, replica_id: str) -> bool:
        return replica_of(replica_id) in self.canaries

    def target(self, replica_id: str) -> tuple[int, bool] | None:
        """``(version to serve, is canary)`` for ``replica_id``; None in mode all or before
        anything was promoted."""
        if not self.canary_mode or self.promoted < 0:
            return None
        canary = self.is_canary(replica_id)
        if canary and self.candidate is not None:
            return self.candidate, True
        return self.promoted, canary

    def as_dict(self) -> dict:
        """JSON-able state (the trainer's ``/status``)."""
        return {"mode": self.cfg.mode, "promoted": self.promoted, "candidate": self.candidate,
                "rejected": {str(v): r for v, r in self.rejected.items()}, "paused": self.paused,
                "canaries": sorted(self.canaries), "held_back": self.held_back,
                "events": [e.as_dict() for e in self.events]}


def replica_of(subscriber_id: str) -> str:
    """The replica a subscriber belongs to: ``r0`` for ``r0`` and for its tensor-parallel
    workers ``r0.w1``, ``r0.w2`` ... (each receives the whole model)."""
    head, sep, rank = subscriber_id.rpartition(".w")
    return head if sep and head and rank.isdigit() else subscriber_id
