"""The publisher's membership: who is subscribed, the data group of each epoch, the acks.

:class:`Membership` keeps one :class:`Subscriber` per connected replica (its outbox of
control messages, the versions it reported, whether it is ready for the next epoch, its
acknowledgements), forms the data group of the ready replicas a version goes to -- a new
**membership epoch** when the membership changed or the last transfer failed (JOIN, then a
``DataGroup`` built from the rendezvous ``TCPStore``) -- and waits, with a deadline, for
the members' acknowledgements. It owns the publisher's lock (``lock``, a condition that
every state change notifies).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

from services.config.weights import WeightChannelConfig
from services.pb import weights_pb2 as pb
from services.weights.errors import TransferError
from services.weights.group import DataGroup, GroupSpec
from services.weights.messages import control
from trainer_svc.weights.rollout_state import RolloutState

K = pb.ControlKind
ACK_GRACE_S = 2.0
"""After a failed transfer, survivors get at least this long (capped at the deadline) to
acknowledge the abort, so they are ready for the next epoch."""


@dataclass(eq=False)
class Subscriber:
    replica_id: str
    outbox: queue.Queue
    served_version: int = -1
    received_version: int = -1
    ready: bool = True
    connected: bool = True
    serve_dtype: str = ""
    acks: dict[tuple[int, int], int] = field(default_factory=dict)
    promoted_only: bool = False
    told: tuple[int, bool, bool] | None = None  # the last SERVE sent: (version, canary, from_snapshot)


class Membership:
    """Subscribers, epochs, the data group and the acknowledgements (module docstring)."""

    def __init__(self, cfg: WeightChannelConfig, session: int, backend: str, rollout: RolloutState):
        self.cfg = cfg
        self.session = session
        self.backend = backend
        self.rollout = rollout  # canary seats: who a candidate goes to; a rollback's LOADED
        self.lock = threading.Condition()
        self.subs: dict[str, Subscriber] = {}
        self.closed = False
        self.epoch = 0
        self.group: DataGroup | None = None
        self.members: list[Subscriber] = []
        self.join_failed: list[str] = []
        self.store = None  # the rendezvous TCPStore (the publisher binds it in start())
        self.rendezvous_port = 0
        self._retired: list[DataGroup] = []  # closed groups, released in the background

    # ------------------------------------------------------------------ subscriptions
    def subscribe(self, replica_id: str, served_version: int, served_session: int = 0, serve_dtype: str = "",
                  promoted_only: bool = False) -> Subscriber:
        """A replica (re)subscribed; a previous subscription of the same id ends."""
        if served_session not in (0, self.session):
            served_version = -1  # another publisher's version numbers are not ours
        with self.lock:
            if self.closed:
                raise TransferError("publisher closed")
            old = self.subs.get(replica_id)
            if old is None and len(self.subs) >= self.cfg.max_replicas:
                raise TransferError(f"max_replicas={self.cfg.max_replicas} replicas already subscribed")
            sub = Subscriber(replica_id, queue.Queue(), served_version=served_version, serve_dtype=serve_dtype,
                             promoted_only=promoted_only)
            self.subs[replica_id] = sub
            self.lock.notify_all()
        if old is not None:
            old.connected = False
            old.outbox.put(None)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        with self.lock:
            sub.connected = False
            if self.subs.get(sub.replica_id) is sub:
                del self.subs[sub.replica_id]
            self.lock.notify_all()
        sub.outbox.put(None)

    def on_ack(self, req: pb.AckRequest) -> bool:
        """Record a replica's ``Ack``; False when the replica is not subscribed."""
        with self.lock:
            sub = self.subs.get(req.replica_id)
            if sub is None:
                return False
            if req.status == pb.ACK_STATUS_LOADED:
                # canary mode: told to go back -- or back on the promoted version, a rollback whose
                # load ended after the next candidate was named (the SERVE that told it is gone)
                rollback = (sub.told is not None and req.policy_version == sub.told[0]) or (
                    self.rollout.canary_mode and req.policy_version == self.rollout.promoted)
                sub.served_version = req.policy_version if rollback else max(sub.served_version, req.policy_version)
            elif req.session == self.session:
                sub.acks[(req.epoch, req.policy_version)] = req.status
                if len(sub.acks) > 64:  # keep the recent ones only
                    for k in sorted(sub.acks)[:-32]:
                        del sub.acks[k]
                if req.status == pb.ACK_STATUS_RECEIVED:
                    sub.received_version = max(sub.received_version, req.policy_version)
                if req.epoch == self.epoch or req.status == pb.ACK_STATUS_RECEIVED:
                    sub.ready = True
                if req.status == pb.ACK_STATUS_FAILED and req.epoch == self.epoch and self.group is not None \
                        and sub in self.members:
                    # A member gave up on this epoch: fail the transfer now, not at the deadline.
                    self.group.abort(f"{req.replica_id} failed: {req.message or 'no reason given'}")
            self.lock.notify_all()
        return True

    def wait_for(self, count: int, timeout: float, served_version: int | None = None) -> bool:
        """Wait until ``count`` replicas are connected (and serve >= ``served_version``)."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                subs = [s for s in self.subs.values() if s.connected]
                if served_version is not None:
                    subs = [s for s in subs if s.served_version >= served_version]
                if len(subs) >= count:
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    return False
                self.lock.wait(left)

    def close(self) -> bool:
        """Mark closed and end every subscription; False when it already was."""
        with self.lock:
            if self.closed:
                return False
            self.closed = True
            subs = list(self.subs.values())
            self.lock.notify_all()
        for s in subs:
            s.outbox.put(None)
        return True

    # ------------------------------------------------------------------ epochs and the data group
    def ensure_group(self, route: str = "all") -> str | None:
        """Make ``group`` the group of the ready replicas the ``route`` sends to (the
        canaries only for a candidate, nobody for a promotion without canary); return an
        error text on failure."""
        self.join_failed = []
        with self.lock:
            candidates = sorted(
                (s for s in self.subs.values() if s.connected and s.ready and route != "promote"
                 and (route != "canaries" or self.rollout.is_canary(s.replica_id))),
                key=lambda s: s.replica_id,
            )
            if self.group is not None and candidates == self.members and not self.group.aborted:
                return None
            self.retire_group()
            if not candidates:
                return None
            self.epoch += 1
            epoch = self.epoch
            for s in candidates:
                s.ready = False
        spec = GroupSpec(
            store_host=self.cfg.rendezvous_host,
            store_port=self.rendezvous_port,
            store_prefix=f"meshrl/weights/{self.session:x}/epoch{epoch}/",
            rank=0,
            world_size=len(candidates) + 1,
            backend=self.backend,
            timeout_s=self.cfg.transfer_timeout_s,
            gloo_devices=self.cfg.gloo_devices,
        )
        for rank, s in enumerate(candidates, start=1):
            join = pb.Join(rank=rank, world_size=spec.world_size, store_host=spec.store_host,
                           store_port=spec.store_port, store_prefix=spec.store_prefix,
                           backend=spec.backend, timeout_s=spec.timeout_s, gloo_devices=spec.gloo_devices)
            s.outbox.put(control(K.CONTROL_KIND_JOIN, self.session, epoch, -1, join=join))
        started = time.monotonic()
        try:
            group = DataGroup(spec, self.store, self.cfg.gloo_interface, self.cfg.gloo_threads,
                              gloo_address=self.cfg.rendezvous_host)  # gloo listens where replicas reach it
        except TransferError as e:
            self.send(candidates, control(K.CONTROL_KIND_ABORT, self.session, epoch, -1,
                                          abort=pb.Abort(reason=str(e))))
            self.wait_acks(candidates, epoch, -1, self.ack_deadline(started))
            self.join_failed = [s.replica_id for s in candidates]
            return f"epoch {epoch}: {e}"
        self.group, self.members = group, candidates
        return None

    def send(self, members: list[Subscriber], msg: pb.ControlMessage) -> None:
        for s in members:
            s.outbox.put(msg)

    def fail_group(self, members: list[Subscriber], epoch: int, version: int, reason: str) -> None:
        """Abort the current epoch: members drop it, the next publish forms a new one."""
        self.send(members, control(K.CONTROL_KIND_ABORT, self.session, epoch, version, abort=pb.Abort(reason=reason)))
        self.retire_group()

    def retire_group(self) -> None:
        """Close the current group (released in the background; see DataGroup.close)."""
        if self.group is not None:
            self.group.close()
            self._retired = [g for g in self._retired if g.release_thread and g.release_thread.is_alive()]
            self._retired.append(self.group)
        self.group, self.members = None, []

    def release_retired(self) -> None:
        """Wait (up to the deadline) for the groups being destroyed: they must finish before
        the process may exit."""
        deadline = time.monotonic() + self.cfg.transfer_timeout_s
        for g in self._retired:
            g.join_release(max(0.0, deadline - time.monotonic()))

    # ------------------------------------------------------------------ acknowledgements
    def ack_deadline(self, failed_step_started: float) -> float:
        """Until when survivors may acknowledge a failure: the rest of the failed step's
        deadline, but at least ACK_GRACE_S (capped at the deadline) from now."""
        timeout = self.cfg.transfer_timeout_s
        return max(failed_step_started + timeout, time.monotonic() + min(ACK_GRACE_S, timeout))

    def wait_acks(
        self, members: list[Subscriber], epoch: int, version: int, deadline: float
    ) -> tuple[list[str], list[str]]:
        """Wait until every connected member acknowledged (epoch, version) or ``deadline``;
        return (ids that acknowledged RECEIVED, ids that did not)."""
        key = (epoch, version)
        with self.lock:
            while True:
                missing = [s for s in members if s.connected and key not in s.acks and s.served_version < version]
                left = deadline - time.monotonic()
                if not missing or left <= 0 or self.closed:
                    break
                self.lock.wait(left)
            got = {s.replica_id for s in members
                   if s.acks.get(key) == pb.ACK_STATUS_RECEIVED or (version >= 0 and s.served_version >= version)}
            ok = [s.replica_id for s in members if s.replica_id in got]
            bad = [s.replica_id for s in members if s.replica_id not in got]
        return ok, bad
