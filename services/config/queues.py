"""Queue configuration: which backend carries the streams, and how it behaves.

``QueueConfig`` is a discriminated union on ``type``:

* ``redis``    -- Redis Streams (``RedisQueueConfig``): a Redis server reachable by URL.
* ``embedded`` -- the gRPC QueueService hosted by the job's controller
  (``EmbeddedQueueConfig``), so a single machine needs no Redis.

Both share the delivery semantics in ``QueueCommon`` (backpressure depth, lease and
reclaim, dedupe window, ledger size, deadlines). Imports only pydantic.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter, model_validator

from services.config.base import StrictModel

MiB = 1 << 20


class QueueCommon(StrictModel):
    """Delivery semantics shared by every backend."""

    max_depth: int = Field(
        1024,
        ge=1,
        le=10_000_000,
        description="Backpressure: a producer's put waits while the stream holds this many "
        "unacknowledged items (queued + leased).",
    )
    put_timeout_s: float = Field(
        300.0,
        gt=0,
        le=86_400,
        description="Default deadline of put(): how long a producer waits for room in a full "
        "stream (and for reconnects) before raising QueueFullError / QueueUnavailableError.",
    )
    op_timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Deadline of one network call to the backend (excluding get()'s own wait).",
    )
    lease_idle_s: float = Field(
        60.0,
        ge=0,
        le=86_400,
        description="An item leased to a consumer and not acked for this long is taken over "
        "by the next consumer that calls get() (automatic reclaim). 0 disables automatic "
        "reclaim; reclaim(min_idle) still works. Set it above the longest processing time.",
    )
    dedupe_window: int = Field(
        200_000,
        ge=1,
        le=100_000_000,
        description="How many sample_ids each consumer group remembers to drop duplicates "
        "(oldest forgotten first).",
    )
    ledger_max_entries: int = Field(
        200_000,
        ge=1,
        le=100_000_000,
        description="How many sample_ids the sample ledger keeps a stage for (oldest first out).",
    )
    max_frame_bytes: int = Field(
        1 << 30,
        ge=1024,
        le=1 << 31,
        description="Largest frame a put accepts and a get decodes, in bytes.",
    )
    reconnect_backoff_initial_s: float = Field(
        0.05, gt=0, le=60, description="First wait before retrying a call after a connection error."
    )
    reconnect_backoff_max_s: float = Field(
        2.0, gt=0, le=600, description="Longest wait between retries (the wait doubles up to this)."
    )

    @model_validator(mode="after")
    def _check_backoff(self) -> "QueueCommon":
        if self.reconnect_backoff_initial_s > self.reconnect_backoff_max_s:
            raise ValueError("reconnect_backoff_initial_s must not exceed reconnect_backoff_max_s")
        return self


class RedisQueueConfig(QueueCommon):
    """Redis Streams with one consumer group per consuming stage."""

    type: Literal["redis"] = Field("redis", description="Backend selector.")
    url: str = Field(
        "redis://127.0.0.1:6379/0",
        min_length=8,
        pattern=r"^(redis|rediss|unix)://",
        description="REDIS_URL-style address: redis://[user:pass@]host:port/db, rediss:// for TLS, "
        "or unix:///path/to/socket.",
    )
    username: str | None = Field(None, description="ACL user name (overrides the one in the URL).")
    password: str | None = Field(
        None, description="Password (overrides the URL's); prefer password_env for secrets.", repr=False
    )
    password_env: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Name of an environment variable holding the password (read at connect time).",
    )
    tls: bool = Field(False, description="Use TLS (implied by a rediss:// URL).")
    tls_ca_file: str | None = Field(None, description="CA bundle to verify the server with.")
    tls_cert_file: str | None = Field(None, description="Client certificate (mutual TLS).")
    tls_key_file: str | None = Field(None, description="Client private key (mutual TLS).")
    tls_verify: bool = Field(True, description="Verify the server certificate and host name.")
    namespace: str = Field(
        "meshrl",
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="Prefix of every Redis key this job uses (one namespace per job).",
    )
    large_frame_bytes: int = Field(
        256 * 1024,
        ge=0,
        le=1 << 31,
        description="Frames at least this large are stored in their own key beside the stream "
        "entry, so the stream stays small. 0 stores every frame aside.",
    )
    large_frame_ttl_s: int = Field(
        7 * 86_400,
        ge=60,
        le=365 * 86_400,
        description="Expiry of a large-frame key (a safety net: acked frames are deleted at once).",
    )
    producer_seq_ttl_s: int = Field(
        7 * 86_400,
        ge=60,
        le=365 * 86_400,
        description="How long a producer's last sequence number is remembered after its last put.",
    )

    @model_validator(mode="after")
    def _check_tls(self) -> "RedisQueueConfig":
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file must be given together")
        if self.password is not None and self.password_env is not None:
            raise ValueError("give password or password_env, not both")
        return self


class EmbeddedQueueConfig(QueueCommon):
    """The gRPC QueueService hosted by the job's controller (in memory + optional append-only file)."""

    type: Literal["embedded"] = Field("embedded", description="Backend selector.")
    address: str = Field(
        "127.0.0.1:50070",
        pattern=r"^[^\s:]+:\d{1,5}$",
        description="host:port of the broker (clients connect here; the host binds its port).",
    )
    chunk_bytes: int = Field(
        2 * MiB,
        ge=4096,
        le=64 * MiB,
        description="Frames are streamed over gRPC in chunks of this many bytes.",
    )
    aof_path: str | None = Field(
        None,
        description="Broker host only: append-only file; with it a restart of the host loses "
        "nothing that was acknowledged to a producer. None keeps state in memory only.",
    )
    aof_fsync: bool = Field(
        False,
        description="Broker host only: fsync the append-only file before acknowledging "
        "(survives a machine crash, not only a process crash; slower).",
    )


QueueConfig = Annotated[RedisQueueConfig | EmbeddedQueueConfig, Field(discriminator="type")]
"""The ``queues:`` block of a job spec: ``{"type": "redis", ...}`` or ``{"type": "embedded", ...}``."""

_ADAPTER: TypeAdapter = TypeAdapter(QueueConfig)


def parse_queue_config(data: dict) -> RedisQueueConfig | EmbeddedQueueConfig:
    """Validate a plain dict (e.g. from YAML) into the right backend config."""
    return _ADAPTER.validate_python(data)


__all__ = ["QueueCommon", "QueueConfig", "RedisQueueConfig", "EmbeddedQueueConfig", "parse_queue_config"]
