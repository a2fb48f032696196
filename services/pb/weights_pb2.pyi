from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ControlKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTROL_KIND_UNSPECIFIED: _ClassVar[ControlKind]
    CONTROL_KIND_WELCOME: _ClassVar[ControlKind]
    CONTROL_KIND_JOIN: _ClassVar[ControlKind]
    CONTROL_KIND_BEGIN: _ClassVar[ControlKind]
    CONTROL_KIND_BUCKET: _ClassVar[ControlKind]
    CONTROL_KIND_END: _ClassVar[ControlKind]
    CONTROL_KIND_ABORT: _ClassVar[ControlKind]

class AckStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACK_STATUS_UNSPECIFIED: _ClassVar[AckStatus]
    ACK_STATUS_RECEIVED: _ClassVar[AckStatus]
    ACK_STATUS_FAILED: _ClassVar[AckStatus]
    ACK_STATUS_LOADED: _ClassVar[AckStatus]
CONTROL_KIND_UNSPECIFIED: ControlKind
CONTROL_KIND_WELCOME: ControlKind
CONTROL_KIND_JOIN: ControlKind
CONTROL_KIND_BEGIN: ControlKind
CONTROL_KIND_BUCKET: ControlKind
CONTROL_KIND_END: ControlKind
CONTROL_KIND_ABORT: ControlKind
ACK_STATUS_UNSPECIFIED: AckStatus
ACK_STATUS_RECEIVED: AckStatus
ACK_STATUS_FAILED: AckStatus
ACK_STATUS_LOADED: AckStatus

class SubscribeRequest(_message.Message):
    __slots__ = ("replica_id", "served_version", "served_session", "serve_dtype")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    SERVED_VERSION_FIELD_NUMBER: _ClassVar[int]
    SERVED_SESSION_FIELD_NUMBER: _ClassVar[int]
    SERVE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    served_version: int
    served_session: int
    serve_dtype: str
    def __init__(self, replica_id: _Optional[str] = ..., served_version: _Optional[int] = ..., served_session: _Optional[int] = ..., serve_dtype: _Optional[str] = ...) -> None: ...

class ControlMessage(_message.Message):
    __slots__ = ("kind", "session", "epoch", "policy_version", "welcome", "join", "begin", "bucket", "end", "abort")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    JOIN_FIELD_NUMBER: _ClassVar[int]
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    kind: ControlKind
    session: int
    epoch: int
    policy_version: int
    welcome: Welcome
    join: Join
    begin: Begin
    bucket: BucketPlan
    end: End
    abort: Abort
    def __init__(self, kind: _Optional[_Union[ControlKind, str]] = ..., session: _Optional[int] = ..., epoch: _Optional[int] = ..., policy_version: _Optional[int] = ..., welcome: _Optional[_Union[Welcome, _Mapping]] = ..., join: _Optional[_Union[Join, _Mapping]] = ..., begin: _Optional[_Union[Begin, _Mapping]] = ..., bucket: _Optional[_Union[BucketPlan, _Mapping]] = ..., end: _Optional[_Union[End, _Mapping]] = ..., abort: _Optional[_Union[Abort, _Mapping]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("latest_version", "snapshot_version")
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_VERSION_FIELD_NUMBER: _ClassVar[int]
    latest_version: int
    snapshot_version: int
    def __init__(self, latest_version: _Optional[int] = ..., snapshot_version: _Optional[int] = ...) -> None: ...

class Join(_message.Message):
    __slots__ = ("rank", "world_size", "store_host", "store_port", "store_prefix", "backend", "timeout_s", "gloo_devices")
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    STORE_HOST_FIELD_NUMBER: _ClassVar[int]
    STORE_PORT_FIELD_NUMBER: _ClassVar[int]
    STORE_PREFIX_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    GLOO_DEVICES_FIELD_NUMBER: _ClassVar[int]
    rank: int
    world_size: int
    store_host: str
    store_port: int
    store_prefix: str
    backend: str
    timeout_s: float
    gloo_devices: int
    def __init__(self, rank: _Optional[int] = ..., world_size: _Optional[int] = ..., store_host: _Optional[str] = ..., store_port: _Optional[int] = ..., store_prefix: _Optional[str] = ..., backend: _Optional[str] = ..., timeout_s: _Optional[float] = ..., gloo_devices: _Optional[int] = ...) -> None: ...

class Begin(_message.Message):
    __slots__ = ("bucket_bytes",)
    BUCKET_BYTES_FIELD_NUMBER: _ClassVar[int]
    bucket_bytes: int
    def __init__(self, bucket_bytes: _Optional[int] = ...) -> None: ...

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape", "offset", "nbytes", "piece_offset", "tensor_nbytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    PIECE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TENSOR_NBYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    nbytes: int
    piece_offset: int
    tensor_nbytes: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., nbytes: _Optional[int] = ..., piece_offset: _Optional[int] = ..., tensor_nbytes: _Optional[int] = ...) -> None: ...

class BucketPlan(_message.Message):
    __slots__ = ("index", "nbytes", "tensors")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    index: int
    nbytes: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    def __init__(self, index: _Optional[int] = ..., nbytes: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ...) -> None: ...

class End(_message.Message):
    __slots__ = ("num_buckets", "num_tensors", "tensor_bytes")
    NUM_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    NUM_TENSORS_FIELD_NUMBER: _ClassVar[int]
    TENSOR_BYTES_FIELD_NUMBER: _ClassVar[int]
    num_buckets: int
    num_tensors: int
    tensor_bytes: int
    def __init__(self, num_buckets: _Optional[int] = ..., num_tensors: _Optional[int] = ..., tensor_bytes: _Optional[int] = ...) -> None: ...

class Abort(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("replica_id", "session", "epoch", "policy_version", "status", "message")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    session: int
    epoch: int
    policy_version: int
    status: AckStatus
    message: str
    def __init__(self, replica_id: _Optional[str] = ..., session: _Optional[int] = ..., epoch: _Optional[int] = ..., policy_version: _Optional[int] = ..., status: _Optional[_Union[AckStatus, str]] = ..., message: _Optional[str] = ...) -> None: ...

class AckReply(_message.Message):
    __slots__ = ("known",)
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    known: bool
    def __init__(self, known: _Optional[bool] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("replica_id", "min_version")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    min_version: int
    def __init__(self, replica_id: _Optional[str] = ..., min_version: _Optional[int] = ...) -> None: ...

class SnapshotChunk(_message.Message):
    __slots__ = ("policy_version", "total_bytes", "offset", "data")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    total_bytes: int
    offset: int
    data: bytes
    def __init__(self, policy_version: _Optional[int] = ..., total_bytes: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("replica_id", "served_version", "received_version", "ready")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    SERVED_VERSION_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_VERSION_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    served_version: int
    received_version: int
    ready: bool
    def __init__(self, replica_id: _Optional[str] = ..., served_version: _Optional[int] = ..., received_version: _Optional[int] = ..., ready: _Optional[bool] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("session", "latest_version", "snapshot_version", "epoch", "replicas")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_VERSION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    session: int
    latest_version: int
    snapshot_version: int
    epoch: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    def __init__(self, session: _Optional[int] = ..., latest_version: _Optional[int] = ..., snapshot_version: _Optional[int] = ..., epoch: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ...) -> None: ...
