"""Trainer side of the weight channel: ``WeightPublisher``.

Only trainer rank 0 creates one. It serves the gRPC ``WeightService`` (control plane),
hosts the TCPStore rendezvous of the data groups, and ``publish(version, named_tensors)``
goes through four steps, each readable on its own:

1. **plan** (``_plan``): how the tensors are packed into buckets -- into the snapshot arena
   or rotating device buffers, zero copy for big borrowed tensors, cast to the wire dtype;
2. **route** (:class:`~trainer_svc.weights.promotion.Promotion`, and
   :meth:`~trainer_svc.weights.membership.Membership.ensure_group`): who the version goes
   to, and the data group of those ready, connected replicas (a new membership epoch when
   the membership changed or the last transfer failed; deadline ``transfer_timeout_s``);
3. **broadcast** (:class:`~trainer_svc.weights.broadcast.Broadcast`): BEGIN, then per
   bucket its plan (BUCKET) and its bytes, packing bucket k+1 while bucket k is on the
   wire; every wait has the deadline;
4. **acknowledge** (``Broadcast.acknowledge``, ``_commit``): END, every member's RECEIVED
   (deadline), then the version is recorded, its snapshot committed and the report made.

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

import itertools
import logging
import secrets
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import torch

from services import auth
from services.config.weights import WeightChannelConfig
from services.pb import weights_pb2 as pb
from services.pb import weights_pb2_grpc as pb_grpc
from services.weights.errors import PlanError, SnapshotError, TransferError, VersionError
from services.weights.group import connect_store, device_for, resolve_backend
from services.weights.messages import SERVER_OPTIONS
from services.weights.plan import Bucket, iter_buckets
from services.weights.report import PublishReport
from trainer_svc.weights.arena import RotatingBuffers, SnapshotArena
from trainer_svc.weights.broadcast import Broadcast, wire_dtype_for
from trainer_svc.weights.faults import CandidateFault
from trainer_svc.weights.grpc_servicer import WeightServicer
from trainer_svc.weights.membership import ACK_GRACE_S, Membership, Subscriber
from trainer_svc.weights.metrics import PublisherMetrics
from trainer_svc.weights.promotion import Promotion
from trainer_svc.weights.rollout_state import RolloutState

__all__ = ["ACK_GRACE_S", "WeightPublisher"]

log = logging.getLogger(__name__)


class WeightPublisher:
    """Publishes policy versions to every subscribed rollout replica (see module docstring)."""

    def __init__(self, cfg: WeightChannelConfig, registry=None, credential: auth.JobCredential | None = None):
        self.cfg = cfg
        self.credential = auth.resolve(credential)  # every gRPC call must carry it
        self.session = secrets.randbits(63) | 1
        self.backend = resolve_backend(cfg.backend)
        self.device = device_for(self.backend)
        self._publish_lock = threading.Lock()
        self._latest = -1
        self._arena = SnapshotArena() if cfg.snapshot else None
        self._rotating = RotatingBuffers(self.device, slots=cfg.pipeline_depth + 1)
        self._server: grpc.Server | None = None
        self.control_port = 0
        self.rendezvous_port = 0
        self._metrics = PublisherMetrics(registry) if registry is not None else None
        self.rollout = RolloutState(cfg.rollout)
        """Canary gate bookkeeping (``weights.rollout``); read it under ``self.membership.lock``."""
        self.membership = Membership(cfg, self.session, self.backend, self.rollout)
        self._lock = self.membership.lock
        self.promotion = Promotion(self.rollout, self.membership, self._arena, self._publish_lock, self._metrics)
        self._fault = CandidateFault.from_env()  # tests only (trainer_svc/weights/faults.py)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "WeightPublisher":
        """Bind the gRPC server and the rendezvous store."""
        cfg = self.cfg
        store = connect_store(cfg.host, cfg.rendezvous_port, cfg.transfer_timeout_s, is_master=True)
        self.membership.store = store
        self.rendezvous_port = self.membership.rendezvous_port = store.port
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
        if not self.membership.close():
            return
        if self._arena is not None and self.cfg.snapshot_dir and self.snapshot_version >= 0:
            path = Path(self.cfg.snapshot_dir) / f"weights-v{self.snapshot_version}.safetensors"
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self.save_snapshot(path)
            except (OSError, SnapshotError) as e:
                log.error("persisting the last snapshot to %s failed: %s", path, e)
        self.membership.retire_group()
        if self._server is not None:
            self._server.stop(grace=1.0).wait(5.0)
        self.membership.release_retired()

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
            if self.membership.closed or self._server is None:
                raise TransferError("publisher is not started (or closed)")
            if version <= self._latest:
                raise VersionError(f"policy version must go forward: got {version} after {self._latest}")
            t0 = time.monotonic()
            named_tensors = _non_empty(version, named_tensors)
            route = self.promotion.route(promote)  # route: who it goes to
            if route == "held_back":
                return self._hold_back(version, named_tensors, t0)
            if self._fault is not None:
                named_tensors = self._fault.wrap(route, version, named_tensors)
            if route == "canaries":
                self.promotion.begin_candidate(version)
            transfer = Broadcast(self.membership, version, error=self.membership.ensure_group(route))
            transfer.begin()
            try:  # plan and broadcast, bucket by bucket
                buckets, kept = self._plan(named_tensors, transfer.members if transfer.group is not None else [], borrow)
                for bucket in buckets:
                    transfer.send(bucket)
                transfer.flush()
            except Exception as e:  # PlanError, or the trainer's iterator raised: abort, then re-raise
                if route == "canaries":  # not published: no candidate after all
                    self.promotion.drop_candidate()
                transfer.abort(e)
                raise
            delivered, failed = transfer.acknowledge()
            return self._commit(transfer, route, kept, delivered, failed, t0)

    def _plan(self, named_tensors: Iterable[tuple[str, torch.Tensor]], members: list[Subscriber],
              borrow: bool) -> tuple[Iterator[Bucket], list[Bucket]]:
        """The *plan* step: the lazy bucket iterator, and the list it fills with what the
        snapshot keeps of each bucket once the caller moved on to the next.

        On CPU the arena's buffers are the broadcast source (kept as they are); on a device
        the buckets are packed into rotating device buffers and copied into the arena. Big
        tensors go zero copy when nothing needs a private copy of them (no snapshot, or a
        borrowed tensor the arena may keep by reference). Wider floating-point tensors are
        cast to the dtype every member serves (``weights.wire_dtype``)."""
        arena = self._arena
        direct = arena is not None and self.device.type == "cpu"  # the arena is the broadcast source
        if arena is not None:
            arena.begin_write()
        alloc = arena.buffer if direct else self._rotating.buffer  # type: ignore[union-attr]
        zero_copy = arena is None or (borrow and direct)
        zc_min = max(1, int(self.cfg.zero_copy_min_mb * (1 << 20))) if zero_copy else None
        buckets = iter_buckets(named_tensors, self.cfg.bucket_bytes, self.device, alloc, zc_min,
                               wire_dtype_for(self.cfg, members))
        kept: list[Bucket] = []

        def planned() -> Iterator[Bucket]:
            for bucket in buckets:
                yield bucket
                if arena is not None:
                    kept.append(bucket if direct else _to_arena(bucket, arena))  # borrowed: by reference

        return planned(), kept

    def _commit(self, t: Broadcast, route: str, kept: list[Bucket], delivered: list[str], failed: list[str],
                t0: float) -> PublishReport:
        """The version is published (whether or not the transfer failed): record it, commit
        its snapshot, tell the gate where it went, report."""
        self._latest = t.version
        if self._arena is not None:
            self._arena.commit(t.version, kept)
        self.promotion.routed(t.version, route, (s for s in t.members if s.replica_id in delivered))
        report = PublishReport(t.version, t.epoch, t.num_buckets, t.num_tensors, t.tensor_bytes,
                               time.monotonic() - t0, delivered, failed, t.error, route)
        if self._metrics is not None:
            self._metrics.published(report, self.rollout)
        if t.error:
            log.warning("weights v%d: transfer failed (%s); %d replica(s) left out", t.version, t.error, len(failed))
        return report

    def _hold_back(self, version: int, named_tensors: Iterable, t0: float) -> PublishReport:
        """Canary mode, a candidate under test: ``version`` goes to nobody (drained unused)."""
        nt = tb = 0
        for _, t in named_tensors:  # the other trainer ranks gather in lockstep
            nt, tb = nt + 1, tb + t.numel() * t.element_size()
        self._latest = version
        self.promotion.routed(version, "held_back")
        report = PublishReport(version, self.membership.epoch, 0, nt, tb, time.monotonic() - t0, route="held_back")
        if self._metrics is not None:
            self._metrics.published(report, self.rollout)
        return report

    # ------------------------------------------------------------------ the canary gate (see Promotion)
    def promote(self, version: int, measurements: dict[str, float] | None = None) -> None:
        """Canary mode: the candidate ``version`` passed; every replica is to serve it
        (those that did not receive it load its snapshot). ``VersionError`` if it is not
        the candidate."""
        self.promotion.promote(version, measurements)

    def reject(self, version: int, reason: str, measurements: dict[str, float] | None = None,
               pause: bool = False) -> None:
        """Canary mode: the candidate ``version`` failed; the canaries roll back to the
        promoted version (its snapshot). With ``pause`` no version is sent anywhere until
        ``resume()``."""
        self.promotion.reject(version, reason, measurements, pause)

    def resume(self, reason: str = "") -> None:
        """End a pause after a rejection (``VersionError`` when not paused)."""
        self.promotion.resume(reason)

    # ------------------------------------------------------------------ replicas & snapshots
    def replicas(self) -> dict[str, pb.ReplicaStatus]:
        """The connected replicas, by id."""
        with self._lock:
            return {
                s.replica_id: pb.ReplicaStatus(replica_id=s.replica_id, served_version=s.served_version,
                                               received_version=s.received_version, ready=s.ready,
                                               canary=self.rollout.is_canary(s.replica_id),
                                               target_version=s.told[0] if s.told else -1)
                for s in self.membership.subs.values()
                if s.connected
            }

    def wait_for_replicas(self, count: int, timeout: float, served_version: int | None = None) -> bool:
        """Wait until ``count`` replicas are connected (and serve >= ``served_version``)."""
        return self.membership.wait_for(count, timeout, served_version)

    @property
    def snapshot_version(self) -> int:
        """Version of the snapshot being served (-1 when none, or while a publish overwrites
        it); in canary mode the promoted version's."""
        if self.promotion.pinned is not None:
            return self.promotion.pinned.version
        return self._arena.version if self._arena is not None else -1

    def wait_for_snapshot(self, version: int, timeout: float) -> bool:
        """Wait until the snapshot of ``version`` (or newer) is served."""
        return self._arena is not None and self._arena.wait_for(version, timeout)

    def save_snapshot(self, path: str | Path) -> int:
        """Write the served snapshot (canary mode: the promoted version's) to ``path`` as a
        safetensors file; return its version."""
        if self._arena is None:
            raise SnapshotError("snapshots are turned off (weights.snapshot=false)")
        if self.promotion.pinned is not None:
            return self.promotion.pinned.save(Path(path))
        return self._arena.save(Path(path))

    def snapshot_for(self, replica_id: str, min_version: int, chunk_bytes: int):
        """The chunks ``FetchSnapshot`` streams to ``replica_id`` (``SnapshotError`` when none):
        the latest version, or in canary mode the version that replica is to serve."""
        return self.promotion.snapshot_for(replica_id, min_version, chunk_bytes)

    # ------------------------------------------------------------------ servicer hooks
    def _subscribe(self, replica_id: str, served_version: int, served_session: int = 0,
                   serve_dtype: str = "", promoted_only: bool = False) -> Subscriber:
        sub = self.membership.subscribe(replica_id, served_version, served_session, serve_dtype, promoted_only)
        self.promotion.sync_targets()  # (queued behind the WELCOME the servicer sends first)
        if self._metrics is not None:
            self._metrics.served(replica_id, sub.served_version)
        return sub

    def _unsubscribe(self, sub: Subscriber) -> None:
        self.membership.unsubscribe(sub)
        self.promotion.sync_targets()  # a canary's seat goes to another replica

    def _ack(self, req: pb.AckRequest) -> bool:
        known = self.membership.on_ack(req)
        if known and self._metrics is not None and req.status == pb.ACK_STATUS_LOADED:
            self._metrics.served(req.replica_id, req.policy_version)
        return known

    def _status(self) -> pb.StatusReply:
        with self._lock:
            r = self.rollout
            gate = dict(rollout_mode=r.cfg.mode, promoted_version=r.promoted if r.canary_mode else self._latest,
                        candidate_version=-1 if r.candidate is None else r.candidate, paused=r.paused,
                        events=[pb.RolloutEvent(ts=e.ts, policy_version=e.version, kind=e.kind, reason=e.reason,
                                                measurements=e.measurements) for e in r.events])
            epoch = self.membership.epoch
        return pb.StatusReply(session=self.session, latest_version=self._latest, snapshot_version=self.snapshot_version,
                              epoch=epoch, replicas=list(self.replicas().values()), **gate)


def _non_empty(version: int, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """``named_tensors`` as an iterator; ``PlanError`` when it yields nothing."""
    it = iter(named_tensors)
    first = next(it, None)
    if first is None:
        raise PlanError(f"publish({version}) got no tensors")
    return itertools.chain([first], it)


def _to_arena(b: Bucket, arena: SnapshotArena) -> Bucket:
    """A copy of device bucket ``b`` in the (CPU) arena."""
    buf = arena.buffer(b.index, b.nbytes)[: b.nbytes]
    buf.copy_(b.buffer)  # type: ignore[arg-type]
    return Bucket(index=b.index, nbytes=b.nbytes, specs=b.specs, buffer=buf)
