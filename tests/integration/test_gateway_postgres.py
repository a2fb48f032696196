"""The job store and the gateway on a real PostgreSQL (127.0.0.1:5432), in a throwaway
database this test creates and drops. Set MESHRL_TEST_PG to point elsewhere."""

from __future__ import annotations

import os
import secrets

import httpx
import psycopg
import pytest

from gateway_svc.store import SCHEMA_VERSION, JobRow, JobStore, open_store
from tests.integration.gateway_support import VALID_SPEC, auth, fake_launcher, running_gateway, wait_until

pytestmark = pytest.mark.timeout(120)
ADMIN_URL = os.environ.get("MESHRL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture
def pg_url():
    """A fresh, uniquely named database, dropped afterwards (even if the test fails)."""
    name = f"meshrl_gw_{secrets.token_hex(6)}"
    with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=10) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=10) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_postgres_store_migrates_and_roundtrips(pg_url):
    store = JobStore(pg_url)
    assert store.version() == 0
    assert store.migrate() == SCHEMA_VERSION
    assert open_store(pg_url).version() == SCHEMA_VERSION
    store.insert(JobRow(id="p-1", name="p", state="running", spec_yaml="name: p", handle={"pid": 1}, created_at=5.0))
    store.insert(JobRow(id="p-2", name="p", state="failed", spec_yaml="name: p", created_at=6.0))
    store.update("p-1", state="paused", progress={"step": 2, "queues": {"prompts": 3}})
    row = store.get("p-1")
    assert (row.state, row.progress["queues"], row.handle) == ("paused", {"prompts": 3}, {"pid": 1})
    assert [r.id for r in store.list()] == ["p-2", "p-1"]
    store.add_point("p-1", {"step": 1}, ts=1.0)
    store.add_point("p-1", {"step": 2}, ts=2.0)
    assert [d["step"] for _, d in store.points("p-1", since=1.0)] == [2]
    store.add_event("p-1", "submitted", ts=1.0)
    store.add_event("p-1", "restarted", "reward-0 (restart 1)", ts=3.0)
    store.add_event("p-2", "finished", "failed: boom", ts=2.0)
    assert store.events("p-1") == [{"ts": 1.0, "kind": "submitted", "detail": ""},
                                   {"ts": 3.0, "kind": "restarted", "detail": "reward-0 (restart 1)"}]  # fmt: skip
    assert [e["kind"] for e in store.events("p-1", since=1.0)] == ["restarted"]
    assert store.count(["paused", "failed"]) == 2 and [r.id for r in store.oldest("paused")] == ["p-1"]
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] == SCHEMA_VERSION


def test_unreachable_postgres_is_a_clear_error():
    from gateway_svc.store import StoreError

    with pytest.raises(StoreError, match="cannot connect"):
        JobStore("postgresql://nobody:secret@127.0.0.1:1/none").version()


def test_gateway_runs_a_job_with_jobs_in_postgres(tmp_path, pg_url):
    with running_gateway(tmp_path, fake_launcher(FAKE_STEPS=3, FAKE_INTERVAL=0.02), db_url=pg_url) as gw, \
            httpx.Client(base_url=gw.http_url, timeout=10) as c:  # fmt: skip
        r = c.post("/v1/jobs", json={"spec": VALID_SPEC}, headers=auth())
        assert r.status_code == 201, r.text
        jid = r.json()["id"]
        wait_until(lambda: c.get(f"/v1/jobs/{jid}", headers=auth()).json()["state"] == "succeeded", what="success")
        assert c.get(f"/v1/jobs/{jid}/metrics", headers=auth()).json()["points"]
        wait_until(lambda: [e["kind"] for e in c.get(f"/v1/jobs/{jid}/events", headers=auth()).json()["events"]]
                   == ["submitted", "started", "finished"], what="events in PostgreSQL")  # fmt: skip
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM job_events WHERE job_id = %s", (jid,)).fetchone()[0] == 3
        assert conn.execute("SELECT state FROM jobs WHERE id = %s", (jid,)).fetchone()[0] == "succeeded"
