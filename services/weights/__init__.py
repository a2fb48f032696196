"""The weight channel: the trainer publishes each policy version to every rollout replica.

Trainer rank 0::

    pub = WeightPublisher(cfg).start()
    report = pub.publish(version, ((name, p.full_tensor()) for name, p in params))  # lazy
    pub.close()

Replica::

    rx = WeightReceiver(cfg, "replica-0").connect()
    update = rx.wait_for_update(timeout=1.0)          # None when nothing new
    if update is not None:
        try:
            model.load_weights(update.tensors())       # (name, tensor) bucket by bucket
            rx.report_loaded(update.version)
        except TransferError:
            snap = rx.fetch_snapshot()                 # consistent weights after a failure
            ...

Control plane: gRPC ``WeightService`` (proto/weights.proto). Data plane: one
torch.distributed group per membership epoch (gloo on CPU, NCCL on GPU) built from a
TCPStore, a deadline on every collective. See docs/weights.md.
"""

from services.weights.errors import (
    PlanError,
    SnapshotError,
    TransferError,
    VersionError,
    WeightChannelError,
)
from services.weights.plan import ALIGN, DTYPES, Bucket, TensorSpec, iter_buckets
from services.weights.publisher import PublishReport, WeightPublisher
from services.weights.receiver import Snapshot, Update, WeightReceiver

__all__ = [
    "ALIGN",
    "DTYPES",
    "Bucket",
    "PlanError",
    "PublishReport",
    "Snapshot",
    "SnapshotError",
    "TensorSpec",
    "TransferError",
    "Update",
    "VersionError",
    "WeightChannelError",
    "WeightPublisher",
    "WeightReceiver",
    "iter_buckets",
]
