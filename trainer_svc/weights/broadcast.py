"""One version's transfer to the epoch's data group: the *broadcast* and *acknowledge*
steps of ``WeightPublisher.publish``.

:class:`Broadcast` announces BEGIN, then per bucket its plan (BUCKET) and posts its bytes
(one ``broadcast`` from rank 0), keeping up to ``pipeline_depth`` posts in flight while the
next bucket is packed; every wait has the deadline. A failure aborts the epoch (ABORT) and
leaves the survivors a grace to acknowledge it; the remaining buckets are still counted (the
trainer's iterator is drained in full, other ranks gather in lockstep). ``acknowledge()``
then sends END and waits for every member's RECEIVED.
"""

from __future__ import annotations

import collections
import time

import torch

from services.config.weights import WeightChannelConfig
from services.pb import weights_pb2 as pb
from services.weights.errors import TransferError
from services.weights.messages import bucket_to_pb, control
from services.weights.plan import DTYPES, Bucket
from trainer_svc.weights.membership import Membership, Subscriber

K = pb.ControlKind


def wire_dtype_for(cfg: WeightChannelConfig, members: list[Subscriber]) -> torch.dtype | None:
    """The dtype wider floating-point tensors are cast to for ``members`` (None: as they are)."""
    w = cfg.wire_dtype
    if w == "off":
        return None
    if w != "auto":
        return DTYPES[w]
    announced = {s.serve_dtype for s in members}
    if len(announced) == 1 and (d := announced.pop()):
        return DTYPES[d]
    return None


class Broadcast:
    """The transfer of ``version`` to the group ``membership`` formed (module docstring).

    ``error``: why the transfer failed (None while it goes well; the group's formation error
    when there is no group). Counts every bucket, sent or not.
    """

    def __init__(self, membership: Membership, version: int, error: str | None = None):
        self.m = membership
        self.cfg = membership.cfg
        self.version = version
        self.group = membership.group
        self.members = list(membership.members)
        self.epoch = membership.epoch
        self.join_failed = list(membership.join_failed)
        self.error = error
        self.grace_until = 0.0  # after a failure: how long survivors may take to acknowledge it
        self.num_buckets = self.num_tensors = self.tensor_bytes = 0
        self._inflight: collections.deque = collections.deque()  # (bucket index, PendingBroadcast)

    def _message(self, kind: int, **payload) -> pb.ControlMessage:
        return control(kind, self.m.session, self.epoch, self.version, **payload)

    def fail(self, reason: str, wait_started: float) -> None:
        """Abort the epoch; survivors may acknowledge until the failed step's deadline."""
        self.error = reason
        self.grace_until = self.m.ack_deadline(wait_started)
        self.m.fail_group(self.members, self.epoch, self.version, reason)

    def begin(self) -> None:
        """BEGIN to the members (they are busy until they acknowledge)."""
        if self.group is None:
            return
        with self.m.lock:
            for s in self.members:
                s.ready = False
        self.m.send(self.members, self._message(K.CONTROL_KIND_BEGIN, begin=pb.Begin(bucket_bytes=self.cfg.bucket_bytes)))

    def send(self, bucket: Bucket) -> None:
        """Count ``bucket``; while the transfer goes well, send its plan and post its bytes
        (first waiting for the oldest post when ``pipeline_depth`` are in flight)."""
        self.num_buckets += 1
        self.num_tensors += bucket.num_tensors
        self.tensor_bytes += sum(s.nbytes for s in bucket.specs)
        if self.group is None or self.error is not None:
            return
        self.m.send(self.members, self._message(K.CONTROL_KIND_BUCKET, bucket=bucket_to_pb(bucket)))
        started, index = time.monotonic(), bucket.index
        try:
            while len(self._inflight) >= self.cfg.pipeline_depth:  # earlier buckets went out while this one was packed
                index, oldest = self._inflight.popleft()
                started = time.monotonic()
                oldest.wait()
            started, index = time.monotonic(), bucket.index
            if bucket.nbytes:
                self._inflight.append((bucket.index, self.group.post(bucket.buffer)))
        except TransferError as e:
            self._inflight.clear()
            self.fail(f"bucket {index}: {e}", started)

    def flush(self) -> None:
        """Wait (deadline each) for the posts still in flight."""
        while self._inflight and self.error is None:
            index, oldest = self._inflight.popleft()
            started = time.monotonic()
            try:
                oldest.wait()
            except TransferError as e:
                self._inflight.clear()
                self.fail(f"bucket {index}: {e}", started)

    def abort(self, exc: BaseException) -> None:
        """The publisher failed (a bad tensor, the trainer's iterator raised): abort the
        epoch and let the survivors acknowledge it."""
        if self.group is None:
            return
        if self.error is None:
            self.fail(f"publisher error: {type(exc).__name__}: {exc}", time.monotonic())
        self.m.wait_acks(self.members, self.epoch, self.version, self.grace_until)

    def acknowledge(self) -> tuple[list[str], list[str]]:
        """END, then wait (deadline) for every member's RECEIVED; returns (delivered, failed).
        After a failure: let the survivors acknowledge the abort (so they are ready for the
        next epoch) within what is left of the failed step's deadline."""
        if self.group is None:
            return [], self.join_failed
        if self.error is not None:
            self.m.wait_acks(self.members, self.epoch, self.version, self.grace_until)
            return [], [s.replica_id for s in self.members]
        self.m.send(self.members, self._message(K.CONTROL_KIND_END, end=pb.End(
            num_buckets=self.num_buckets, num_tensors=self.num_tensors, tensor_bytes=self.tensor_bytes)))
        delivered, failed = self.m.wait_acks(self.members, self.epoch, self.version,
                                             time.monotonic() + self.cfg.transfer_timeout_s)
        if failed:
            self.error = f"no RECEIVED acknowledgement from {failed}"
            self.m.fail_group(self.members, self.epoch, self.version, self.error)
        return delivered, failed
