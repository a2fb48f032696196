from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]
    DTYPE_FLOAT64: _ClassVar[DType]
    DTYPE_FLOAT16: _ClassVar[DType]
    DTYPE_BFLOAT16: _ClassVar[DType]
    DTYPE_INT8: _ClassVar[DType]
    DTYPE_INT16: _ClassVar[DType]
    DTYPE_INT32: _ClassVar[DType]
    DTYPE_INT64: _ClassVar[DType]
    DTYPE_UINT8: _ClassVar[DType]
    DTYPE_BOOL: _ClassVar[DType]
    DTYPE_COMPLEX64: _ClassVar[DType]
    DTYPE_COMPLEX128: _ClassVar[DType]
    DTYPE_UINT16: _ClassVar[DType]
    DTYPE_UINT32: _ClassVar[DType]
    DTYPE_UINT64: _ClassVar[DType]
    DTYPE_FLOAT8_E4M3FN: _ClassVar[DType]
    DTYPE_FLOAT8_E5M2: _ClassVar[DType]
    DTYPE_FLOAT8_E4M3FNUZ: _ClassVar[DType]
    DTYPE_FLOAT8_E5M2FNUZ: _ClassVar[DType]
    DTYPE_FLOAT8_E8M0FNU: _ClassVar[DType]
    DTYPE_FLOAT4_E2M1FN_X2: _ClassVar[DType]

class ColumnEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COLUMN_ENCODING_UNSPECIFIED: _ClassVar[ColumnEncoding]
    COLUMN_ENCODING_MSGPACK: _ClassVar[ColumnEncoding]
    COLUMN_ENCODING_RAW: _ClassVar[ColumnEncoding]
DTYPE_UNSPECIFIED: DType
DTYPE_FLOAT32: DType
DTYPE_FLOAT64: DType
DTYPE_FLOAT16: DType
DTYPE_BFLOAT16: DType
DTYPE_INT8: DType
DTYPE_INT16: DType
DTYPE_INT32: DType
DTYPE_INT64: DType
DTYPE_UINT8: DType
DTYPE_BOOL: DType
DTYPE_COMPLEX64: DType
DTYPE_COMPLEX128: DType
DTYPE_UINT16: DType
DTYPE_UINT32: DType
DTYPE_UINT64: DType
DTYPE_FLOAT8_E4M3FN: DType
DTYPE_FLOAT8_E5M2: DType
DTYPE_FLOAT8_E4M3FNUZ: DType
DTYPE_FLOAT8_E5M2FNUZ: DType
DTYPE_FLOAT8_E8M0FNU: DType
DTYPE_FLOAT4_E2M1FN_X2: DType
COLUMN_ENCODING_UNSPECIFIED: ColumnEncoding
COLUMN_ENCODING_MSGPACK: ColumnEncoding
COLUMN_ENCODING_RAW: ColumnEncoding

class TensorEntry(_message.Message):
    __slots__ = ("key", "dtype", "shape", "offset", "nbytes")
    KEY_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    key: _containers.RepeatedScalarFieldContainer[str]
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    nbytes: int
    def __init__(self, key: _Optional[_Iterable[str]] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., nbytes: _Optional[int] = ...) -> None: ...

class ColumnEntry(_message.Message):
    __slots__ = ("name", "encoding", "shape", "numpy_dtype", "offset", "nbytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NUMPY_DTYPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    encoding: ColumnEncoding
    shape: _containers.RepeatedScalarFieldContainer[int]
    numpy_dtype: str
    offset: int
    nbytes: int
    def __init__(self, name: _Optional[str] = ..., encoding: _Optional[_Union[ColumnEncoding, str]] = ..., shape: _Optional[_Iterable[int]] = ..., numpy_dtype: _Optional[str] = ..., offset: _Optional[int] = ..., nbytes: _Optional[int] = ...) -> None: ...

class BlobRef(_message.Message):
    __slots__ = ("offset", "nbytes")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    offset: int
    nbytes: int
    def __init__(self, offset: _Optional[int] = ..., nbytes: _Optional[int] = ...) -> None: ...

class FrameHeader(_message.Message):
    __slots__ = ("has_batch", "batch_size", "tensors", "columns", "meta_info", "data_bytes")
    HAS_BATCH_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    META_INFO_FIELD_NUMBER: _ClassVar[int]
    DATA_BYTES_FIELD_NUMBER: _ClassVar[int]
    has_batch: bool
    batch_size: _containers.RepeatedScalarFieldContainer[int]
    tensors: _containers.RepeatedCompositeFieldContainer[TensorEntry]
    columns: _containers.RepeatedCompositeFieldContainer[ColumnEntry]
    meta_info: BlobRef
    data_bytes: int
    def __init__(self, has_batch: _Optional[bool] = ..., batch_size: _Optional[_Iterable[int]] = ..., tensors: _Optional[_Iterable[_Union[TensorEntry, _Mapping]]] = ..., columns: _Optional[_Iterable[_Union[ColumnEntry, _Mapping]]] = ..., meta_info: _Optional[_Union[BlobRef, _Mapping]] = ..., data_bytes: _Optional[int] = ...) -> None: ...

class FrameChunk(_message.Message):
    __slots__ = ("frame_id", "seq", "total_chunks", "total_bytes", "data")
    FRAME_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TOTAL_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    frame_id: int
    seq: int
    total_chunks: int
    total_bytes: int
    data: bytes
    def __init__(self, frame_id: _Optional[int] = ..., seq: _Optional[int] = ..., total_chunks: _Optional[int] = ..., total_bytes: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...
