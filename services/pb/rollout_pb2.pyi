from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class RolloutGenerateRequest(_message.Message):
    __slots__ = ("frame",)
    FRAME_FIELD_NUMBER: _ClassVar[int]
    frame: bytes
    def __init__(self, frame: _Optional[bytes] = ...) -> None: ...

class RolloutGenerateResponse(_message.Message):
    __slots__ = ("frame",)
    FRAME_FIELD_NUMBER: _ClassVar[int]
    frame: bytes
    def __init__(self, frame: _Optional[bytes] = ...) -> None: ...

class RolloutStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RolloutPauseRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RolloutResumeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RolloutStatus(_message.Message):
    __slots__ = ("replica", "model", "served_version", "ready", "paused", "requests_in_flight", "groups_in_flight", "tokens_generated", "tokens_per_s", "last_weight_load_s", "weight_updates", "groups_done")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SERVED_VERSION_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    GROUPS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_GENERATED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    LAST_WEIGHT_LOAD_S_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_UPDATES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_DONE_FIELD_NUMBER: _ClassVar[int]
    replica: str
    model: str
    served_version: int
    ready: bool
    paused: bool
    requests_in_flight: int
    groups_in_flight: int
    tokens_generated: int
    tokens_per_s: float
    last_weight_load_s: float
    weight_updates: int
    groups_done: int
    def __init__(self, replica: _Optional[str] = ..., model: _Optional[str] = ..., served_version: _Optional[int] = ..., ready: _Optional[bool] = ..., paused: _Optional[bool] = ..., requests_in_flight: _Optional[int] = ..., groups_in_flight: _Optional[int] = ..., tokens_generated: _Optional[int] = ..., tokens_per_s: _Optional[float] = ..., last_weight_load_s: _Optional[float] = ..., weight_updates: _Optional[int] = ..., groups_done: _Optional[int] = ...) -> None: ...
