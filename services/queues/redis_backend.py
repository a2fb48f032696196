"""Redis Streams backend of :class:`services.queues.base.Queue`.

Keys (``P`` = ``<namespace>:{<stream>}``; the hash tag keeps one stream's keys together):

* ``P:s`` -- the stream. Entry fields: ``p`` producer id, ``s`` sequence number,
  ``i`` sample ids (JSON list of str), ``n`` frame length, and either ``d`` (the frame
  inline) or ``k`` (the key of a large frame stored aside).
* ``P:b:<producer>:<seq>`` -- a large frame (``SET ... EX large_frame_ttl_s``).
* ``P:q:<producer>`` -- the producer's last accepted sequence number (with TTL).
* ``P:g:<group>:c|o|n`` -- the group's dedupe window: sample_id -> entry id, ages, counter.
* ``<namespace>:ledger:h|o|n`` -- the sample ledger: sample_id -> stage, ages, counter.

An item is acked with ``XACK`` + ``XDEL`` (one consuming group per stream), so ``XLEN`` is
the depth (queued + leased) that backpressure compares with ``max_depth``. Not for Redis
Cluster (the scripts touch a stream's keys and the ledger together).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, AuthorizationError, BusyLoadingError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services.config.queues import RedisQueueConfig
from services.queues import redis_scripts
from services.queues.base import PutOutcome, Queue, QueueError, RawItem, RawLeased
from services.queues.redis_blobs import BlobConnection
from services.queues.stats import QueueMetrics

_MAX_SCRIPT_ITEMS = 5000  # items per put script call (bounds the time one script holds Redis)


def make_redis_client(cfg: RedisQueueConfig) -> aioredis.Redis:
    """A ``redis.asyncio`` client for ``cfg`` (bytes replies, no hidden retries)."""
    kwargs: dict[str, Any] = {
        "socket_timeout": cfg.op_timeout_s,
        "socket_connect_timeout": min(cfg.op_timeout_s, 5.0),
        "retry": Retry(NoBackoff(), 0),
        "decode_responses": False,
    }
    if cfg.username is not None:
        kwargs["username"] = cfg.username
    if cfg.password is not None:
        kwargs["password"] = cfg.password
    elif cfg.password_env is not None:
        pw = os.environ.get(cfg.password_env)
        if pw is None:
            raise ValueError(f"environment variable {cfg.password_env} (password_env) is not set")
        kwargs["password"] = pw
    url = cfg.url
    if cfg.tls or url.startswith("rediss://"):
        url = url.replace("redis://", "rediss://", 1)  # from_url picks the TLS connection class
        kwargs["ssl_cert_reqs"] = "required" if cfg.tls_verify else "none"
        kwargs["ssl_check_hostname"] = cfg.tls_verify
        if cfg.tls_ca_file:
            kwargs["ssl_ca_certs"] = cfg.tls_ca_file
        if cfg.tls_cert_file:
            kwargs["ssl_certfile"] = cfg.tls_cert_file
            kwargs["ssl_keyfile"] = cfg.tls_key_file
    return aioredis.Redis.from_url(url, **kwargs)


class RedisQueue(Queue):
    """A stream in Redis, consumed by one consumer group (see module docstring)."""

    transient_errors = (RedisConnectionError, RedisTimeoutError, BusyLoadingError, ConnectionError, OSError)
    permanent_errors = (AuthenticationError, AuthorizationError)

    def __init__(
        self,
        cfg: RedisQueueConfig,
        *,
        stream: str,
        group: str,
        consumer: str,
        metrics: QueueMetrics | None = None,
        client: aioredis.Redis | None = None,
    ) -> None:
        super().__init__(cfg, stream=stream, group=group, consumer=consumer, metrics=metrics)
        self.cfg: RedisQueueConfig = cfg
        self._r = client if client is not None else make_redis_client(cfg)
        self._own_client = client is None
        p = f"{cfg.namespace}:{{{stream}}}"
        self.k_stream = f"{p}:s"
        self._k_blob = f"{p}:b:"
        self._k_seq = f"{p}:q:{self.producer_id}"
        self._k_claims = (f"{p}:g:{group}:c", f"{p}:g:{group}:o", f"{p}:g:{group}:n")
        self._k_ledger = (f"{cfg.namespace}:ledger:h", f"{cfg.namespace}:ledger:o", f"{cfg.namespace}:ledger:n")
        self._s_put = self._r.register_script(redis_scripts.PUT)
        self._s_claim = self._r.register_script(redis_scripts.CLAIM)
        self._s_ack = self._r.register_script(redis_scripts.ACK)
        self._s_ledger = self._r.register_script(redis_scripts.LEDGER)
        self._group_ready = False
        self._recover = False  # after a disconnect: re-read our own pending entries once
        self._held: set[str] = set()  # entry ids handed to the application, not yet acked
        self._claim_cursor = "0-0"
        self._blobs_sent: set[int] = set()  # seqs of the current put whose large frame is in Redis
        self._blob = self._blob_connection()

    def _blob_connection(self) -> BlobConnection | None:
        """The zero-copy large-frame connection (plain TCP only; None = use redis-py)."""
        pool = self._r.connection_pool
        kw = pool.connection_kwargs
        if pool.connection_class is not aioredis.Connection or "host" not in kw:
            return None  # TLS or unix socket
        return BlobConnection(kw["host"], int(kw.get("port", 6379)), db=int(kw.get("db") or 0),
                              username=kw.get("username"), password=kw.get("password"),
                              timeout=self.cfg.op_timeout_s)

    def _put_started(self) -> None:
        self._blobs_sent.clear()

    async def close(self) -> None:
        if self._blob is not None:
            self._blob.close()
        if self._own_client:
            await self._r.aclose()

    def _on_disconnect(self) -> None:
        self._recover = True

    # ------------------------------------------------------------------ put
    async def _put_once(self, items: Sequence[RawItem], seqs: Sequence[int], stage: str | None) -> PutOutcome:
        cfg = self.cfg
        ids: list[str | None] = []
        gaps = 0
        for start in range(0, len(items), _MAX_SCRIPT_ITEMS):
            chunk, cseqs = items[start : start + _MAX_SCRIPT_ITEMS], seqs[start : start + _MAX_SCRIPT_ITEMS]
            args: list[Any] = [cfg.max_depth, cfg.producer_seq_ttl_s, stage or "", cfg.ledger_max_entries,
                               self.producer_id, len(chunk)]
            pipe = self._r.pipeline(transaction=False)
            for it, seq in zip(chunk, cseqs, strict=True):
                payload = it.payload if not isinstance(it.payload, bytearray) else memoryview(it.payload)
                if len(payload) >= cfg.large_frame_bytes:
                    key = f"{self._k_blob}{self.producer_id}:{seq}"
                    if seq not in self._blobs_sent:  # not again while waiting for room
                        if self._blob is not None:
                            await self._blob.set(key, payload, cfg.large_frame_ttl_s)
                        else:
                            pipe.set(key, payload, ex=cfg.large_frame_ttl_s)
                        self._blobs_sent.add(seq)
                    kind, value = "k", key
                else:
                    kind, value = "d", payload
                args += [seq, json.dumps(it.sample_ids), kind, value, len(payload)]
            keys = [self.k_stream, self._k_seq, *self._k_ledger]
            if len(pipe):  # large frames queued on redis-py (no blob connection): same round trip
                await self._s_put(keys=keys, args=args, client=pipe)
                res = (await pipe.execute())[-1]
            else:  # a plain EVALSHA: no SCRIPT EXISTS round trip first
                res = await self._s_put(keys=keys, args=args)
            gaps += int(res[0])
            status = res[1].decode()
            got = [x.decode() or None for x in res[2:]]
            ids += got
            for seq in cseqs[: len(got)]:
                self._blobs_sent.discard(seq)
            if status == "blob":  # a large frame vanished (e.g. Redis restarted without persistence)
                self._blobs_sent.difference_update(cseqs)  # the next attempt sends them again
            if status != "ok" or len(got) < len(chunk):
                break
        return PutOutcome(ids, gaps)

    # ------------------------------------------------------------------ get
    async def _ensure_group(self) -> None:
        if self._group_ready:
            return
        try:
            await self._r.xgroup_create(self.k_stream, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        others = [g["name"].decode() for g in await self._r.xinfo_groups(self.k_stream)
                  if g["name"].decode() != self.group]
        if others:  # acks delete entries: a second group would silently miss items
            raise QueueError(f"stream {self.stream!r} is already consumed by group(s) {others}; "
                             f"each stream has exactly one consumer group (got {self.group!r})")
        self._group_ready = True

    async def _xreadgroup(self, start: str, count: int, block_ms: int | None) -> list:
        await self._ensure_group()
        try:
            return await self._r.xreadgroup(self.group, self.consumer, {self.k_stream: start}, count=count, block=block_ms)
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self._group_ready = False  # Redis lost the group (restart without persistence)
            await self._ensure_group()
            return await self._r.xreadgroup(self.group, self.consumer, {self.k_stream: start}, count=count, block=block_ms)

    async def _read(self, max_items: int, timeout_s: float) -> list[RawLeased]:
        out: list[RawLeased] = []
        if self._recover:  # replies lost in a disconnect left entries in our pending list
            res = await self._xreadgroup("0", max_items + len(self._held), None)
            entries = [e for e in (res[0][1] if res else []) if e[0].decode() not in self._held]
            self._recover = False
            out = await self._load(entries[:max_items], redelivered=True)
            if out:
                return out
        block = int(min(timeout_s, self.cfg.op_timeout_s / 2) * 1000)
        res = await self._xreadgroup(">", max_items, block if block > 0 else None)
        return await self._load(res[0][1] if res else [], redelivered=False)

    async def _claim_idle(self, min_idle_s: float, max_items: int) -> list[RawLeased]:
        await self._ensure_group()
        entries: list = []
        wrapped = False
        while len(entries) < max_items:
            try:
                res = await self._r.xautoclaim(
                    self.k_stream, self.group, self.consumer, int(min_idle_s * 1000),
                    start_id=self._claim_cursor, count=max_items - len(entries),
                )
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                self._group_ready = False
                return []
            nxt = res[0].decode() if isinstance(res[0], bytes) else str(res[0])
            entries += [e for e in res[1] if e is not None and e[1]]
            self._claim_cursor = nxt
            if nxt == "0-0":
                if wrapped:
                    break
                wrapped = True
        return await self._load(entries, redelivered=True)

    async def _load(self, entries: list, *, redelivered: bool) -> list[RawLeased]:
        """Parse entries, fetch their large frames, and run the dedupe claim."""
        leased: list[RawLeased] = []
        blobs: list[tuple[RawLeased, str, int]] = []
        for eid_b, fields in entries:
            eid = eid_b.decode()
            r = RawLeased(id=eid, payload=b"", sample_ids=(), fresh=(), delivery_count=2 if redelivered else 1)
            leased.append(r)
            try:
                if not fields:
                    raise ValueError("entry has no fields (deleted)")
                r.producer = fields[b"p"].decode()
                r.seq = int(fields[b"s"])
                sids = json.loads(fields[b"i"])
                if not isinstance(sids, list) or not sids or not all(isinstance(s, str) and s for s in sids):
                    raise ValueError("field 'i' is not a non-empty JSON list of sample ids")
                r.sample_ids = tuple(sids)
                n = int(fields[b"n"])
                if n > self.cfg.max_frame_bytes:
                    raise ValueError(f"frame of {n} bytes exceeds max_frame_bytes")
                if b"d" in fields:
                    r.payload = fields[b"d"]
                    if len(r.payload) != n:
                        raise ValueError(f"inline frame has {len(r.payload)} bytes, entry says {n}")
                elif b"k" in fields:
                    key = fields[b"k"].decode()
                    if not key.startswith(self._k_blob):
                        raise ValueError(f"large-frame key {key!r} is outside this stream")
                    r.token = key
                    blobs.append((r, key, n))
                else:
                    raise ValueError("entry has neither 'd' nor 'k'")
            except (KeyError, ValueError, UnicodeDecodeError) as exc:
                r.error = f"{type(exc).__name__}: {exc}"
        if blobs:
            if self._blob is not None:
                values = await self._blob.get_many([key for _, key, _ in blobs], self.cfg.max_frame_bytes)
            else:
                pipe = self._r.pipeline(transaction=False)
                for _, key, _ in blobs:
                    pipe.get(key)
                values = await pipe.execute()
            for (r, key, n), data in zip(blobs, values, strict=True):
                if data is None:
                    r.error = f"large frame {key} is missing (expired?)"
                elif len(data) != n:
                    r.error = f"large frame has {len(data)} bytes, entry says {n}"
                else:
                    r.payload = data
        good = [r for r in leased if r.error is None]
        if good:
            pairs = json.dumps([[r.id, r.sample_ids] for r in good])
            flags = await self._s_claim(keys=list(self._k_claims), args=[self.cfg.dedupe_window, pairs])
            for r, f in zip(good, flags, strict=True):
                r.fresh = tuple(c == 49 for c in f)  # b"1"
        for r in good:
            self._held.add(r.id)
        return leased

    # ------------------------------------------------------------------ ack / depth / ledger
    async def _ack_once(self, items: Sequence[RawLeased], stage: str | None) -> int:
        blobs = [r.token for r in items if isinstance(r.token, str)]
        sids = [s for r in items for s, f in zip(r.sample_ids, r.fresh, strict=False) if f] if stage else []
        args = [self.group, stage or "", self.cfg.ledger_max_entries, json.dumps([r.id for r in items]),
                json.dumps(blobs), json.dumps(sids)]
        total = int(await self._s_ack(keys=[self.k_stream, *self._k_ledger], args=args))
        for r in items:
            self._held.discard(r.id)
        return total

    async def _depth_once(self) -> int:
        return int(await self._r.xlen(self.k_stream))

    async def _record_once(self, sample_ids: Sequence[str], stage: str) -> None:
        for start in range(0, len(sample_ids), 2000):
            await self._s_ledger(keys=list(self._k_ledger),
                                 args=[stage, self.cfg.ledger_max_entries, *sample_ids[start : start + 2000]])

    async def _stages_once(self, sample_ids: Sequence[str]) -> list[str | None]:
        vals = await self._r.hmget(self._k_ledger[0], list(sample_ids))
        return [v.decode() if v is not None else None for v in vals]
