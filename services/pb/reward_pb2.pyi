from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class RewardScoreRequest(_message.Message):
    __slots__ = ("frame",)
    FRAME_FIELD_NUMBER: _ClassVar[int]
    frame: bytes
    def __init__(self, frame: _Optional[bytes] = ...) -> None: ...

class RewardScoreResponse(_message.Message):
    __slots__ = ("frame", "num_samples", "num_errors", "mean_score")
    FRAME_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    NUM_ERRORS_FIELD_NUMBER: _ClassVar[int]
    MEAN_SCORE_FIELD_NUMBER: _ClassVar[int]
    frame: bytes
    num_samples: int
    num_errors: int
    mean_score: float
    def __init__(self, frame: _Optional[bytes] = ..., num_samples: _Optional[int] = ..., num_errors: _Optional[int] = ..., mean_score: _Optional[float] = ...) -> None: ...
