"""Length-prefixed JSON messages between the service and its sandbox workers.

One message = 4-byte big-endian unsigned length + that many bytes of UTF-8 JSON (an
object). JSON, not pickle: a compromised worker can at worst send a wrong number, never
run code in the service. Readers enforce a size cap and a deadline.
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from typing import Any

_LEN = struct.Struct(">I")


class ChannelClosed(EOFError):
    """The other end closed the pipe (a worker died or the service went away)."""


class ChannelTimeout(TimeoutError):
    """No complete message arrived before the deadline."""


class ChannelError(ValueError):
    """A message was too large or not a JSON object."""


def pack(msg: dict[str, Any]) -> bytes:
    """Encode one message (``allow_nan`` so a NaN score is reported, then rejected, not lost)."""
    body = json.dumps(msg, separators=(",", ":")).encode()
    return _LEN.pack(len(body)) + body


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd`` (blocking)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class Reader:
    """Incremental message reader over a file descriptor, with deadlines and a size cap."""

    def __init__(self, fd: int, max_bytes: int) -> None:
        self.fd = fd
        self.max_bytes = max_bytes
        self._buf = bytearray()

    def _take(self) -> dict[str, Any] | None:
        if len(self._buf) < 4:
            return None
        (n,) = _LEN.unpack_from(self._buf)
        if n > self.max_bytes:
            raise ChannelError(f"message of {n} bytes exceeds the limit of {self.max_bytes}")
        if len(self._buf) < 4 + n:
            return None
        body = bytes(self._buf[4 : 4 + n])
        del self._buf[: 4 + n]
        try:
            msg = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ChannelError(f"message is not valid JSON: {exc}") from None
        if not isinstance(msg, dict):
            raise ChannelError(f"message must be a JSON object, got {type(msg).__name__}")
        return msg

    def feed(self, chunk: bytes) -> tuple[list[dict[str, Any]], ChannelError | None]:
        """Add bytes read elsewhere (an event loop's reader callback). Returns the messages
        now complete, in order, and the :class:`ChannelError` that stops the stream (a
        message over the size cap, or not a JSON object), if any, after them."""
        self._buf += chunk
        out: list[dict[str, Any]] = []
        try:
            while (msg := self._take()) is not None:
                out.append(msg)
            if len(self._buf) >= 4:
                (n,) = _LEN.unpack_from(self._buf)
                if n > self.max_bytes:
                    raise ChannelError(f"message of {n} bytes exceeds the limit of {self.max_bytes}")
        except ChannelError as exc:
            return out, exc
        return out, None

    def read(self, deadline: float | None) -> dict[str, Any]:
        """Next message; ``deadline`` is a ``time.monotonic()`` value (None = wait forever)."""
        while True:
            msg = self._take()
            if msg is not None:
                return msg
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ChannelTimeout("no reply before the deadline")
                ready, _, _ = select.select([self.fd], [], [], left)
                if not ready:
                    raise ChannelTimeout("no reply before the deadline")
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                raise ChannelClosed("pipe closed")
            self._buf += chunk
            if len(self._buf) > self.max_bytes + 4:
                (n,) = _LEN.unpack_from(self._buf)
                if n > self.max_bytes:
                    raise ChannelError(f"message of {n} bytes exceeds the limit of {self.max_bytes}")
