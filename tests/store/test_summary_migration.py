"""Stores written before sessions kept a summary are upgraded when opened: SQLite
schema 3 -> 4 (the meta leaves the row every commit rewrites; then 4 -> 5) and PostgreSQL
schema 2 -> 3; each session's summary is counted from its log, as the commits
would have kept it, and nothing else changes."""

from __future__ import annotations

import os
import sqlite3
import uuid
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from saucer.store import open_store
from saucer.store.model import Event
from saucer.store.summary import ListQuery, SummaryDelta

POSTGRES_ENV = "SAUCER_TEST_POSTGRES_URL"

# The tables of SQLite schema 3, as saucer wrote them before the summary.
_SQLITE_3 = """
CREATE TABLE saucer_schema (version INTEGER NOT NULL);
CREATE TABLE saucer_format (one INTEGER PRIMARY KEY CHECK (one = 1), newest INTEGER NOT NULL);
CREATE TABLE sessions (session_id TEXT PRIMARY KEY, head INTEGER NOT NULL, created_at REAL NOT NULL,
    updated_at REAL NOT NULL, parent_id TEXT, parent_version INTEGER, meta TEXT NOT NULL DEFAULT '{}');
CREATE TABLE events (session_id TEXT NOT NULL, version INTEGER NOT NULL, ts REAL NOT NULL, author TEXT NOT NULL,
    round INTEGER, step INTEGER, payload BLOB NOT NULL, crc INTEGER, PRIMARY KEY (session_id, version)) WITHOUT ROWID;
CREATE TABLE events_recent (session_id TEXT NOT NULL, version INTEGER NOT NULL, ts REAL NOT NULL,
    author TEXT NOT NULL, round INTEGER, step INTEGER, payload BLOB NOT NULL, crc INTEGER);
CREATE TABLE snapshots (session_id TEXT NOT NULL, version INTEGER NOT NULL, ts REAL NOT NULL, state BLOB NOT NULL,
    crc INTEGER, PRIMARY KEY (session_id, version)) WITHOUT ROWID;
CREATE TABLE leases (session_id TEXT PRIMARY KEY, owner TEXT NOT NULL, token INTEGER NOT NULL, expires_at REAL NOT NULL);
INSERT INTO saucer_schema VALUES (3);
INSERT INTO saucer_format VALUES (1, 2);
"""

PLAN = {"steps": [{"command": "echo " + "x" * 40}] * 50}
META = {"task": "Tidy", "mode": "follower", "request": "tidy up", "status": "running", "plan": PLAN}


def _events(sid: str) -> list[Event]:
    """An engine-shaped log: start, two steps (one unpriced) each with its round end, an end."""
    metas: list[tuple[int | None, int | None, dict[str, Any]]] = [
        (None, None, {"kind": "session_start", "session_status": "running"}),
        (1, 1, {"kind": "step", "cost": 0.25, "session_status": "running"}),
        (1, None, {"kind": "round_end", "cost": 0.25, "reason": "ok", "session_status": "running"}),
        (2, 2, {"kind": "step", "cost": 0.5, "session_status": "running"}),
        (2, None, {"kind": "round_end", "cost": 0.5, "reason": "round 2 ok", "session_status": "running"}),
    ]
    return [
        Event(sid, i + 1, 1000.0 + i, "agent", rnd, step, [{"op": "set", "var": "i", "value": i}], meta)
        for i, (rnd, step, meta) in enumerate(metas)
    ]


def _rows(sid: str, events: list[Event]) -> list[tuple[Any, ...]]:
    """The rows of ``events`` as saucer wrote them before format 6: no summary delta, only the meta."""
    rows = []
    for e in events:
        payload = orjson.dumps({"v": 5, "ops": e.ops, "meta": e.meta})
        rows.append((sid, e.version, e.timestamp, e.author, e.round, e.step, payload, zlib.crc32(payload)))
    return rows


def test_an_sqlite_schema_3_file_is_upgraded_and_its_summaries_counted(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(_SQLITE_3)
        conn.execute(
            "INSERT INTO sessions VALUES ('run', 5, 1000, 1004, NULL, NULL, ?)", (orjson.dumps(META).decode(),)
        )
        rows = _rows("run", _events("run"))
        conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows[:3])  # folded
        conn.executemany("INSERT INTO events_recent VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows[3:])  # not yet
        conn.execute(
            """INSERT INTO sessions VALUES ('fork', 3, 1005, 1006, 'run', 3, '{"forked_from": "run", "at": 3}')"""
        )
        torn = _rows("torn", _events("torn")[:2])
        torn[-1] = (*torn[-1][:6], b"{not json", 1)  # a damaged trailing record
        conn.execute(
            "INSERT INTO sessions VALUES ('torn', 2, 1000, 1001, NULL, NULL, ?)", (orjson.dumps(META).decode(),)
        )
        conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", torn)
    with open_store(f"sqlite:///{path}") as store:
        assert store.session_info("run").meta == META and store.session_info("fork").parent_version == 3
        run, fork, torn_row = (store.list_sessions(ids=[s])[0] for s in ("run", "fork", "torn"))
        assert (run.task, run.mode, run.request, run.status) == ("Tidy", "follower", "tidy up", "interrupted")
        assert (run.rounds, run.steps, run.cost, run.reason, run.version, run.updated_at) == (
            2,
            2,
            0.75,
            "round 2 ok",
            5,
            1004,
        )
        assert (fork.rounds, fork.steps, fork.cost, fork.origin) == (1, 1, 0.25, "run@3")
        assert (torn_row.steps, torn_row.rounds) == (0, 0)  # its damaged record is not counted
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert store.list_sessions() == store.summaries.folded(ListQuery.of())
            assert [e.version for e in store.read("run")] == [1, 2, 3, 4, 5]
        v = store.append(
            "run",
            5,
            [],
            author="system",
            meta={
                "kind": "session_end",
                "session_status": "finished",
                "summary": {"status": "finished", "rounds": 2, "steps": 2, "cost": 0.75, "reason": "done"},
            },
            summary=SummaryDelta("finished", final_rounds=2, final_steps=2, final_cost=0.75, reason="done"),
        )
        assert v.version == 6 and store.list_sessions(ids=["run"])[0].status == "finished"
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM saucer_schema").fetchone() == (5,)  # 3 -> 4 -> 5
        assert dict(conn.execute("SELECT session_id, plan IS NOT NULL FROM session_meta")) == {
            "run": 1,
            "fork": 0,
            "torn": 1,
        }
        columns = [row[1] for row in conn.execute("PRAGMA table_info(sessions)")]
        assert "meta" not in columns and "steps" in columns  # a commit no longer rewrites the meta
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'sessions_v3'").fetchone() == (0,)


@pytest.fixture
def pg_base() -> Iterator[tuple[str, str]]:
    base = os.environ.get(POSTGRES_ENV)
    if not base:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{POSTGRES_ENV} is not set under CI=true")
        pytest.skip(f"set {POSTGRES_ENV}=postgresql://postgres@127.0.0.1:5432/test")
    import psycopg

    schema = "t_sum_" + uuid.uuid4().hex[:12]
    try:
        yield base, schema
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_a_postgres_schema_2_is_upgraded_and_its_summaries_counted(pg_base: tuple[str, str]) -> None:
    import psycopg

    from saucer.store import _postgres_conn as pc
    from saucer.store.postgres import SCHEMA_VERSION as PG_SCHEMA_VERSION

    base, schema = pg_base
    s = pc.quote(schema)
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {s}")
        conn.execute(
            f"CREATE TABLE {s}.saucer_schema (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for version, statements in enumerate(pc._MIGRATIONS[:2], start=1):
            for statement in statements:
                assert isinstance(statement, str)
                conn.execute(statement.format(s=s))
            conn.execute(f"INSERT INTO {s}.saucer_schema (version) VALUES (%s)", (version,))
        conn.execute(f"INSERT INTO {s}.saucer_format VALUES (true, 2)")
        conn.execute(
            f"INSERT INTO {s}.sessions VALUES ('run', 5, 1000, 1004, NULL, NULL, %s)", (orjson.dumps(META).decode(),)
        )
        conn.execute(
            f"""INSERT INTO {s}.sessions VALUES ('fork', 3, 1005, 1006, 'run', 3, '{{"forked_from": "run", "at": 3}}')"""
        )
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {s}.events VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", _rows("run", _events("run"))
            )
    with open_store(f"{base}{'&' if '?' in base else '?'}schema={schema}") as store:
        run, fork = (store.list_sessions(ids=[sid])[0] for sid in ("run", "fork"))
        assert (run.task, run.mode, run.status, run.rounds, run.steps, run.cost, run.reason) == (
            "Tidy",
            "follower",
            "interrupted",
            2,
            2,
            0.75,
            "round 2 ok",
        )
        assert (fork.rounds, fork.steps, fork.cost, fork.origin) == (1, 1, 0.25, "run@3")
        assert store.list_sessions() == store.summaries.folded(ListQuery.of())
        assert store.session_info("run").meta == META
        assert store.schema_version() == PG_SCHEMA_VERSION  # type: ignore[attr-defined]
