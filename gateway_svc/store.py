"""The gateway's job store: SQLite by default, PostgreSQL by URL, plain DB-API.

    store = open_store("sqlite:///var/meshrl/jobs.db")      # or "postgresql://user@host/db"
    store.insert(JobRow(...)); store.get(job_id); store.list(); store.update(job_id, state=...)
    store.add_point(job_id, point); store.points(job_id, since=0.0)

Schema changes are ordered migration steps (``MIGRATIONS``); the ``schema_version`` table
records the last one applied, and :func:`open_store` applies the missing ones in one
transaction each. Never edit a released step: append a new one.

One connection per operation keeps the store thread-safe (FastAPI runs handlers in a
thread pool) and makes a restarted database server harmless.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from gateway_svc.redact import redact_text

#: Ordered schema steps; index + 1 is the version each one brings the database to.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE jobs (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            state TEXT NOT NULL,
            spec_yaml TEXT NOT NULL,
            overrides TEXT NOT NULL,
            launcher TEXT NOT NULL,
            handle TEXT NOT NULL,
            detail TEXT NOT NULL,
            exit_code INTEGER,
            created_at DOUBLE PRECISION NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL
        )""",
        "CREATE INDEX jobs_created ON jobs (created_at)",
    ),
    (
        "ALTER TABLE jobs ADD COLUMN progress TEXT NOT NULL DEFAULT '{}'",
        """CREATE TABLE job_points (
            job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
            ts DOUBLE PRECISION NOT NULL,
            data TEXT NOT NULL
        )""",
        "CREATE INDEX job_points_job_ts ON job_points (job_id, ts)",
    ),
    (
        """CREATE TABLE job_events (
            job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
            ts DOUBLE PRECISION NOT NULL,
            kind TEXT NOT NULL,
            detail TEXT NOT NULL
        )""",
        "CREATE INDEX job_events_job_ts ON job_events (job_id, ts)",
    ),
)

SCHEMA_VERSION = len(MIGRATIONS)
_COLUMNS = (
    "id", "name", "state", "spec_yaml", "overrides", "launcher", "handle",
    "detail", "exit_code", "created_at", "updated_at", "progress",
)  # fmt: skip


class StoreError(RuntimeError):
    """The database could not be opened or is newer than this code understands."""


@dataclass
class JobRow:
    """One job as stored. ``handle`` is the launcher's opaque JSON-able dict."""

    id: str
    name: str
    state: str
    spec_yaml: str
    overrides: list[str] = field(default_factory=list)
    launcher: str = "local"
    handle: dict[str, Any] = field(default_factory=dict)
    detail: str = ""
    exit_code: int | None = None
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    progress: dict[str, Any] = field(default_factory=dict)

    def _values(self) -> tuple[Any, ...]:
        return (
            self.id, self.name, self.state, self.spec_yaml, json.dumps(self.overrides), self.launcher,
            json.dumps(self.handle), self.detail, self.exit_code, self.created_at, self.updated_at,
            json.dumps(self.progress),
        )  # fmt: skip

    @classmethod
    def _from(cls, row: Sequence[Any]) -> "JobRow":
        d = dict(zip(_COLUMNS, row))
        for key in ("overrides", "handle", "progress"):
            d[key] = json.loads(d[key])
        return cls(**d)


_JSON_FIELDS = {"overrides", "handle", "progress"}


class JobStore:
    """Jobs and their metric points in one SQL database (SQLite or PostgreSQL)."""

    def __init__(self, url: str) -> None:
        self.url = url
        parsed = urlparse(url)
        if parsed.scheme == "sqlite":
            # sqlite:///relative.db, sqlite:////abs/path.db, sqlite:///:memory: is refused (one conn per op)
            path = url[len("sqlite:///") :] if url.startswith("sqlite:///") else ""
            if not path or path == ":memory:":
                raise StoreError(f"{url!r}: give a file, e.g. sqlite:///jobs.db (in-memory databases are not shared)")
            self.kind = "sqlite"
            self._path = Path(path)
            self._path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            # the database holds every job's spec: the gateway's user only, whatever the umask
            # (SQLite gives its journal and WAL files the database file's mode)
            os.close(os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600))
            os.chmod(self._path, 0o600)
        elif parsed.scheme in ("postgresql", "postgres", "postgresql+psycopg"):
            self.kind = "postgresql"
            self._dsn = url.replace("postgresql+psycopg://", "postgresql://", 1)
        else:
            raise StoreError(f"unsupported database URL {url!r}: use sqlite:///PATH or postgresql://...")

    # -- plumbing ---------------------------------------------------------------------------------------------

    @contextmanager
    def _conn(self) -> Iterator[Any]:
        """A connection in one transaction: committed on success, rolled back on error."""
        if self.kind == "sqlite":
            conn = sqlite3.connect(self._path, timeout=10.0)
            conn.execute("PRAGMA foreign_keys = ON")
        else:
            import psycopg

            try:
                conn = psycopg.connect(self._dsn, connect_timeout=10)
            except psycopg.OperationalError as exc:
                raise StoreError(f"cannot connect to {self._redacted()}: {exc}") from None
        try:
            yield conn
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        finally:
            conn.close()

    def _redacted(self) -> str:
        p = urlparse(self.url)
        return self.url.replace(p.password, "***") if p.password else self.url

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.kind == "postgresql" else sql

    def _exec(self, conn: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        cur = conn.cursor()
        cur.execute(self._sql(sql), tuple(params))
        return cur

    # -- migrations -------------------------------------------------------------------------------------------

    def version(self) -> int:
        """The schema version of the database (0 when empty)."""
        with self._conn() as conn:
            return self._version(conn)

    def _version(self, conn: Any) -> int:
        self._exec(conn, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = self._exec(conn, "SELECT MAX(version) FROM schema_version").fetchone()
        return int(row[0] or 0)

    def migrate(self) -> int:
        """Apply every missing migration step, each in its own transaction; return the version."""
        while True:
            with self._conn() as conn:
                if self.kind == "postgresql":  # serialise concurrent gateways migrating one database
                    self._exec(conn, "SELECT pg_advisory_xact_lock(4242)")
                current = self._version(conn)
                if current > SCHEMA_VERSION:
                    raise StoreError(
                        f"database schema version {current} is newer than this meshrl ({SCHEMA_VERSION}); upgrade meshrl"
                    )
                if current == SCHEMA_VERSION:
                    return current
                for stmt in MIGRATIONS[current]:
                    self._exec(conn, stmt)
                self._exec(conn, "INSERT INTO schema_version (version) VALUES (?)", (current + 1,))

    # -- jobs -------------------------------------------------------------------------------------------------

    def insert(self, job: JobRow) -> None:
        cols = ", ".join(_COLUMNS)
        marks = ", ".join("?" for _ in _COLUMNS)
        with self._conn() as conn:
            self._exec(conn, f"INSERT INTO jobs ({cols}) VALUES ({marks})", job._values())

    def get(self, job_id: str) -> JobRow | None:
        with self._conn() as conn:
            row = self._exec(conn, f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return JobRow._from(row) if row else None

    def list(self, *, state: str | None = None, limit: int = 100, offset: int = 0) -> list[JobRow]:
        """Newest first."""
        where, params = ("WHERE state = ?", [state]) if state else ("", [])
        sql = f"SELECT {', '.join(_COLUMNS)} FROM jobs {where} ORDER BY created_at DESC, id LIMIT ? OFFSET ?"
        with self._conn() as conn:
            rows = self._exec(conn, sql, [*params, limit, offset]).fetchall()
        return [JobRow._from(r) for r in rows]

    def update(self, job_id: str, **changes: Any) -> None:
        """Set the given columns (and ``updated_at``)."""
        unknown = set(changes) - set(_COLUMNS)
        if unknown:
            raise KeyError(f"unknown job columns {sorted(unknown)}")
        changes.setdefault("updated_at", time.time())
        if isinstance(changes.get("detail"), str):
            changes["detail"] = redact_text(changes["detail"])
        values = [json.dumps(v) if k in _JSON_FIELDS else v for k, v in changes.items()]
        sets = ", ".join(f"{k} = ?" for k in changes)
        with self._conn() as conn:
            self._exec(conn, f"UPDATE jobs SET {sets} WHERE id = ?", [*values, job_id])

    # -- metric points ----------------------------------------------------------------------------------------

    def add_point(self, job_id: str, data: dict[str, Any], ts: float | None = None) -> None:
        with self._conn() as conn:
            self._exec(
                conn,
                "INSERT INTO job_points (job_id, ts, data) VALUES (?, ?, ?)",
                (job_id, time.time() if ts is None else ts, json.dumps(data)),
            )

    def points(self, job_id: str, *, since: float = 0.0, limit: int = 2000) -> list[tuple[float, dict[str, Any]]]:
        """The newest ``limit`` points after ``since``, oldest first."""
        sql = "SELECT ts, data FROM job_points WHERE job_id = ? AND ts > ? ORDER BY ts DESC LIMIT ?"
        with self._conn() as conn:
            rows = self._exec(conn, sql, (job_id, since, limit)).fetchall()
        return [(float(ts), json.loads(data)) for ts, data in reversed(rows)]


    # -- events -----------------------------------------------------------------------------------------------

    def add_event(self, job_id: str, kind: str, detail: str = "", ts: float | None = None) -> None:
        """Record one lifecycle event (``submitted``, ``queued``, ``started``, ``paused``, ...)."""
        with self._conn() as conn:
            self._exec(
                conn,
                "INSERT INTO job_events (job_id, ts, kind, detail) VALUES (?, ?, ?, ?)",
                (job_id, time.time() if ts is None else ts, kind, redact_text(detail)),
            )

    def events(self, job_id: str, *, since: float = 0.0, limit: int = 1000) -> list[dict[str, Any]]:
        """The job's events after ``since``, oldest first (at most ``limit``, the oldest ones)."""
        sql = "SELECT ts, kind, detail FROM job_events WHERE job_id = ? AND ts > ? ORDER BY ts, kind LIMIT ?"
        with self._conn() as conn:
            rows = self._exec(conn, sql, (job_id, since, limit)).fetchall()
        return [{"ts": float(ts), "kind": kind, "detail": detail} for ts, kind, detail in rows]

    def count(self, states: Sequence[str]) -> int:
        """How many jobs are in one of ``states``."""
        marks = ", ".join("?" for _ in states)
        with self._conn() as conn:
            row = self._exec(conn, f"SELECT COUNT(*) FROM jobs WHERE state IN ({marks})", list(states)).fetchone()
        return int(row[0])

    def oldest(self, state: str, *, limit: int = 100) -> list[JobRow]:
        """Jobs in ``state``, oldest first (the queue of submitted jobs is FIFO)."""
        sql = f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE state = ? ORDER BY created_at, id LIMIT ?"
        with self._conn() as conn:
            rows = self._exec(conn, sql, (state, limit)).fetchall()
        return [JobRow._from(r) for r in rows]


def open_store(url: str) -> JobStore:
    """Open (and migrate) the store at ``url``."""
    store = JobStore(url)
    store.migrate()
    return store
