"""Replica side of the weight channel: ``WeightReceiver``.

A replica subscribes to the publisher's ``WeightService`` and keeps two threads:

* the *reader* follows the control stream (reconnecting for ``connect_timeout_s`` when it
  breaks) and aborts the current group at once on ABORT;
* the *worker* acts on each message in order: JOIN forms the epoch's data group, BEGIN
  starts an :class:`Update`, each BUCKET is received by broadcast (deadline on every one)
  into a fresh buffer and queued on the update, END completes it and acknowledges RECEIVED.

The consumer (the rollout loop) calls ``wait_for_update(timeout)`` and iterates
``update.tensors()`` while buckets arrive; when a transfer fails, iteration raises
``TransferError`` and the replica catches up with ``fetch_snapshot()`` (or the next
version). ``report_loaded(version)`` tells the publisher which version it serves.

With the canary gate (``weights.rollout.mode: canary``) the publisher also says which
version this replica is to serve and whether it is a canary (SERVE): ``target`` holds
it; the consumer loads that version (by broadcast, or from ``fetch_snapshot()``, which
then streams that version), going back to it after a rejected candidate.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import torch

from services import auth
from services.config.weights import WeightChannelConfig
from services.pb import weights_pb2 as pb
from services.pb import weights_pb2_grpc as pb_grpc
from services.weights.errors import (
    PlanError,
    SnapshotError,
    TransferError,
    VersionError,
    WeightChannelError,
)
from services.net import local_address_towards
from services.weights.group import DataGroup, GroupSpec, connect_store
from services.weights.messages import CLIENT_OPTIONS, bucket_from_pb, check_control, check_replica_id
from services.weights.plan import Bucket, TensorAssembler, iter_tensors
from services.weights.snapshot import parse_safetensors

log = logging.getLogger(__name__)
K = pb.ControlKind
_END = object()
_STOP = object()


class Update:
    """One policy version arriving bucket by bucket.

    ``tensors()`` yields ``(name, tensor)`` views into each received bucket (valid as long as
    the caller keeps them); it blocks until the next bucket arrives and raises
    ``TransferError`` if the transfer failed. It can be iterated once.
    """

    def __init__(self, version: int, epoch: int, max_ahead: int, timeout_s: float,
                 release: Callable[[torch.Tensor], None] | None = None, session: int = 0):
        self.version = version
        self.epoch = epoch
        self.session = session
        """The publisher session this version belongs to (see ``WeightReceiver.session``)."""
        self._q: queue.Queue = queue.Queue(maxsize=max_ahead)
        self._timeout_s = timeout_s
        self._release = release
        self._consumed = False
        self.error: str | None = None
        self.began_at = time.monotonic()
        """When BEGIN arrived (``time.monotonic()`` of the receiving process)."""
        self.received_at: float | None = None
        """When END arrived: every bucket received (None before)."""

    def buckets(self) -> Iterator[Bucket]:
        """Yield the received buckets in order (each with its ``buffer``)."""
        if self._consumed:
            raise WeightChannelError(f"update v{self.version} was already iterated")
        self._consumed = True
        while True:
            try:
                item = self._q.get(timeout=self._timeout_s)
            except queue.Empty:
                raise TransferError(f"v{self.version}: no bucket within {self._timeout_s:g}s") from None
            if item is _END:
                return
            if isinstance(item, Exception):
                raise item
            yield item
            if self._release is not None and item.buffer is not None:  # reuse_buffers: the consumer moved on
                self._release(item.buffer)
                item.buffer = None

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(name, tensor)`` of every bucket, in the publisher's order (whole tensors are
        views of their bucket; a split tensor is reassembled in a buffer of its own)."""
        return iter_tensors(self.buckets())

    def drain(self) -> None:
        """Take the rest of this version without using it, until its end, a failure or the
        deadline (a replica that refused a version lets it finish arriving, so the transfer
        does not fail for the other replicas)."""
        self._consumed = True
        while True:
            try:
                item = self._q.get(timeout=self._timeout_s)
            except queue.Empty:
                return
            if item is _END or isinstance(item, Exception):
                return
            if self._release is not None and item.buffer is not None:
                self._release(item.buffer)

    # worker side
    def _put(self, item: object) -> None:
        self._q.put(item, timeout=self._timeout_s)

    def _fail(self, reason: str) -> None:
        if self.error is None:
            self.error = reason
            try:
                self._q.put_nowait(TransferError(f"v{self.version} transfer failed: {reason}"))
            except queue.Full:  # the consumer stopped reading; it will time out
                pass


@dataclass
class Snapshot:
    """A fetched snapshot: ``version`` and its tensors (views of one received buffer)."""

    version: int
    named_tensors: list[tuple[str, torch.Tensor]]

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.named_tensors)


class WeightReceiver:
    """Receives policy versions for one replica (see module docstring)."""

    def __init__(self, cfg: WeightChannelConfig, replica_id: str, address: str | None = None, served_version: int = -1,
                 served_session: int = 0, credential: auth.JobCredential | None = None,
                 on_event: Callable[[str], None] | None = None, serve_dtype: str = "", promoted_only: bool = False):
        self.cfg = cfg
        self.credential = auth.resolve(credential)  # every call to the publisher carries it
        self.serve_dtype = serve_dtype
        """Announced to the publisher: the dtype this replica serves (see weights.wire_dtype)."""
        self.promoted_only = promoted_only
        """Announced to the publisher: never a canary, only promoted versions (the live-policy endpoint)."""
        self.serve: tuple[int, bool, bool] | None = None
        """Canary mode: ``(version to serve, is a canary, from_snapshot)`` as the publisher of
        this session last said (SERVE), replaced whole so a reader never mixes two messages;
        ``from_snapshot``: the version's broadcast is over without this replica, load it from
        the snapshot instead of waiting for it. None in mode all or before it said anything."""
        self._told_back: set[int] = set()
        """Canary mode: versions this session's publisher named (SERVE) below the one served --
        rollbacks. Loading one may take longer than the publisher takes to name the next
        candidate, so the report is checked against every rollback named, not only the last."""
        self._on_event = on_event
        """Called (from the receiver's threads, must not block) with "update" when a version
        begins, "welcome" when a publisher (re)subscribed us, "serve" when the version to serve
        changed (canary mode), "fatal" on a fatal error."""
        self.replica_id = check_replica_id(replica_id)
        self.address = address or f"{cfg.host}:{cfg.control_port}"
        self._served = served_version
        self._served_session = served_session
        self._cond = threading.Condition()
        self._msgs: queue.Queue = queue.Queue()
        self._pending: Update | None = None
        self._current: Update | None = None
        self._fatal: WeightChannelError | None = None
        self._closed = threading.Event()
        self._welcomed = threading.Event()
        self._channel: grpc.Channel | None = None
        self._stub: pb_grpc.WeightServiceStub | None = None
        self._call = None
        self._session = 0
        self._epoch = 0
        self._group: DataGroup | None = None
        self._store = None
        self._store_key: tuple[int, str, int] | None = None  # (session, host, port) of self._store
        self._next_bucket = 0
        self._totals = [0, 0]
        self._pieces = TensorAssembler()
        self.latest_version = -1
        self.snapshot_version = -1
        self.received_version = -1
        self.dropped_updates = 0
        self._threads: list[threading.Thread] = []
        self._retired: list[DataGroup] = []  # closed groups, released in the background
        self._inflight: collections.deque = collections.deque()  # (Bucket, PendingBroadcast | None)
        self._pool: list[torch.Tensor] = []  # reuse_buffers: free bucket memory
        self._pool_lock = threading.Lock()
        self._acks: queue.Queue = queue.Queue()  # report_loaded(wait=False): LOADED acks to send
        self._ack_thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def connect(self, timeout: float | None = None) -> "WeightReceiver":
        """Subscribe; returns once the publisher's WELCOME arrived (``TransferError`` otherwise)."""
        timeout = self.cfg.connect_timeout_s if timeout is None else timeout
        self._channel = auth.channel(self.address, self.credential, options=CLIENT_OPTIONS)
        self._stub = pb_grpc.WeightServiceStub(self._channel)
        for target, name in ((self._read_loop, "reader"), (self._work_loop, "worker")):
            t = threading.Thread(target=target, name=f"weights-{name}-{self.replica_id}", daemon=True)
            t.start()
            self._threads.append(t)
        if not self._welcomed.wait(timeout):
            self.close()
            raise TransferError(f"no WELCOME from the weight publisher at {self.address} within {timeout:g}s")
        return self

    def close(self) -> None:
        """Unsubscribe and stop both threads."""
        self._closed.set()
        if self._call is not None:
            self._call.cancel()
        if self._group is not None:
            self._group.abort("receiver closed")
        self._msgs.put(_STOP)
        if self._ack_thread is not None:
            self._acks.put(_STOP)
            self._ack_thread.join(timeout=5.0)
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=5.0)
        deadline = time.monotonic() + self.cfg.transfer_timeout_s
        for g in self._retired:  # groups being destroyed must finish before the process may exit
            g.join_release(max(0.0, deadline - time.monotonic()))
        self._retired = [g for g in self._retired if g.release_thread and g.release_thread.is_alive()]
        if self._channel is not None:
            self._channel.close()
        with self._cond:
            self._cond.notify_all()

    def __enter__(self) -> "WeightReceiver":
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ consumer API
    @property
    def served_version(self) -> int:
        return self._served

    @property
    def session(self) -> int:
        """The connected publisher's session (0 before its WELCOME). A publisher picks a new
        one each time it starts; version numbers are only ordered within one session."""
        return self._session

    @property
    def served_session(self) -> int:
        """Session the served version came from (0: unknown, e.g. the initial weights)."""
        return self._served_session

    def wait_for_update(self, timeout: float | None) -> Update | None:
        """The newest update not yet handed out, waiting up to ``timeout`` s (None = forever).

        Older updates nobody took are dropped (each version is complete weights). Raises the
        receiver's fatal error (e.g. ``VersionError``, a lost publisher) once it has one.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._pending is None:
                if self._fatal is not None:
                    err = self._fatal
                    if isinstance(err, VersionError):  # reported once; the receiver goes on
                        self._fatal = None
                    raise err
                if self._closed.is_set():
                    raise WeightChannelError("receiver is closed")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)
            update, self._pending = self._pending, None
            return update

    def peek_update(self) -> tuple[int, int] | None:
        """``(session, version)`` of the update ``wait_for_update`` would hand out now, without
        taking it (None when there is none)."""
        with self._cond:
            u = self._pending
        return None if u is None else (u.session, u.version)

    def report_loaded(self, version: int, wait: bool = True) -> None:
        """Tell the publisher this replica now serves ``version`` of its session.

        Within one session versions never go backwards; a version of a new session may be
        lower than one served from an earlier session (a trainer resumed from a checkpoint).
        The check is done here; with ``wait=False`` the ``Ack`` RPC is sent by a background
        thread (in order, one at a time), so the caller -- the vLLM worker, which the engine
        waits for -- does not wait for the publisher's answer."""
        with self._cond:  # SERVE messages update target and _told_back under it
            same_line = self._served_session in (0, self._session)
            told_back = version in self._told_back or (self.serve is not None and self.serve[0] == version)
            if version < self._served and same_line and not told_back:
                raise VersionError(f"report_loaded({version}) after already serving v{self._served}")
            self._served, self._served_session = version, self._session
            self._told_back = {v for v in self._told_back if v > version}
        if wait:
            self._ack(pb.ACK_STATUS_LOADED, 0, version)
            return
        with self._pool_lock:
            if self._ack_thread is None:
                self._ack_thread = threading.Thread(target=self._ack_loop, name=f"weights-ack-{self.replica_id}",
                                                    daemon=True)
                self._ack_thread.start()
        self._acks.put(version)

    def _ack_loop(self) -> None:
        while True:
            version = self._acks.get()
            if version is _STOP:
                return
            self._ack(pb.ACK_STATUS_LOADED, 0, version)

    def publisher_status(self, timeout: float | None = None) -> pb.StatusReply:
        """The publisher's ``Status`` (latest and snapshot versions, replicas); ``TransferError``
        when it cannot be reached."""
        if self._stub is None:
            raise WeightChannelError("connect() first")
        try:
            return self._stub.Status(pb.StatusRequest(), timeout=self.cfg.connect_timeout_s if timeout is None else timeout)
        except grpc.RpcError as e:
            raise TransferError(f"Status of the weight publisher failed: {e.code().name}") from e

    def fetch_snapshot(self, min_version: int = -1, timeout: float | None = None) -> Snapshot | None:
        """Download the publisher's latest snapshot (None when it has none >= ``min_version``).

        Raises ``SnapshotError`` for a broken stream or invalid bytes.
        """
        if self._stub is None:
            raise WeightChannelError("connect() first")
        timeout = self.cfg.transfer_timeout_s if timeout is None else timeout
        req = pb.SnapshotRequest(replica_id=self.replica_id, min_version=min_version)
        buf: bytearray | None = None
        version = total = pos = -1
        try:
            for chunk in self._stub.FetchSnapshot(req, timeout=timeout):
                if buf is None:
                    version, total, pos = chunk.policy_version, chunk.total_bytes, 0
                    buf = bytearray(total)
                if chunk.policy_version != version or chunk.total_bytes != total or chunk.offset != pos:
                    raise SnapshotError(f"snapshot chunk out of order: v{chunk.policy_version} at {chunk.offset}, "
                                        f"expected v{version} at {pos} of {total}")
                end = pos + len(chunk.data)
                if end > total or not chunk.data:
                    raise SnapshotError(f"snapshot chunk at {pos} with {len(chunk.data)} bytes overruns {total}")
                buf[pos:end] = chunk.data
                pos = end
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise SnapshotError(f"fetching the snapshot failed: {e.code().name}: {e.details()}") from e
        if buf is None or pos != total:
            raise SnapshotError(f"snapshot stream ended at {pos} of {total} bytes")
        file_version, tensors = parse_safetensors(buf)
        if file_version is not None and file_version != version:
            raise SnapshotError(f"snapshot file says v{file_version}, the stream said v{version}")
        return Snapshot(version, tensors)

    # ------------------------------------------------------------------ threads
    def _ack(self, status: int, epoch: int, version: int, message: str = "") -> None:
        if self._stub is None or self._closed.is_set():
            return
        req = pb.AckRequest(replica_id=self.replica_id, session=self._session if status != pb.ACK_STATUS_LOADED else 0,
                            epoch=epoch, policy_version=version, status=status, message=message[:2000])
        try:
            self._stub.Ack(req, timeout=self.cfg.transfer_timeout_s)
        except grpc.RpcError as e:
            log.warning("%s: Ack(%s v%d) failed: %s", self.replica_id, pb.AckStatus.Name(status), version, e.code())

    def _set_fatal(self, err: WeightChannelError) -> None:
        with self._cond:
            if self._fatal is None:
                self._fatal = err
            self._cond.notify_all()
        self._event("fatal")

    def _event(self, kind: str) -> None:
        if self._on_event is not None:
            try:
                self._on_event(kind)
            except Exception:  # a notification is a hint; the consumer also polls
                log.debug("%s: on_event(%s) failed", self.replica_id, kind, exc_info=True)

    def _read_loop(self) -> None:
        broken_since: float | None = None
        while not self._closed.is_set():
            req = pb.SubscribeRequest(replica_id=self.replica_id, served_version=self._served,
                                      served_session=self._served_session, serve_dtype=self.serve_dtype,
                                      promoted_only=self.promoted_only)
            try:
                self._call = self._stub.Subscribe(req)  # type: ignore[union-attr]
                for msg in self._call:
                    broken_since = None
                    if msg.kind == K.CONTROL_KIND_ABORT and self._group is not None and msg.epoch == self._epoch \
                            and msg.session == self._session:
                        self._group.abort(msg.abort.reason or "aborted by the publisher")
                    self._msgs.put(msg)
            except grpc.RpcError as e:
                if self._closed.is_set():
                    return
                if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    self._set_fatal(WeightChannelError(f"publisher refused the subscription: {e.details()}"))
                    return
            if self._closed.is_set():
                return
            # The stream broke: the publisher restarted or the network failed. Drop the group.
            if self._group is not None:
                self._group.abort("control stream lost")
            broken_since = broken_since or time.monotonic()
            if time.monotonic() - broken_since > self.cfg.connect_timeout_s:
                self._set_fatal(TransferError(f"lost the weight publisher at {self.address} for "
                                              f"{self.cfg.connect_timeout_s:g}s"))
                return
            self._closed.wait(0.5)

    def _work_loop(self) -> None:
        depth = self.cfg.pipeline_depth
        while True:
            msg = None
            if self._inflight:
                # Post the next bucket's receive before waiting for the oldest one, when its
                # plan is already here; otherwise complete the oldest.
                if len(self._inflight) < depth:
                    try:
                        msg = self._msgs.get_nowait()
                    except queue.Empty:
                        pass
            else:
                msg = self._msgs.get()
            if msg is _STOP or self._closed.is_set():
                break
            if msg is None:
                self._guarded(self._complete_oldest)
                continue
            if msg.kind != K.CONTROL_KIND_BUCKET:
                while self._inflight:  # every other message comes after the buckets
                    self._guarded(self._complete_oldest)
            self._guarded(self._handle, msg)
        self._drop_group()
        self._fail_current("receiver closed")

    def _guarded(self, fn, *args) -> None:  # noqa: ANN001
        """Run a worker step; a failure fails the current update (and is reported), never the loop."""
        try:
            fn(*args)
        except WeightChannelError as e:
            log.error("%s: %s", self.replica_id, e)
            if isinstance(e, VersionError):
                self._set_fatal(e)
            self._fail_current(str(e))
        except Exception as e:  # e.g. out of memory allocating a bucket: this version fails, the loop lives
            log.exception("%s: unexpected error in the weight receiver", self.replica_id)
            self._fail_current(f"{type(e).__name__}: {e}")

    def _fail_current(self, reason: str, ack: bool = True) -> None:
        self._inflight.clear()
        u, self._current = self._current, None
        if u is not None:
            u._fail(reason)
            if ack:
                self._ack(pb.ACK_STATUS_FAILED, u.epoch, u.version, reason)

    @property
    def target(self) -> tuple[int, bool] | None:
        """Canary mode: ``(version to serve, is a canary)`` of the last SERVE (see ``serve``)."""
        serve = self.serve
        return None if serve is None else serve[:2]

    @property
    def target_from_snapshot(self) -> bool:
        serve = self.serve
        return serve is not None and serve[2]

    def _handle(self, msg: pb.ControlMessage) -> None:
        kind = check_control(msg)
        if kind == "welcome":
            if msg.session != self._session:  # a (new) publisher: epochs and versions start over
                self._session, self._epoch = msg.session, 0
                self.received_version = -1
                self.serve = None
                self._told_back.clear()
                self._drop_group()
                self._drop_store()
                self._fail_current("publisher changed", ack=False)
            self.latest_version = msg.welcome.latest_version
            self.snapshot_version = msg.welcome.snapshot_version
            self._welcomed.set()
            self._event("welcome")
            return
        if msg.session != self._session:
            return  # left over from an earlier publisher
        if kind == "serve":  # of the session, not of an epoch: a promoted replica joins none
            with self._cond:
                self.serve = (msg.policy_version, msg.serve.canary, msg.serve.from_snapshot)
                if msg.policy_version < self._served:
                    self._told_back.add(msg.policy_version)
                self._cond.notify_all()
            self._event("serve")
            return
        if kind == "join":
            if msg.epoch <= self._epoch:
                raise VersionError(f"JOIN of epoch {msg.epoch} after epoch {self._epoch}")
            self._fail_current(f"superseded by epoch {msg.epoch}")
            self._drop_group()
            self._epoch = msg.epoch
            self._join(msg)
            return
        if msg.epoch != self._epoch:
            return  # an old epoch's message
        if kind == "abort":
            self._fail_current(msg.abort.reason or "aborted by the publisher")
            self._drop_group()
            return
        if kind == "begin":
            self._begin(msg)
        elif kind == "bucket":
            self._bucket(msg)
        elif kind == "end":
            self._end(msg)

    def _drop_group(self) -> None:
        if self._group is not None:
            self._group.close()
            self._retired.append(self._group)
            self._group = None

    def _drop_store(self) -> None:
        """Forget the rendezvous store client (the next JOIN connects a new one)."""
        self._store, self._store_key = None, None

    def _join(self, msg: pb.ControlMessage) -> None:
        j = msg.join
        spec = GroupSpec(j.store_host, j.store_port, j.store_prefix, j.rank, j.world_size, j.backend, j.timeout_s,
                         gloo_devices=max(1, j.gloo_devices))
        # One store client serves every epoch of one publisher session, never the next one: a
        # restarted trainer binds the same rendezvous port again, and the old client's socket
        # still leads to the dead store (every group would then fail to form, "Broken pipe").
        key = (msg.session, j.store_host, j.store_port)
        try:
            if self._store_key != key:
                self._drop_store()
                self._store = connect_store(j.store_host, j.store_port, j.timeout_s)
                self._store_key = key
            # gloo listens on this machine's address towards the publisher, never on every address
            self._group = DataGroup(spec, self._store, self.cfg.gloo_interface, self.cfg.gloo_threads,
                                    gloo_address=local_address_towards(j.store_host, j.store_port))
        except TransferError as e:
            self._group = None
            self._drop_store()  # it may be what broke: the next epoch connects afresh
            self._ack(pb.ACK_STATUS_FAILED, msg.epoch, -1, str(e))

    def _begin(self, msg: pb.ControlMessage) -> None:
        self._fail_current("a new version began")
        # A version that was aborted may be published again; a received one may not.
        if msg.policy_version <= self.received_version:
            self._ack(pb.ACK_STATUS_FAILED, msg.epoch, msg.policy_version, "version went backwards")
            raise VersionError(f"publisher announced v{msg.policy_version} after v{self.received_version}")
        self.latest_version = max(self.latest_version, msg.policy_version)
        u = Update(msg.policy_version, msg.epoch, self.cfg.receive_ahead_buckets, self.cfg.transfer_timeout_s,
                   self._give_back if self.cfg.reuse_buffers else None, session=msg.session)
        self._next_bucket, self._totals = 0, [0, 0]
        self._pieces = TensorAssembler()  # checks the split tensors' plans as they arrive
        if self._group is None:
            u._fail("not part of the data group")
            self._ack(pb.ACK_STATUS_FAILED, msg.epoch, msg.policy_version, "not part of the data group")
            return
        self._current = u
        with self._cond:
            if self._pending is not None:
                self.dropped_updates += 1
            self._pending = u
            self._cond.notify_all()
        self._event("update")

    def _bucket(self, msg: pb.ControlMessage) -> None:
        u = self._current
        if u is None or u.version != msg.policy_version or self._group is None:
            return  # this version already failed here
        if msg.bucket.index != self._next_bucket:
            raise PlanError(f"v{u.version}: bucket {msg.bucket.index} arrived, expected {self._next_bucket}")
        bucket = bucket_from_pb(msg.bucket)
        for spec in bucket.specs:
            self._pieces.advance(spec)
        bucket.buffer = self._take(bucket.nbytes, self._group.device)
        pending = self._group.post(bucket.buffer) if bucket.nbytes else None  # TransferError -> fail
        self._inflight.append((bucket, pending))
        self._next_bucket += 1
        self._totals[0] += bucket.num_tensors
        self._totals[1] += sum(s.nbytes for s in bucket.specs)

    def _complete_oldest(self) -> None:
        """Wait (deadline) for the oldest posted bucket and hand it to the update."""
        bucket, pending = self._inflight.popleft()
        if pending is not None:
            pending.wait()
        u = self._current
        if u is None:
            return
        try:
            u._put(bucket)
        except queue.Full:
            raise TransferError(f"the consumer did not take bucket {bucket.index} within "
                                f"{self.cfg.transfer_timeout_s:g}s") from None

    def _take(self, nbytes: int, device: torch.device) -> torch.Tensor:
        """A buffer of exactly ``nbytes`` (from the pool when reuse_buffers is on)."""
        if self.cfg.reuse_buffers:
            with self._pool_lock:
                fits = [b for b in self._pool if b.numel() >= nbytes and b.device == device]
                if fits:
                    best = min(fits, key=lambda b: b.numel())
                    self._pool.remove(best)
                    return best[:nbytes]
        return torch.empty(nbytes, dtype=torch.uint8, device=device)

    def _give_back(self, buf: torch.Tensor) -> None:
        base = buf._base if buf._base is not None else buf
        with self._pool_lock:
            self._pool.append(base)

    def _end(self, msg: pb.ControlMessage) -> None:
        u = self._current
        if u is None or u.version != msg.policy_version:
            return
        e = msg.end
        self._pieces.close()
        if (e.num_buckets, e.num_tensors, e.tensor_bytes) != (self._next_bucket, *self._totals):
            raise PlanError(f"v{u.version}: END says {e.num_buckets} buckets / {e.num_tensors} tensors / "
                            f"{e.tensor_bytes} bytes, received {self._next_bucket} / {self._totals[0]} / "
                            f"{self._totals[1]}")
        self._current = None
        u.received_at = time.monotonic()
        self.received_version = u.version
        self._ack(pb.ACK_STATUS_RECEIVED, u.epoch, u.version)  # before the consumer can finish and close
        u._put(_END)
