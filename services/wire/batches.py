"""A batch object <-> one frame, for any class shaped like ``DataProto``.

A batch object has ``batch`` (a TensorDict or None), ``non_tensor_batch`` and
``meta_info``; :func:`to_parts` splits one into :class:`~services.wire.codec.FrameParts`
and :func:`decode_as` builds an instance of the class it is given from a frame. Nothing
here names ``DataProto``: ``services.protocol`` stores and gathers its batches with these
functions, and the package's :func:`services.wire.decode` adds ``DataProto`` as the default
class on top.
"""

from __future__ import annotations

from typing import Any

from services.wire.codec import DEFAULT_MAX_FRAME_BYTES, FrameParts, decode_frame, encode_frame, encode_frame_parts
from services.wire.errors import WireError


def to_parts(data: Any) -> FrameParts:
    """Split a DataProto (anything with ``batch``, ``non_tensor_batch``, ``meta_info``) into
    frame parts. Nested TensorDict keys become key paths."""
    batch = getattr(data, "batch", None)
    non_tensors = getattr(data, "non_tensor_batch", None)
    meta = getattr(data, "meta_info", None)
    if not hasattr(data, "non_tensor_batch") or not hasattr(data, "meta_info"):
        raise TypeError(f"encode: expected a DataProto, got {type(data).__qualname__}")
    parts = FrameParts(non_tensors=dict(non_tensors or {}), meta_info=meta if meta is not None else {})
    if batch is not None:
        from tensordict import TensorDictBase

        if not isinstance(batch, TensorDictBase):
            raise TypeError(f"encode: batch must be a TensorDict or None, got {type(batch).__qualname__}")
        parts.batch_size = tuple(batch.batch_size)
        for key in batch.keys(include_nested=True, leaves_only=True):
            path = (key,) if isinstance(key, str) else tuple(key)
            parts.tensors[path] = batch.get(key)
    return parts


def encode(data: Any) -> bytearray:
    """Encode a DataProto into one frame (each tensor copied once into a preallocated buffer).

    Raises TypeError naming the column/key for anything that is not plain data or a
    supported tensor (arbitrary objects are refused, never pickled).
    """
    return encode_frame(to_parts(data))


def encode_parts(data: Any) -> list[memoryview]:
    """The frame of :func:`encode` as a list of views, without copying tensor bytes: write
    them in order (``writelines``, a gRPC chunk stream, ...). Do not modify the DataProto's
    tensors until the views are consumed."""
    return encode_frame_parts(to_parts(data))


def decode_as(buf: Any, cls: type, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
              zero_copy_readonly: bool = False) -> Any:
    """Decode one frame into ``cls`` (see :func:`services.wire.decode`); raises
    :class:`WireError` -- and nothing else -- for a bad frame or one ``cls`` refuses."""
    parts = decode_frame(buf, max_frame_bytes=max_frame_bytes, zero_copy_readonly=zero_copy_readonly)
    try:
        return cls(batch=build_tensordict(parts), non_tensor_batch=parts.non_tensors, meta_info=parts.meta_info)
    except WireError:
        raise
    except Exception as e:  # noqa: BLE001 - the frame was consistent but cls refused it
        raise WireError(f"frame content rejected by {getattr(cls, '__name__', cls)}: {type(e).__name__}: {e}") from None


def build_tensordict(parts: FrameParts) -> Any:
    """The TensorDict of ``parts`` (None when the frame has no tensor batch); no copies."""
    if parts.batch_size is None:
        return None
    from tensordict import TensorDict

    tree: dict[str, Any] = {}
    for path, t in parts.tensors.items():
        node = tree
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = t
    return TensorDict(tree, batch_size=parts.batch_size)
