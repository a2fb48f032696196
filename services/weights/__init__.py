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

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Names are imported lazily (PEP 562) so ``python -m services.weights.probe --help`` and
# config-only users do not pay for importing torch.
_WHERE = {
    "PlanError": "errors",
    "SnapshotError": "errors",
    "TransferError": "errors",
    "VersionError": "errors",
    "WeightChannelError": "errors",
    "ALIGN": "plan",
    "DTYPES": "plan",
    "Bucket": "plan",
    "TensorSpec": "plan",
    "iter_buckets": "plan",
    "PublishReport": "report",
    "WeightPublisher": "publisher",
    "Snapshot": "receiver",
    "Update": "receiver",
    "WeightReceiver": "receiver",
}


def __getattr__(name: str) -> object:
    if name not in _WHERE:
        raise AttributeError(f"module 'services.weights' has no attribute {name!r}")
    return getattr(importlib.import_module(f"services.weights.{_WHERE[name]}"), name)


if TYPE_CHECKING:
    from services.weights.errors import PlanError, SnapshotError, TransferError, VersionError, WeightChannelError
    from services.weights.plan import ALIGN, DTYPES, Bucket, TensorSpec, iter_buckets
    from services.weights.publisher import WeightPublisher
    from services.weights.receiver import Snapshot, Update, WeightReceiver
    from services.weights.report import PublishReport

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
