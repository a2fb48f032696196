"""Control-message helpers: build ``ControlMessage``s and validate received ones.

Every ``ControlMessage`` names its ``kind``; ``check_control`` rejects a message whose
payload does not match its kind (or that lacks a session), and converts bucket plans to
validated :class:`~services.weights.plan.Bucket` objects.
"""

from __future__ import annotations

from services.pb import weights_pb2 as pb
from services.weights.errors import PlanError, WeightChannelError
from services.weights.plan import Bucket, TensorSpec

K = pb.ControlKind
PAYLOAD_OF_KIND = {
    K.CONTROL_KIND_WELCOME: "welcome",
    K.CONTROL_KIND_JOIN: "join",
    K.CONTROL_KIND_BEGIN: "begin",
    K.CONTROL_KIND_BUCKET: "bucket",
    K.CONTROL_KIND_END: "end",
    K.CONTROL_KIND_ABORT: "abort",
    K.CONTROL_KIND_SERVE: "serve",
}
MAX_REPLICA_ID = 128
MAX_GLOO_DEVICES = 8
"""Most gloo devices a JOIN may ask for (each is a set of connections and a thread)."""
_MSG = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
SERVER_OPTIONS = _MSG + [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.so_reuseport", 0),  # a second publisher on the same port must fail, not share it
]
CLIENT_OPTIONS = _MSG + [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # a restarted trainer is back on the same address within seconds: try again that often,
    # not with gRPC's default backoff (it grows to two minutes while the publisher is down)
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]
"""Channel/server options: big enough for large bucket plans; keepalive both ways so a
dead peer's stream breaks within seconds instead of lingering; a receiver reconnects to a
publisher that came back within a second."""


def control(kind: int, session: int, epoch: int = 0, version: int = -1, **payload: object) -> pb.ControlMessage:
    """A ``ControlMessage`` of ``kind`` with its one payload (keyword = payload field name)."""
    return pb.ControlMessage(kind=kind, session=session, epoch=epoch, policy_version=version, **payload)


def bucket_to_pb(b: Bucket) -> pb.BucketPlan:
    """The plan (no bytes) of bucket ``b``."""
    return pb.BucketPlan(
        index=b.index,
        nbytes=b.nbytes,
        tensors=[
            pb.TensorSpec(name=s.name, dtype=s.dtype, shape=list(s.shape), offset=s.offset, nbytes=s.nbytes,
                          piece_offset=s.piece_offset, tensor_nbytes=s.whole_nbytes if s.is_piece else 0)
            for s in b.specs
        ],
    )


def bucket_from_pb(m: pb.BucketPlan) -> Bucket:
    """A validated ``Bucket`` (no buffer yet) from its announced plan; ``PlanError`` if malformed."""
    specs = [
        TensorSpec(name=t.name, dtype=t.dtype, shape=tuple(int(d) for d in t.shape), offset=t.offset, nbytes=t.nbytes,
                   piece_offset=t.piece_offset, tensor_nbytes=t.tensor_nbytes if t.tensor_nbytes else -1)
        for t in m.tensors
    ]
    b = Bucket(index=m.index, nbytes=m.nbytes, specs=specs)
    b.validate()
    return b


def check_control(m: pb.ControlMessage) -> str:
    """Validate ``m``'s kind/payload pairing; return the payload name."""
    expected = PAYLOAD_OF_KIND.get(m.kind)
    if expected is None:
        raise WeightChannelError(f"control message with unknown kind {m.kind}")
    got = m.WhichOneof("payload")
    if got != expected:
        raise WeightChannelError(f"control message of kind {pb.ControlKind.Name(m.kind)} carries payload {got!r}")
    if m.session == 0:
        raise WeightChannelError(f"control message {pb.ControlKind.Name(m.kind)} without a session")
    if m.kind == K.CONTROL_KIND_JOIN:
        j = m.join
        if j.world_size < 2 or not 1 <= j.rank < j.world_size:
            raise WeightChannelError(f"JOIN with rank {j.rank} / world_size {j.world_size}")
        if j.backend not in ("gloo", "nccl") or not j.timeout_s > 0 or not j.store_host or not j.store_port:
            raise WeightChannelError(f"JOIN with bad group settings: {j}")
        if j.gloo_devices > MAX_GLOO_DEVICES:
            raise WeightChannelError(f"JOIN with gloo_devices={j.gloo_devices} (at most {MAX_GLOO_DEVICES})")
    return expected


SERVE_DTYPES = ("", "float32", "bfloat16", "float16")
"""What a replica may announce as the dtype it serves ("" = unknown)."""


def check_serve_dtype(dtype: str) -> str:
    """``dtype`` if a replica may announce it (see ``SERVE_DTYPES``); else ``ValueError``."""
    if dtype not in SERVE_DTYPES:
        raise ValueError(f"serve_dtype must be one of {SERVE_DTYPES[1:]} or empty, got {dtype[:40]!r}")
    return dtype


def check_replica_id(replica_id: str) -> str:
    """``replica_id`` if it is 1..128 printable characters; else ``ValueError``."""
    if not isinstance(replica_id, str) or not 1 <= len(replica_id) <= MAX_REPLICA_ID or not replica_id.isprintable():
        raise ValueError(f"replica_id must be 1..{MAX_REPLICA_ID} printable characters, got {replica_id!r}")
    return replica_id


__all__ = ["PlanError", "bucket_from_pb", "bucket_to_pb", "check_control", "check_replica_id", "check_serve_dtype",
           "control"]
