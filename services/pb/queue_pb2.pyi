from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class QueuePutBatch(_message.Message):
    __slots__ = ("stream", "producer", "stage", "max_depth", "wait_ms", "ledger_max")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    MAX_DEPTH_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_MAX_FIELD_NUMBER: _ClassVar[int]
    stream: str
    producer: str
    stage: str
    max_depth: int
    wait_ms: int
    ledger_max: int
    def __init__(self, stream: _Optional[str] = ..., producer: _Optional[str] = ..., stage: _Optional[str] = ..., max_depth: _Optional[int] = ..., wait_ms: _Optional[int] = ..., ledger_max: _Optional[int] = ...) -> None: ...

class QueuePutItem(_message.Message):
    __slots__ = ("seq", "sample_ids", "frame_bytes", "inline")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_IDS_FIELD_NUMBER: _ClassVar[int]
    FRAME_BYTES_FIELD_NUMBER: _ClassVar[int]
    INLINE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    sample_ids: _containers.RepeatedScalarFieldContainer[str]
    frame_bytes: int
    inline: bytes
    def __init__(self, seq: _Optional[int] = ..., sample_ids: _Optional[_Iterable[str]] = ..., frame_bytes: _Optional[int] = ..., inline: _Optional[bytes] = ...) -> None: ...

class QueuePutMessage(_message.Message):
    __slots__ = ("batch", "item", "chunk")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    ITEM_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    batch: QueuePutBatch
    item: QueuePutItem
    chunk: bytes
    def __init__(self, batch: _Optional[_Union[QueuePutBatch, _Mapping]] = ..., item: _Optional[_Union[QueuePutItem, _Mapping]] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class QueuePutReply(_message.Message):
    __slots__ = ("entry_ids", "full", "gaps")
    ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    GAPS_FIELD_NUMBER: _ClassVar[int]
    entry_ids: _containers.RepeatedScalarFieldContainer[str]
    full: bool
    gaps: int
    def __init__(self, entry_ids: _Optional[_Iterable[str]] = ..., full: _Optional[bool] = ..., gaps: _Optional[int] = ...) -> None: ...

class QueueGetRequest(_message.Message):
    __slots__ = ("stream", "group", "consumer", "max_items", "wait_ms", "dedupe_window", "chunk_bytes")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    MAX_ITEMS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    DEDUPE_WINDOW_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    stream: str
    group: str
    consumer: str
    max_items: int
    wait_ms: int
    dedupe_window: int
    chunk_bytes: int
    def __init__(self, stream: _Optional[str] = ..., group: _Optional[str] = ..., consumer: _Optional[str] = ..., max_items: _Optional[int] = ..., wait_ms: _Optional[int] = ..., dedupe_window: _Optional[int] = ..., chunk_bytes: _Optional[int] = ...) -> None: ...

class QueueReclaimRequest(_message.Message):
    __slots__ = ("stream", "group", "consumer", "min_idle_ms", "max_items", "dedupe_window", "chunk_bytes", "own_only", "exclude_ids")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    MIN_IDLE_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_ITEMS_FIELD_NUMBER: _ClassVar[int]
    DEDUPE_WINDOW_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    OWN_ONLY_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_IDS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    group: str
    consumer: str
    min_idle_ms: int
    max_items: int
    dedupe_window: int
    chunk_bytes: int
    own_only: bool
    exclude_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, stream: _Optional[str] = ..., group: _Optional[str] = ..., consumer: _Optional[str] = ..., min_idle_ms: _Optional[int] = ..., max_items: _Optional[int] = ..., dedupe_window: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., own_only: _Optional[bool] = ..., exclude_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class QueueDeliveryHeader(_message.Message):
    __slots__ = ("entry_id", "producer", "seq", "sample_ids", "fresh", "delivery_count", "frame_bytes", "inline")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_IDS_FIELD_NUMBER: _ClassVar[int]
    FRESH_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    FRAME_BYTES_FIELD_NUMBER: _ClassVar[int]
    INLINE_FIELD_NUMBER: _ClassVar[int]
    entry_id: str
    producer: str
    seq: int
    sample_ids: _containers.RepeatedScalarFieldContainer[str]
    fresh: _containers.RepeatedScalarFieldContainer[bool]
    delivery_count: int
    frame_bytes: int
    inline: bytes
    def __init__(self, entry_id: _Optional[str] = ..., producer: _Optional[str] = ..., seq: _Optional[int] = ..., sample_ids: _Optional[_Iterable[str]] = ..., fresh: _Optional[_Iterable[bool]] = ..., delivery_count: _Optional[int] = ..., frame_bytes: _Optional[int] = ..., inline: _Optional[bytes] = ...) -> None: ...

class QueueDelivery(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: QueueDeliveryHeader
    chunk: bytes
    def __init__(self, header: _Optional[_Union[QueueDeliveryHeader, _Mapping]] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class QueueAckRequest(_message.Message):
    __slots__ = ("stream", "group", "entry_ids", "stage", "sample_ids", "ledger_max")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_IDS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_MAX_FIELD_NUMBER: _ClassVar[int]
    stream: str
    group: str
    entry_ids: _containers.RepeatedScalarFieldContainer[str]
    stage: str
    sample_ids: _containers.RepeatedScalarFieldContainer[str]
    ledger_max: int
    def __init__(self, stream: _Optional[str] = ..., group: _Optional[str] = ..., entry_ids: _Optional[_Iterable[str]] = ..., stage: _Optional[str] = ..., sample_ids: _Optional[_Iterable[str]] = ..., ledger_max: _Optional[int] = ...) -> None: ...

class QueueAckReply(_message.Message):
    __slots__ = ("acked",)
    ACKED_FIELD_NUMBER: _ClassVar[int]
    acked: int
    def __init__(self, acked: _Optional[int] = ...) -> None: ...

class QueueDepthRequest(_message.Message):
    __slots__ = ("stream",)
    STREAM_FIELD_NUMBER: _ClassVar[int]
    stream: str
    def __init__(self, stream: _Optional[str] = ...) -> None: ...

class QueueDepthReply(_message.Message):
    __slots__ = ("depth", "queued", "leased")
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    depth: int
    queued: int
    leased: int
    def __init__(self, depth: _Optional[int] = ..., queued: _Optional[int] = ..., leased: _Optional[int] = ...) -> None: ...

class QueueRecordStageRequest(_message.Message):
    __slots__ = ("sample_ids", "stage", "ledger_max")
    SAMPLE_IDS_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    LEDGER_MAX_FIELD_NUMBER: _ClassVar[int]
    sample_ids: _containers.RepeatedScalarFieldContainer[str]
    stage: str
    ledger_max: int
    def __init__(self, sample_ids: _Optional[_Iterable[str]] = ..., stage: _Optional[str] = ..., ledger_max: _Optional[int] = ...) -> None: ...

class QueueRecordStageReply(_message.Message):
    __slots__ = ("recorded",)
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    recorded: int
    def __init__(self, recorded: _Optional[int] = ...) -> None: ...

class QueueGetStagesRequest(_message.Message):
    __slots__ = ("sample_ids",)
    SAMPLE_IDS_FIELD_NUMBER: _ClassVar[int]
    sample_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, sample_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class QueueGetStagesReply(_message.Message):
    __slots__ = ("stages",)
    STAGES_FIELD_NUMBER: _ClassVar[int]
    stages: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, stages: _Optional[_Iterable[str]] = ...) -> None: ...
