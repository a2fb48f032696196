"""The weight channel's shared half: what the trainer's publisher and the replicas'
receivers agree on (bucket plans, control messages, the data-plane group, snapshots,
errors). The two ends live with the processes that run them:
:mod:`trainer_svc.weights` (the publisher, its gRPC servicer, promotion) and
:mod:`rollout_svc.weights` (the receiver, the probe).

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

# Names are imported lazily (PEP 562) so config-only users do not pay for importing torch.
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
}


def __getattr__(name: str) -> object:
    if name not in _WHERE:
        raise AttributeError(f"module 'services.weights' has no attribute {name!r}")
    return getattr(importlib.import_module(f"services.weights.{_WHERE[name]}"), name)


if TYPE_CHECKING:
    from services.weights.errors import PlanError, SnapshotError, TransferError, VersionError, WeightChannelError
    from services.weights.plan import ALIGN, DTYPES, Bucket, TensorSpec, iter_buckets
    from services.weights.report import PublishReport

__all__ = [
    "ALIGN",
    "DTYPES",
    "Bucket",
    "PlanError",
    "PublishReport",
    "SnapshotError",
    "TensorSpec",
    "TransferError",
    "VersionError",
    "WeightChannelError",
    "iter_buckets",
]
