"""What the receiver hands its consumer: an :class:`Update` (one version arriving bucket by
bucket) through the :class:`Handoff` (the newest update nobody took, the fatal error,
"closed", the ``on_event`` notifications), shared by the control stream, the data plane and
the :class:`~rollout_svc.weights.receiver.WeightReceiver` facade."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator

import torch

from services.weights.errors import TransferError, VersionError, WeightChannelError
from services.weights.plan import Bucket, iter_tensors

log = logging.getLogger("rollout_svc.weights.receiver")
_END = object()


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

    # data plane side
    def _put(self, item: object) -> None:
        self._q.put(item, timeout=self._timeout_s)

    def _fail(self, reason: str) -> None:
        if self.error is None:
            self.error = reason
            try:
                self._q.put_nowait(TransferError(f"v{self.version} transfer failed: {reason}"))
            except queue.Full:  # the consumer stopped reading; it will time out
                pass


class Handoff:
    """Between the receiver's threads and its consumer: the newest update not yet handed
    out, the fatal error, whether the receiver is closed, and the ``on_event`` hints.

    ``cond`` guards ``pending`` and ``fatal`` (and the control stream's SERVE state, so a
    consumer never reads half of one message).
    """

    def __init__(self, replica_id: str, on_event: Callable[[str], None] | None = None):
        self.replica_id = replica_id
        self.cond = threading.Condition()
        self.closed = threading.Event()
        self.pending: Update | None = None
        self.fatal: WeightChannelError | None = None
        self.dropped_updates = 0
        self._on_event = on_event
        """Called (from the receiver's threads, must not block) with "update" when a version
        begins, "welcome" when a publisher (re)subscribed us, "serve" when the version to serve
        changed (canary mode), "fatal" on a fatal error."""

    def offer(self, update: Update) -> None:
        """A version began: it replaces any pending one nobody took (each is complete weights)."""
        with self.cond:
            if self.pending is not None:
                self.dropped_updates += 1
            self.pending = update
            self.cond.notify_all()
        self.event("update")

    def take(self, timeout: float | None) -> Update | None:
        """See ``WeightReceiver.wait_for_update``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while self.pending is None:
                if self.fatal is not None:
                    err = self.fatal
                    if isinstance(err, VersionError):  # reported once; the receiver goes on
                        self.fatal = None
                    raise err
                if self.closed.is_set():
                    raise WeightChannelError("receiver is closed")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self.cond.wait(left)
            update, self.pending = self.pending, None
            return update

    def peek(self) -> tuple[int, int] | None:
        """``(session, version)`` of the pending update (None when there is none)."""
        with self.cond:
            u = self.pending
        return None if u is None else (u.session, u.version)

    def set_fatal(self, err: WeightChannelError) -> None:
        with self.cond:
            if self.fatal is None:
                self.fatal = err
            self.cond.notify_all()
        self.event("fatal")

    def wake(self) -> None:
        """Wake every waiting consumer (the receiver closed)."""
        with self.cond:
            self.cond.notify_all()

    def event(self, kind: str) -> None:
        if self._on_event is not None:
            try:
                self._on_event(kind)
            except Exception:  # a notification is a hint; the consumer also polls
                log.debug("%s: on_event(%s) failed", self.replica_id, kind, exc_info=True)
