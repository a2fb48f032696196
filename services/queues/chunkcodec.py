"""Fast path for the frame chunks of the QueueService, byte-compatible with queue.proto.

A ``QueuePutMessage{chunk}`` / ``QueueDelivery{chunk}`` is, on the wire, one tag byte, a
varint length and the raw bytes. Building it through protobuf objects copies the chunk
three times; here it is written with one join, and read back as a zero-copy
``memoryview`` of the received buffer. Every other message goes through protobuf as
usual, and a peer using the plain generated stubs interoperates unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PUT_CHUNK_FIELD = 3  # QueuePutMessage.chunk
DELIVERY_CHUNK_FIELD = 2  # QueueDelivery.chunk


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def chunk_serializer(field: int) -> Callable[[Any], bytes]:
    """Serializer: a ``memoryview``/``bytes`` chunk -> the oneof message holding it; a
    protobuf message -> ``SerializeToString()``."""
    tag = bytes([(field << 3) | 2])

    def ser(msg: Any) -> bytes:
        if isinstance(msg, memoryview | bytes | bytearray):
            return b"".join((tag, _varint(len(msg)), msg))
        return msg.SerializeToString()

    return ser


def chunk_deserializer(field: int, cls: type) -> Callable[[bytes], Any]:
    """Deserializer: a message that is exactly one ``chunk`` field -> ``memoryview`` of its
    bytes (no copy); anything else -> ``cls.FromString``."""
    tag = (field << 3) | 2

    def deser(buf: bytes) -> Any:
        if buf and buf[0] == tag:
            n, shift, i = 0, 0, 1
            while i < len(buf) and i < 11:
                b = buf[i]
                n |= (b & 0x7F) << shift
                i += 1
                if not b & 0x80:
                    break
                shift += 7
            if i + n == len(buf):
                return memoryview(buf)[i:]
        return cls.FromString(buf)

    return deser
