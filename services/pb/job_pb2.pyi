from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobSubmitRequest(_message.Message):
    __slots__ = ("spec_yaml", "overrides")
    SPEC_YAML_FIELD_NUMBER: _ClassVar[int]
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    spec_yaml: str
    overrides: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, spec_yaml: _Optional[str] = ..., overrides: _Optional[_Iterable[str]] = ...) -> None: ...

class JobProgressInfo(_message.Message):
    __slots__ = ("step", "total_steps", "reward_mean", "staleness", "tokens_per_s", "queues", "loss", "kl", "entropy", "grad_norm", "val_score", "logprob_diff", "restarts", "ledger")
    class QueuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class RestartsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class LedgerEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    REWARD_MEAN_FIELD_NUMBER: _ClassVar[int]
    STALENESS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    KL_FIELD_NUMBER: _ClassVar[int]
    ENTROPY_FIELD_NUMBER: _ClassVar[int]
    GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    VAL_SCORE_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_DIFF_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_FIELD_NUMBER: _ClassVar[int]
    step: int
    total_steps: int
    reward_mean: float
    staleness: float
    tokens_per_s: float
    queues: _containers.ScalarMap[str, int]
    loss: float
    kl: float
    entropy: float
    grad_norm: float
    val_score: float
    logprob_diff: float
    restarts: _containers.ScalarMap[str, int]
    ledger: _containers.ScalarMap[str, int]
    def __init__(self, step: _Optional[int] = ..., total_steps: _Optional[int] = ..., reward_mean: _Optional[float] = ..., staleness: _Optional[float] = ..., tokens_per_s: _Optional[float] = ..., queues: _Optional[_Mapping[str, int]] = ..., loss: _Optional[float] = ..., kl: _Optional[float] = ..., entropy: _Optional[float] = ..., grad_norm: _Optional[float] = ..., val_score: _Optional[float] = ..., logprob_diff: _Optional[float] = ..., restarts: _Optional[_Mapping[str, int]] = ..., ledger: _Optional[_Mapping[str, int]] = ...) -> None: ...

class JobInfo(_message.Message):
    __slots__ = ("id", "name", "state", "detail", "exit_code", "launcher", "overrides", "created_at", "updated_at", "progress", "spec_yaml")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    LAUNCHER_FIELD_NUMBER: _ClassVar[int]
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    SPEC_YAML_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    state: str
    detail: str
    exit_code: int
    launcher: str
    overrides: _containers.RepeatedScalarFieldContainer[str]
    created_at: float
    updated_at: float
    progress: JobProgressInfo
    spec_yaml: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[str] = ..., detail: _Optional[str] = ..., exit_code: _Optional[int] = ..., launcher: _Optional[str] = ..., overrides: _Optional[_Iterable[str]] = ..., created_at: _Optional[float] = ..., updated_at: _Optional[float] = ..., progress: _Optional[_Union[JobProgressInfo, _Mapping]] = ..., spec_yaml: _Optional[str] = ...) -> None: ...

class JobIdRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class JobListRequest(_message.Message):
    __slots__ = ("state", "limit", "offset")
    STATE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    state: str
    limit: int
    offset: int
    def __init__(self, state: _Optional[str] = ..., limit: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class JobListReply(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobInfo]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobInfo, _Mapping]]] = ...) -> None: ...

class JobMetricsRequest(_message.Message):
    __slots__ = ("id", "since")
    ID_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    id: str
    since: float
    def __init__(self, id: _Optional[str] = ..., since: _Optional[float] = ...) -> None: ...

class JobMetricPoint(_message.Message):
    __slots__ = ("ts", "progress")
    TS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    ts: float
    progress: JobProgressInfo
    def __init__(self, ts: _Optional[float] = ..., progress: _Optional[_Union[JobProgressInfo, _Mapping]] = ...) -> None: ...

class JobMetricsReply(_message.Message):
    __slots__ = ("id", "state", "progress", "points")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: str
    progress: JobProgressInfo
    points: _containers.RepeatedCompositeFieldContainer[JobMetricPoint]
    def __init__(self, id: _Optional[str] = ..., state: _Optional[str] = ..., progress: _Optional[_Union[JobProgressInfo, _Mapping]] = ..., points: _Optional[_Iterable[_Union[JobMetricPoint, _Mapping]]] = ...) -> None: ...

class JobEventsRequest(_message.Message):
    __slots__ = ("id", "since", "limit")
    ID_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    id: str
    since: float
    limit: int
    def __init__(self, id: _Optional[str] = ..., since: _Optional[float] = ..., limit: _Optional[int] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("ts", "kind", "detail")
    TS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    ts: float
    kind: str
    detail: str
    def __init__(self, ts: _Optional[float] = ..., kind: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class JobEventsReply(_message.Message):
    __slots__ = ("id", "state", "events")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: str
    events: _containers.RepeatedCompositeFieldContainer[JobEvent]
    def __init__(self, id: _Optional[str] = ..., state: _Optional[str] = ..., events: _Optional[_Iterable[_Union[JobEvent, _Mapping]]] = ...) -> None: ...

class JobLogsRequest(_message.Message):
    __slots__ = ("id", "service", "tail", "follow", "max_seconds")
    ID_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    MAX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    service: str
    tail: int
    follow: bool
    max_seconds: float
    def __init__(self, id: _Optional[str] = ..., service: _Optional[str] = ..., tail: _Optional[int] = ..., follow: _Optional[bool] = ..., max_seconds: _Optional[float] = ...) -> None: ...

class JobLogChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...
