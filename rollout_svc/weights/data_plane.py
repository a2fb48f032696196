"""The receiver's data plane: the epoch's ``torch.distributed`` group and the buckets.

:class:`DataPlane` runs the *worker* thread, which acts on each control message in order
(the control stream's ``inbox``): JOIN forms the epoch's data group (one rendezvous store
client per publisher session), BEGIN starts an :class:`~rollout_svc.weights.update.Update`
and offers it to the consumer, each BUCKET is checked against the plans and received by
broadcast (deadline on every one) into a buffer of its own, END checks the totals, completes
the update and acknowledges RECEIVED. Up to ``pipeline_depth`` receives are posted at once.
A failure fails the current update (acknowledged FAILED), never the thread. WELCOME and
SERVE are the control stream's (``ControlStream.welcome`` / ``serve_told``); a new session
starts epochs and versions over here.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time

import torch

from services.config.weights import WeightChannelConfig
from services.net import local_address_towards
from services.pb import weights_pb2 as pb
from services.weights.errors import PlanError, TransferError, VersionError, WeightChannelError
from services.weights.group import DataGroup, GroupSpec, connect_store
from services.weights.messages import bucket_from_pb, check_control
from services.weights.plan import TensorAssembler

from rollout_svc.weights.control import ControlStream
from rollout_svc.weights.update import _END, Update

log = logging.getLogger("rollout_svc.weights.receiver")
K = pb.ControlKind
_STOP = object()


class DataPlane:
    """The data group, the buckets in flight and the worker thread (module docstring)."""

    def __init__(self, cfg: WeightChannelConfig, control: ControlStream):
        self.cfg = cfg
        self.control = control
        self.handoff = control.handoff
        self.replica_id = control.replica_id
        self.epoch = 0
        self.received_version = -1
        self._group: DataGroup | None = None
        self._store = None
        self._store_key: tuple[int, str, int] | None = None  # (session, host, port) of self._store
        self._current: Update | None = None
        self._next_bucket = 0
        self._totals = [0, 0]
        self._pieces = TensorAssembler()
        self._retired: list[DataGroup] = []  # closed groups, released in the background
        self._inflight: collections.deque = collections.deque()  # (Bucket, PendingBroadcast | None)
        self._pool: list[torch.Tensor] = []  # reuse_buffers: free bucket memory
        self._pool_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._thread = threading.Thread(target=self._work_loop, name=f"weights-worker-{self.replica_id}", daemon=True)
        self._thread.start()

    def abort_now(self, reason: str, msg: pb.ControlMessage | None = None) -> None:
        """Wake a blocked broadcast at once (the reader thread: ABORT ``msg`` of the current
        epoch, or the stream broke; ``close``)."""
        g = self._group
        if g is None:
            return
        if msg is not None and (msg.epoch != self.epoch or msg.session != self.control.session):
            return
        g.abort(reason)

    def stop(self) -> None:
        """Stop the worker thread (after the receiver was marked closed)."""
        self.abort_now("receiver closed")
        self.control.inbox.put(_STOP)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def release_retired(self) -> None:
        """Wait (up to the deadline) for the groups being destroyed: they must finish before
        the process may exit."""
        deadline = time.monotonic() + self.cfg.transfer_timeout_s
        for g in self._retired:
            g.join_release(max(0.0, deadline - time.monotonic()))
        self._retired = [g for g in self._retired if g.release_thread and g.release_thread.is_alive()]

    # ------------------------------------------------------------------ the worker thread
    def _work_loop(self) -> None:
        depth = self.cfg.pipeline_depth
        inbox = self.control.inbox
        while True:
            msg = None
            if self._inflight:
                # Post the next bucket's receive before waiting for the oldest one, when its
                # plan is already here; otherwise complete the oldest.
                if len(self._inflight) < depth:
                    try:
                        msg = inbox.get_nowait()
                    except queue.Empty:
                        pass
            else:
                msg = inbox.get()
            if msg is _STOP or self.handoff.closed.is_set():
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
                self.handoff.set_fatal(e)
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
                self.control.ack(pb.ACK_STATUS_FAILED, u.epoch, u.version, reason)

    def _handle(self, msg: pb.ControlMessage) -> None:
        kind = check_control(msg)
        if kind == "welcome":
            if msg.session != self.control.session:  # a (new) publisher: epochs and versions start over
                self.epoch = 0
                self.received_version = -1
                self._drop_group()
                self._drop_store()
                self._fail_current("publisher changed", ack=False)
            self.control.welcome(msg)
            return
        if msg.session != self.control.session:
            return  # left over from an earlier publisher
        if kind == "serve":  # of the session, not of an epoch: a promoted replica joins none
            self.control.serve_told(msg)
            return
        if kind == "join":
            if msg.epoch <= self.epoch:
                raise VersionError(f"JOIN of epoch {msg.epoch} after epoch {self.epoch}")
            self._fail_current(f"superseded by epoch {msg.epoch}")
            self._drop_group()
            self.epoch = msg.epoch
            self._join(msg)
            return
        if msg.epoch != self.epoch:
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

    # ------------------------------------------------------------------ the group
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
            self.control.ack(pb.ACK_STATUS_FAILED, msg.epoch, -1, str(e))

    # ------------------------------------------------------------------ a version's transfer
    def _begin(self, msg: pb.ControlMessage) -> None:
        self._fail_current("a new version began")
        # A version that was aborted may be published again; a received one may not.
        if msg.policy_version <= self.received_version:
            self.control.ack(pb.ACK_STATUS_FAILED, msg.epoch, msg.policy_version, "version went backwards")
            raise VersionError(f"publisher announced v{msg.policy_version} after v{self.received_version}")
        self.control.latest_version = max(self.control.latest_version, msg.policy_version)
        u = Update(msg.policy_version, msg.epoch, self.cfg.receive_ahead_buckets, self.cfg.transfer_timeout_s,
                   self._give_back if self.cfg.reuse_buffers else None, session=msg.session)
        self._next_bucket, self._totals = 0, [0, 0]
        self._pieces = TensorAssembler()  # checks the split tensors' plans as they arrive
        if self._group is None:
            u._fail("not part of the data group")
            self.control.ack(pb.ACK_STATUS_FAILED, msg.epoch, msg.policy_version, "not part of the data group")
            return
        self._current = u
        self.handoff.offer(u)

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
        self.control.ack(pb.ACK_STATUS_RECEIVED, u.epoch, u.version)  # before the consumer can finish and close
        u._put(_END)

    # ------------------------------------------------------------------ bucket memory
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
