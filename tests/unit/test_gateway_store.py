"""The job store on SQLite: migrations, rows, metric points."""

from __future__ import annotations

import sqlite3

import pytest

from gateway_svc.store import MIGRATIONS, SCHEMA_VERSION, JobRow, JobStore, StoreError, open_store


def test_migrations_run_once_in_order(tmp_path):
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    store = JobStore(url)
    assert store.version() == 0
    assert store.migrate() == SCHEMA_VERSION == len(MIGRATIONS)
    assert open_store(url).version() == SCHEMA_VERSION  # re-opening applies nothing twice
    rows = sqlite3.connect(tmp_path / "jobs.db").execute("SELECT version FROM schema_version ORDER BY version")
    assert [r[0] for r in rows] == list(range(1, SCHEMA_VERSION + 1))


def test_upgrade_from_version_one_keeps_rows(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    conn = sqlite3.connect(tmp_path / "old.db")
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    for stmt in MIGRATIONS[0]:
        conn.execute(stmt)
    conn.execute("INSERT INTO schema_version VALUES (1)")
    conn.execute(
        "INSERT INTO jobs VALUES ('old-1', 'old', 'succeeded', 'name: old', '[]', 'local', '{}', '', 0, 1.0, 2.0)"
    )
    conn.commit()
    conn.close()
    store = open_store(url)
    row = store.get("old-1")
    assert row is not None and row.state == "succeeded" and row.progress == {}
    store.add_point("old-1", {"step": 1})
    assert store.points("old-1")[0][1] == {"step": 1}


def test_refuses_a_newer_schema(tmp_path):
    url = f"sqlite:///{tmp_path / 'new.db'}"
    open_store(url)
    conn = sqlite3.connect(tmp_path / "new.db")
    conn.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="newer"):
        open_store(url)


@pytest.mark.parametrize("url", ["sqlite:///:memory:", "mysql://x/y", "sqlite://"])
def test_bad_urls_are_refused_clearly(url):
    with pytest.raises(StoreError):
        JobStore(url)


def test_rows_roundtrip_list_update_points(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'j.db'}")
    for i in range(3):
        store.insert(JobRow(id=f"j-{i}", name="j", state="running", spec_yaml="name: j",
                            overrides=["a.b=1"], handle={"pid": i}, created_at=100.0 + i))  # fmt: skip
    assert [r.id for r in store.list()] == ["j-2", "j-1", "j-0"]  # newest first
    assert [r.id for r in store.list(limit=1, offset=1)] == ["j-1"]
    store.update("j-1", state="paused", progress={"step": 3})
    row = store.get("j-1")
    assert (row.state, row.progress, row.handle, row.overrides) == ("paused", {"step": 3}, {"pid": 1}, ["a.b=1"])
    assert [r.id for r in store.list(state="paused")] == ["j-1"]
    assert store.get("nope") is None
    for ts in (1.0, 2.0, 3.0):
        store.add_point("j-0", {"step": int(ts)}, ts=ts)
    assert [p[1]["step"] for p in store.points("j-0")] == [1, 2, 3]
    assert [p[1]["step"] for p in store.points("j-0", since=1.5)] == [2, 3]
    assert [p[1]["step"] for p in store.points("j-0", limit=2)] == [2, 3]  # the newest, oldest first
    with pytest.raises(KeyError):
        store.update("j-0", bogus=1)
