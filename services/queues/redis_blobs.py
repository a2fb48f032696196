"""Zero-copy SET/GET of large frames on a plain TCP connection to Redis.

redis-py copies a large value several times (joining the command, asyncio's write
buffer; the read buffer, the parser, the final ``bytes``). For frames of many megabytes
that dominates, so large frames go through this small RESP2 client instead: ``SET``
sends the frame straight from the caller's buffer (``sock_sendall`` of a memoryview);
``GET`` reads the value straight into a fresh, writable ``bytearray`` that
``services.wire.decode`` then views without copying. Only for ``redis://`` URLs without
TLS; :class:`~services.queues.redis_backend.RedisQueue` falls back to redis-py otherwise.
"""

from __future__ import annotations

import asyncio
import socket


class BlobConnectionError(ConnectionError):
    """The blob connection failed or Redis answered with an error; the call may be retried."""


def _cmd(*parts: bytes) -> bytes:
    return b"".join([b"*%d\r\n" % len(parts)] + [b"$%d\r\n%s\r\n" % (len(p), p) for p in parts])


class BlobConnection:
    """One connection used by one coroutine at a time (guarded by a lock)."""

    def __init__(self, host: str, port: int, *, db: int = 0, username: str | None = None,
                 password: str | None = None, timeout: float = 30.0) -> None:
        self.host, self.port, self.db = host, port, db
        self.username, self.password = username, password
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._pending = bytearray()  # bytes read past the last reply's end
        self._lock = asyncio.Lock()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._pending.clear()

    async def _connect(self) -> socket.socket:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await loop.sock_connect(sock, (self.host, self.port))
            self._sock = sock
            if self.password is not None:
                auth = [b"AUTH", self.username.encode()] if self.username else [b"AUTH"]
                await loop.sock_sendall(sock, _cmd(*auth, self.password.encode()))
                await self._simple_reply()
            if self.db:
                await loop.sock_sendall(sock, _cmd(b"SELECT", str(self.db).encode()))
                await self._simple_reply()
        except BaseException:
            self.close()
            raise
        return sock

    async def _fill(self, need: int) -> None:
        """Read until ``_pending`` holds at least ``need`` bytes."""
        loop = asyncio.get_running_loop()
        while len(self._pending) < need:
            data = await loop.sock_recv(self._sock, max(65536, need - len(self._pending)))
            if not data:
                raise BlobConnectionError("redis closed the blob connection")
            self._pending += data

    async def _line(self) -> bytes:
        while True:
            i = self._pending.find(b"\r\n")
            if i >= 0:
                line = bytes(self._pending[:i])
                del self._pending[: i + 2]
                return line
            await self._fill(len(self._pending) + 1)

    async def _simple_reply(self) -> bytes:
        line = await self._line()
        if line.startswith(b"-"):
            raise BlobConnectionError(f"redis: {line[1:].decode(errors='replace')}")
        return line

    async def _run(self, coro_fn):  # noqa: ANN001, ANN202 - one guarded exchange with a deadline
        async with self._lock:
            try:
                if self._sock is None:
                    await asyncio.wait_for(self._connect(), self.timeout)
                return await asyncio.wait_for(coro_fn(), self.timeout)
            except (OSError, TimeoutError, BlobConnectionError) as exc:
                self.close()  # protocol state unknown: start afresh next time
                if isinstance(exc, BlobConnectionError):
                    raise
                raise BlobConnectionError(f"blob connection to {self.host}:{self.port}: {exc!r}") from exc

    async def set(self, key: str, data: bytes | bytearray | memoryview, ttl_s: int) -> None:
        """``SET key data EX ttl_s``; ``data`` is sent without copying."""
        view = memoryview(data).cast("B")
        k = key.encode()
        head = b"*5\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(k), k, view.nbytes)
        tail = b"\r\n" + _cmd(b"EX", str(ttl_s).encode())[4:]  # the last two arguments

        async def go() -> None:
            loop = asyncio.get_running_loop()
            await loop.sock_sendall(self._sock, head)
            await loop.sock_sendall(self._sock, view)
            await loop.sock_sendall(self._sock, tail)
            await self._simple_reply()

        await self._run(go)

    async def get_many(self, keys: list[str], max_bytes: int) -> list[bytearray | None]:
        """Pipelined ``GET``s; each value lands in its own writable bytearray (None if missing)."""

        async def go() -> list[bytearray | None]:
            loop = asyncio.get_running_loop()
            await loop.sock_sendall(self._sock, b"".join(_cmd(b"GET", k.encode()) for k in keys))
            out: list[bytearray | None] = []
            for _ in keys:
                line = await self._simple_reply()
                if not line.startswith(b"$"):
                    raise BlobConnectionError(f"unexpected GET reply {line[:40]!r}")
                n = int(line[1:])
                if n < 0:
                    out.append(None)
                    continue
                if n > max_bytes:
                    raise BlobConnectionError(f"large frame of {n} bytes exceeds max_frame_bytes={max_bytes}")
                buf = bytearray(n + 2)
                view = memoryview(buf)
                have = min(len(self._pending), n + 2)
                view[:have] = self._pending[:have]
                del self._pending[:have]
                while have < n + 2:
                    k = await loop.sock_recv_into(self._sock, view[have:])
                    if k == 0:
                        raise BlobConnectionError("redis closed the blob connection mid-value")
                    have += k
                view.release()
                if buf[n:] != b"\r\n":
                    raise BlobConnectionError("GET reply not terminated by CRLF")
                del buf[n:]  # shrinks in place
                out.append(buf)
            return out

        return await self._run(go)
