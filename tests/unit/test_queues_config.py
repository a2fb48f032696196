"""QueueConfig: the discriminated union, bounds, and cross-field checks."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.config.queues import EmbeddedQueueConfig, QueueCommon, RedisQueueConfig, parse_queue_config


def test_type_selects_the_backend():
    r = parse_queue_config({"type": "redis", "url": "rediss://user:pw@h:6380/2", "max_depth": 8})
    e = parse_queue_config({"type": "embedded", "address": "controller:50070", "aof_path": "/tmp/q.aof"})
    assert isinstance(r, RedisQueueConfig) and r.max_depth == 8
    assert isinstance(e, EmbeddedQueueConfig) and e.aof_path == "/tmp/q.aof"
    with pytest.raises(ValidationError):
        parse_queue_config({"type": "kafka"})


@pytest.mark.parametrize("bad", [
    {"type": "redis", "max_depth": 0},
    {"type": "redis", "url": "http://localhost:6379"},
    {"type": "redis", "lease_idle_s": -1},
    {"type": "redis", "maxdepth": 5},  # typo: extra keys are refused
    {"type": "redis", "tls_cert_file": "c.pem"},  # cert without key
    {"type": "redis", "password": "x", "password_env": "REDIS_PW"},
    {"type": "redis", "reconnect_backoff_initial_s": 5, "reconnect_backoff_max_s": 1},
    {"type": "embedded", "address": "no-port"},
    {"type": "embedded", "chunk_bytes": 10},
    {"type": "embedded", "large_frame_bytes": 1000},  # a redis-only field
])
def test_bad_values_fail_loudly(bad):
    with pytest.raises(ValidationError):
        parse_queue_config(bad)


def test_every_field_is_described():
    for cls in (QueueCommon, RedisQueueConfig, EmbeddedQueueConfig):
        for name, f in cls.model_fields.items():
            assert f.description, f"{cls.__name__}.{name} has no description"


def test_password_env_is_read_at_connect_time(monkeypatch):
    from services.queues.redis_backend import make_redis_client

    cfg = RedisQueueConfig(url="redis://127.0.0.1:1/0", password_env="MESHRL_TEST_REDIS_PW")
    monkeypatch.delenv("MESHRL_TEST_REDIS_PW", raising=False)
    with pytest.raises(ValueError, match="MESHRL_TEST_REDIS_PW"):
        make_redis_client(cfg)
    monkeypatch.setenv("MESHRL_TEST_REDIS_PW", "s3cret")
    client = make_redis_client(cfg)
    assert client.connection_pool.connection_kwargs["password"] == "s3cret"
