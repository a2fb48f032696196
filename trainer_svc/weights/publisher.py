"""Trainer side of the weight channel: ``WeightPublisher``.

Only trainer rank 0 creates one. It serves the gRPC ``WeightService`` (control plane),
hosts the TCPStore rendezvous of the data groups, and on ``publish(version, named_tensors)``:

1. forms the data group of the ready, connected replicas (a new membership epoch when the
   membership changed or the last transfer failed; deadline ``transfer_timeout_s``);
2. announces BEGIN, then per bucket its plan (BUCKET) and broadcasts its bytes, packing
   bucket k+1 while bucket k is on the wire; every wait has the deadline;
3. sends END and waits (deadline) for every member's RECEIVED acknowledgement;
4. hands the buckets to a background thread that writes the safetensors snapshot.

On any failure the transfer is aborted (ABORT), the iterator is still drained (other
trainer ranks gather in lockstep) and the snapshot still written; replicas that
acknowledged the failure form the next epoch, a dead or hung one is left out. A publish
therefore never waits on a dead replica longer than one deadline.

With ``weights.rollout.mode: canary`` a version goes where :class:`RolloutState` routes it
(the canaries only, or nobody while a candidate is under test); the trainer then calls
``promote``/``reject``, and every replica is told the version to serve (SERVE), loading
it from the snapshot when it does not arrive by broadcast (docs/weights.md, "Promotion").
"""

from __future__ import annotations

import collections
import itertools
import logging
import queue
import secrets
import threading
import time
from collections.abc import Iterable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import torch

from services import auth
from services.config.weights import WeightChannelConfig
from services.pb import weights_pb2 as pb
from services.pb import weights_pb2_grpc as pb_grpc
from trainer_svc.weights.arena import PinnedSnapshot, RotatingBuffers, SnapshotArena
from trainer_svc.weights.canary import CanaryGateMixin
from trainer_svc.weights.faults import CandidateFault
from services.weights.errors import PlanError, SnapshotError, TransferError, VersionError
from services.weights.group import DataGroup, GroupSpec, connect_store, device_for, resolve_backend
from services.weights.messages import SERVER_OPTIONS, bucket_to_pb, control
from trainer_svc.weights.grpc_servicer import WeightServicer
from trainer_svc.weights.metrics import PublisherMetrics
from services.weights.plan import DTYPES, Bucket, iter_buckets
from trainer_svc.weights.promotion import RolloutState
from services.weights.report import PublishReport

log = logging.getLogger(__name__)
K = pb.ControlKind
ACK_GRACE_S = 2.0
"""After a failed transfer, survivors get at least this long (capped at the deadline) to
acknowledge the abort, so they are ready for the next epoch."""


@dataclass(eq=False)
class _Subscriber:
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


class WeightPublisher(CanaryGateMixin):
    """Publishes policy versions to every subscribed rollout replica (see module docstring)."""

    def __init__(self, cfg: WeightChannelConfig, registry=None, credential: auth.JobCredential | None = None):
        self.cfg = cfg
        self.credential = auth.resolve(credential)  # every gRPC call must carry it
        self.session = secrets.randbits(63) | 1
        self.backend = resolve_backend(cfg.backend)
        self.device = device_for(self.backend)
        self._lock = threading.Condition()
        self._publish_lock = threading.Lock()
        self._subs: dict[str, _Subscriber] = {}
        self._latest = -1
        self._epoch = 0
        self._group: DataGroup | None = None
        self._members: list[_Subscriber] = []
        self._join_failed: list[str] = []
        self._candidate_out: tuple[int, set[_Subscriber]] | None = None
        """Canary mode: the last candidate whose broadcast ended, and the subscribers it
        reached. A canary seated after it (the first canary died) loads it from the snapshot."""
        self._retired: list[DataGroup] = []  # closed groups, released in the background
        self._arena = SnapshotArena() if cfg.snapshot else None
        self._rotating = RotatingBuffers(self.device, slots=cfg.pipeline_depth + 1)
        self._closed = False
        self._server: grpc.Server | None = None
        self._store = None
        self.control_port = 0
        self.rendezvous_port = 0
        self._metrics = PublisherMetrics(registry) if registry is not None else None
        self.rollout = RolloutState(cfg.rollout)
        """Canary gate bookkeeping (``weights.rollout``); read it under ``self._lock``."""
        self._pinned: PinnedSnapshot | None = None  # canary mode: the promoted version's snapshot
        self._fault = CandidateFault.from_env()  # tests only (trainer_svc/weights/faults.py)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "WeightPublisher":
        """Bind the gRPC server and the rendezvous store."""
        cfg = self.cfg
        self._store = connect_store(cfg.host, cfg.rendezvous_port, cfg.transfer_timeout_s, is_master=True)
        self.rendezvous_port = self._store.port
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=cfg.max_replicas + 16, thread_name_prefix="weights-grpc"),
            options=SERVER_OPTIONS,
            interceptors=[self.credential.server_interceptor()],
        )
        pb_grpc.add_WeightServiceServicer_to_server(WeightServicer(self), server)
        port = server.add_insecure_port(f"{cfg.host}:{cfg.control_port}")
        if port == 0:
            raise OSError(f"cannot bind the weight channel's gRPC server to {cfg.host}:{cfg.control_port}")
        server.start()
        self._server, self.control_port = server, port
        return self

    @property
    def control_address(self) -> str:
        """``host:port`` replicas subscribe to."""
        return f"{self.cfg.rendezvous_host}:{self.control_port}"

    def close(self) -> None:
        """Stop serving: end every subscription, drop the group."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            subs = list(self._subs.values())
            self._lock.notify_all()
        for s in subs:
            s.outbox.put(None)
        if self._arena is not None and self.cfg.snapshot_dir and self.snapshot_version >= 0:
            path = Path(self.cfg.snapshot_dir) / f"weights-v{self.snapshot_version}.safetensors"
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self.save_snapshot(path)
            except (OSError, SnapshotError) as e:
                log.error("persisting the last snapshot to %s failed: %s", path, e)
        self._retire_group()
        if self._server is not None:
            self._server.stop(grace=1.0).wait(5.0)
        deadline = time.monotonic() + self.cfg.transfer_timeout_s
        for g in self._retired:  # groups being destroyed must finish before the process may exit
            g.join_release(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> "WeightPublisher":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ publishing
    @property
    def latest_version(self) -> int:
        """Newest published version (-1 before the first publish)."""
        return self._latest

    def publish(
        self, version: int, named_tensors: Iterable[tuple[str, torch.Tensor]], *, borrow: bool = False,
        promote: bool = False,
    ) -> PublishReport:
        """Publish ``version`` (> every earlier one) to every ready replica; see module docstring.

        ``named_tensors`` is consumed lazily, once, in full (even when the transfer fails).
        ``borrow=True`` promises the tensors will not be modified in place after this call
        (true for ``DTensor.full_tensor()`` results, which are fresh): large contiguous
        tensors on the channel's device are then broadcast straight from their memory and
        kept by reference as the snapshot, without a packing copy. With ``borrow=False``
        (e.g. live ``model.named_parameters()``) every byte is copied into the publisher's
        own buffers first.
        Raises ``VersionError`` for a version that does not go forward, ``PlanError`` for a
        bad tensor (the transfer is aborted and the version not published). Transfer
        failures do not raise: they are in the returned report.
        Canary mode: ``promote=True`` (the trainer's starting weights) promotes the version
        without a canary; otherwise it becomes the candidate, sent to the canaries only, or,
        while a candidate is under test, is held back (the iterator is drained, nothing sent).
        """
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise VersionError(f"policy version must be a non-negative int, got {version!r}")
        with self._publish_lock:
            if self._closed or self._server is None:
                raise TransferError("publisher is not started (or closed)")
            if version <= self._latest:
                raise VersionError(f"policy version must go forward: got {version} after {self._latest}")
            t0 = time.monotonic()
            named_tensors = iter(named_tensors)
            first = next(named_tensors, None)
            if first is None:
                raise PlanError(f"publish({version}) got no tensors")
            named_tensors = itertools.chain([first], named_tensors)
            with self._lock:
                route = self.rollout.route(promote)
            if route == "held_back":
                return self._hold_back(version, named_tensors, t0)
            if self._fault is not None:
                named_tensors = self._fault.wrap(route, version, named_tensors)
            if route == "canaries":
                with self._lock:
                    self.rollout.candidate = version  # the canaries are told it (SERVE) before BEGIN
                self._sync_targets()
            error = self._ensure_group(route)
            group, members, epoch = self._group, list(self._members), self._epoch
            grace_until = 0.0  # after a failure: how long survivors may take to acknowledge it

            def fail(reason: str, wait_started: float) -> None:
                nonlocal error, grace_until
                error = reason
                grace_until = self._ack_deadline(wait_started)
                self._fail_group(members, epoch, version, reason)

            if group is not None:
                with self._lock:
                    for s in members:
                        s.ready = False
                self._send(members, control(K.CONTROL_KIND_BEGIN, self.session, epoch, version,
                                            begin=pb.Begin(bucket_bytes=self.cfg.bucket_bytes)))
            keep: list[Bucket] = []
            inflight: collections.deque = collections.deque()  # (bucket index, PendingBroadcast)
            depth = self.cfg.pipeline_depth
            nb = nt = tb = 0
            arena = self._arena
            direct = arena is not None and self.device.type == "cpu"  # the arena is the broadcast source
            if arena is not None:
                arena.begin_write()
            alloc = arena.buffer if direct else self._rotating.buffer  # type: ignore[union-attr]
            # Zero-copy for big tensors when nothing needs a private copy of them.
            zero_copy = arena is None or (borrow and direct)
            zc_min = max(1, int(self.cfg.zero_copy_min_mb * (1 << 20))) if zero_copy else None
            try:
                wire = self.wire_dtype(members if group is not None else [])
                for bucket in iter_buckets(named_tensors, self.cfg.bucket_bytes, self.device, alloc, zc_min, wire):
                    nb, nt, tb = nb + 1, nt + bucket.num_tensors, tb + sum(s.nbytes for s in bucket.specs)
                    if group is not None and error is None:
                        self._send(members, control(K.CONTROL_KIND_BUCKET, self.session, epoch, version,
                                                    bucket=bucket_to_pb(bucket)))
                        started, index = time.monotonic(), bucket.index
                        try:
                            while len(inflight) >= depth:  # earlier buckets went out while this one was packed
                                index, oldest = inflight.popleft()
                                started = time.monotonic()
                                oldest.wait()
                            started, index = time.monotonic(), bucket.index
                            if bucket.nbytes:
                                inflight.append((bucket.index, group.post(bucket.buffer)))
                        except TransferError as e:
                            inflight.clear()
                            fail(f"bucket {index}: {e}", started)
                    if arena is not None:
                        keep.append(bucket if direct else _to_arena(bucket, arena))  # borrowed: by reference
                while inflight and error is None:
                    index, oldest = inflight.popleft()
                    started = time.monotonic()
                    try:
                        oldest.wait()
                    except TransferError as e:
                        inflight.clear()
                        fail(f"bucket {index}: {e}", started)
            except Exception as e:  # PlanError, or the trainer's iterator raised: abort, then re-raise
                if route == "canaries":  # not published: no candidate after all
                    with self._lock:
                        self.rollout.candidate = None
                    self._sync_targets()
                if group is not None:
                    if error is None:
                        fail(f"publisher error: {type(e).__name__}: {e}", time.monotonic())
                    self._wait_acks(members, epoch, version, grace_until)
                raise
            delivered: list[str] = []
            failed: list[str] = list(self._join_failed) if group is None else []
            if group is not None and error is None:
                self._send(members, control(K.CONTROL_KIND_END, self.session, epoch, version,
                                            end=pb.End(num_buckets=nb, num_tensors=nt, tensor_bytes=tb)))
                delivered, failed = self._wait_acks(members, epoch, version, time.monotonic() + self.cfg.transfer_timeout_s)
                if failed:
                    error = f"no RECEIVED acknowledgement from {failed}"
                    self._fail_group(members, epoch, version, error)
            elif group is not None:
                # Let the survivors acknowledge the abort (so they are ready for the next
                # epoch), within what is left of the failed step's deadline.
                _, failed = self._wait_acks(members, epoch, version, grace_until)
                failed = [s.replica_id for s in members]
            self._latest = version
            if arena is not None:
                arena.commit(version, keep)
            with self._lock:
                self.rollout.routed(version, route)
                if route == "canaries":
                    self._candidate_out = (version, {s for s in members if s.replica_id in delivered})
            if route == "promote":
                self._pin()
            self._sync_targets()
            report = PublishReport(version, epoch, nb, nt, tb, time.monotonic() - t0, delivered, failed, error, route)
            if self._metrics is not None:
                self._metrics.published(report, self.rollout)
            if error:
                log.warning("weights v%d: transfer failed (%s); %d replica(s) left out", version, error, len(failed))
            return report

    def _hold_back(self, version: int, named_tensors: Iterable, t0: float) -> PublishReport:
        """Canary mode, a candidate under test: ``version`` goes to nobody (drained unused)."""
        nt = tb = 0
        for _, t in named_tensors:  # the other trainer ranks gather in lockstep
            nt, tb = nt + 1, tb + t.numel() * t.element_size()
        self._latest = version
        with self._lock:
            self.rollout.routed(version, "held_back")
        report = PublishReport(version, self._epoch, 0, nt, tb, time.monotonic() - t0, route="held_back")
        if self._metrics is not None:
            self._metrics.published(report, self.rollout)
        return report

    def wire_dtype(self, members: list[_Subscriber]) -> torch.dtype | None:
        """The dtype wider floating-point tensors are cast to for ``members`` (None: as they are)."""
        w = self.cfg.wire_dtype
        if w == "off":
            return None
        if w != "auto":
            return DTYPES[w]
        announced = {s.serve_dtype for s in members}
        if len(announced) == 1 and (d := announced.pop()):
            return DTYPES[d]
        return None

    def _send(self, members: list[_Subscriber], msg: pb.ControlMessage) -> None:
        for s in members:
            s.outbox.put(msg)

    def _fail_group(self, members: list[_Subscriber], epoch: int, version: int, reason: str, send: bool = True) -> None:
        """Abort the current epoch: members drop it, the next publish forms a new one."""
        if send:
            self._send(members, control(K.CONTROL_KIND_ABORT, self.session, epoch, version, abort=pb.Abort(reason=reason)))
        self._retire_group()

    def _retire_group(self) -> None:
        """Close the current group (released in the background; see DataGroup.close)."""
        if self._group is not None:
            self._group.close()
            self._retired = [g for g in self._retired if g.release_thread and g.release_thread.is_alive()]
            self._retired.append(self._group)
        self._group, self._members = None, []

    def _ensure_group(self, route: str = "all") -> str | None:
        """Make ``self._group`` the group of the ready replicas the ``route`` sends to (the
        canaries only for a candidate, nobody for a promotion without canary); return an
        error text on failure."""
        self._join_failed = []
        with self._lock:
            candidates = sorted(
                (s for s in self._subs.values() if s.connected and s.ready and route != "promote"
                 and (route != "canaries" or self.rollout.is_canary(s.replica_id))),
                key=lambda s: s.replica_id,
            )
            if self._group is not None and candidates == self._members and not self._group.aborted:
                return None
            self._retire_group()
            if not candidates:
                return None
            self._epoch += 1
            epoch = self._epoch
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
            group = DataGroup(spec, self._store, self.cfg.gloo_interface, self.cfg.gloo_threads,
                              gloo_address=self.cfg.rendezvous_host)  # gloo listens where replicas reach it
        except TransferError as e:
            self._send(candidates, control(K.CONTROL_KIND_ABORT, self.session, epoch, -1,
                                           abort=pb.Abort(reason=str(e))))
            self._wait_acks(candidates, epoch, -1, self._ack_deadline(started))
            self._join_failed = [s.replica_id for s in candidates]
            return f"epoch {epoch}: {e}"
        self._group, self._members = group, candidates
        return None

    def _ack_deadline(self, failed_step_started: float) -> float:
        """Until when survivors may acknowledge a failure: the rest of the failed step's
        deadline, but at least ACK_GRACE_S (capped at the deadline) from now."""
        timeout = self.cfg.transfer_timeout_s
        return max(failed_step_started + timeout, time.monotonic() + min(ACK_GRACE_S, timeout))

    def _wait_acks(
        self, members: list[_Subscriber], epoch: int, version: int, deadline: float
    ) -> tuple[list[str], list[str]]:
        """Wait until every connected member acknowledged (epoch, version) or ``deadline``;
        return (ids that acknowledged RECEIVED, ids that did not)."""
        key = (epoch, version)
        with self._lock:
            while True:
                missing = [s for s in members if s.connected and key not in s.acks and s.served_version < version]
                left = deadline - time.monotonic()
                if not missing or left <= 0 or self._closed:
                    break
                self._lock.wait(left)
            got = {s.replica_id for s in members
                   if s.acks.get(key) == pb.ACK_STATUS_RECEIVED or (version >= 0 and s.served_version >= version)}
            ok = [s.replica_id for s in members if s.replica_id in got]
            bad = [s.replica_id for s in members if s.replica_id not in got]
        return ok, bad

    # ------------------------------------------------------------------ replicas & snapshots
    def replicas(self) -> dict[str, pb.ReplicaStatus]:
        """The connected replicas, by id."""
        with self._lock:
            return {
                s.replica_id: pb.ReplicaStatus(replica_id=s.replica_id, served_version=s.served_version,
                                               received_version=s.received_version, ready=s.ready,
                                               canary=self.rollout.is_canary(s.replica_id),
                                               target_version=s.told[0] if s.told else -1)
                for s in self._subs.values()
                if s.connected
            }

    def wait_for_replicas(self, count: int, timeout: float, served_version: int | None = None) -> bool:
        """Wait until ``count`` replicas are connected (and serve >= ``served_version``)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                subs = [s for s in self._subs.values() if s.connected]
                if served_version is not None:
                    subs = [s for s in subs if s.served_version >= served_version]
                if len(subs) >= count:
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return False
                self._lock.wait(left)

    @property
    def snapshot_version(self) -> int:
        """Version of the snapshot being served (-1 when none, or while a publish overwrites
        it); in canary mode the promoted version's."""
        if self._pinned is not None:
            return self._pinned.version
        return self._arena.version if self._arena is not None else -1

    def wait_for_snapshot(self, version: int, timeout: float) -> bool:
        """Wait until the snapshot of ``version`` (or newer) is served."""
        return self._arena is not None and self._arena.wait_for(version, timeout)

    def save_snapshot(self, path: str | Path) -> int:
        """Write the served snapshot (canary mode: the promoted version's) to ``path`` as a
        safetensors file; return its version."""
        if self._arena is None:
            raise SnapshotError("snapshots are turned off (weights.snapshot=false)")
        if self._pinned is not None:
            return self._pinned.save(Path(path))
        return self._arena.save(Path(path))

    # ------------------------------------------------------------------ servicer hooks
    def _subscribe(self, replica_id: str, served_version: int, served_session: int = 0,
                   serve_dtype: str = "", promoted_only: bool = False) -> _Subscriber:
        if served_session not in (0, self.session):
            served_version = -1  # another publisher's version numbers are not ours
        with self._lock:
            if self._closed:
                raise TransferError("publisher closed")
            old = self._subs.get(replica_id)
            if old is None and len(self._subs) >= self.cfg.max_replicas:
                raise TransferError(f"max_replicas={self.cfg.max_replicas} replicas already subscribed")
            sub = _Subscriber(replica_id, queue.Queue(), served_version=served_version, serve_dtype=serve_dtype,
                              promoted_only=promoted_only)
            self._subs[replica_id] = sub
            self._lock.notify_all()
        if old is not None:
            old.connected = False
            old.outbox.put(None)
        self._sync_targets()  # (queued behind the WELCOME the servicer sends first)
        if self._metrics is not None:
            self._metrics.served(replica_id, served_version)
        return sub

    def _unsubscribe(self, sub: _Subscriber) -> None:
        with self._lock:
            sub.connected = False
            if self._subs.get(sub.replica_id) is sub:
                del self._subs[sub.replica_id]
            self._lock.notify_all()
        sub.outbox.put(None)
        self._sync_targets()  # a canary's seat goes to another replica

    def _ack(self, req: pb.AckRequest) -> bool:
        with self._lock:
            sub = self._subs.get(req.replica_id)
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
                if req.epoch == self._epoch or req.status == pb.ACK_STATUS_RECEIVED:
                    sub.ready = True
                if req.status == pb.ACK_STATUS_FAILED and req.epoch == self._epoch and self._group is not None \
                        and sub in self._members:
                    # A member gave up on this epoch: fail the transfer now, not at the deadline.
                    self._group.abort(f"{req.replica_id} failed: {req.message or 'no reason given'}")
            self._lock.notify_all()
        if self._metrics is not None and req.status == pb.ACK_STATUS_LOADED:
            self._metrics.served(req.replica_id, req.policy_version)
        return True

    def _status(self) -> pb.StatusReply:
        with self._lock:
            r = self.rollout
            gate = dict(rollout_mode=r.cfg.mode, promoted_version=r.promoted if r.canary_mode else self._latest,
                        candidate_version=-1 if r.candidate is None else r.candidate, paused=r.paused,
                        events=[pb.RolloutEvent(ts=e.ts, policy_version=e.version, kind=e.kind, reason=e.reason,
                                                measurements=e.measurements) for e in r.events])
        return pb.StatusReply(session=self.session, latest_version=self._latest, snapshot_version=self.snapshot_version,
                              epoch=self._epoch, replicas=list(self.replicas().values()), **gate)


def _to_arena(b: Bucket, arena: SnapshotArena) -> Bucket:
    """A copy of device bucket ``b`` in the (CPU) arena."""
    buf = arena.buffer(b.index, b.nbytes)[: b.nbytes]
    buf.copy_(b.buffer)  # type: ignore[arg-type]
    return Bucket(index=b.index, nbytes=b.nbytes, specs=b.specs, buffer=buf)
