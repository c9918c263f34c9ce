"""The upgrades of an SQLite store's file that move data (run inside the
migration's write transaction, see ``_sqlite_schema.migrate``)."""

from __future__ import annotations

import sqlite3
from typing import Any

import orjson

from saucer.store._sqlite_sql import split_plan
from saucer.store._summarise import count_sessions
from saucer.store.summary import brief_of

__all__ = ["upgrade_to_4", "upgrade_to_5"]

_SESSIONS_4 = """
CREATE TABLE sessions (
    session_id     TEXT PRIMARY KEY,
    head           INTEGER NOT NULL,
    created_at     REAL NOT NULL,
    updated_at     REAL NOT NULL,
    parent_id      TEXT,
    parent_version INTEGER,
    status         TEXT,
    rounds         INTEGER NOT NULL DEFAULT 0,
    steps          INTEGER NOT NULL DEFAULT 0,
    cost           REAL NOT NULL DEFAULT 0,
    cost_unknown   INTEGER NOT NULL DEFAULT 0,
    reason         TEXT
)
"""


def upgrade_to_4(conn: sqlite3.Connection) -> None:
    """Schema 3 -> 4: each session's meta moves to ``session_meta`` (with the fields a listing
    shows), its row keeps only what a commit changes, and its summary is counted from its log."""
    columns = [row[1] for row in conn.execute("PRAGMA table_info(sessions)")]
    if "meta" not in columns:
        return  # made at schema 4 already (a file whose version row lagged)
    sessions = {}
    for sid, head, parent_id, parent_version, meta_text in conn.execute(
        "SELECT session_id, head, parent_id, parent_version, meta FROM sessions"
    ):
        try:
            meta = orjson.loads(meta_text)
        except orjson.JSONDecodeError:
            meta = {}  # kept as it is below; reading the session says it is damaged
        sessions[sid] = (head, parent_id, parent_version, meta if isinstance(meta, dict) else {})
    conn.execute("INSERT INTO session_meta (session_id, meta) SELECT session_id, meta FROM sessions")
    conn.executemany(
        "UPDATE session_meta SET task = ?, mode = ?, request = ?, forked_from = ?, forked_at = ?, pruned_to = ? "
        "WHERE session_id = ?",
        [(*brief_of(meta), sid) for sid, (_, _, _, meta) in sessions.items()],
    )
    conn.execute("ALTER TABLE sessions RENAME TO sessions_v3")
    conn.execute(_SESSIONS_4)
    conn.execute(
        "INSERT INTO sessions (session_id, head, created_at, updated_at, parent_id, parent_version) "
        "SELECT session_id, head, created_at, updated_at, parent_id, parent_version FROM sessions_v3"
    )
    conn.execute("DROP TABLE sessions_v3")
    columns_read = "SELECT version, ts, author, round, step, payload, crc FROM"
    where = "WHERE session_id = ? AND version > ? AND version <= ? ORDER BY version"

    def own_rows(sid: str, after: int, upto: int) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = conn.execute(f"{columns_read} events {where}", (sid, after, upto)).fetchall()
        return rows + conn.execute(f"{columns_read} events_recent {where}", (sid, after, upto)).fetchall()

    counted = count_sessions(sessions, own_rows)
    conn.executemany(
        "UPDATE sessions SET status = ?, rounds = ?, steps = ?, cost = ?, cost_unknown = ?, reason = ? WHERE session_id = ?",
        [(c.status, c.rounds, c.steps, c.cost, int(c.cost_unknown), c.reason, sid) for sid, c in counted.items()],
    )


def upgrade_to_5(conn: sqlite3.Connection) -> None:
    """Schema 4 -> 5: a meta's ``plan`` moves to the column ``plan`` of ``session_meta``, with ``0``
    holding its place in the meta (:func:`~saucer.store._sqlite_sql.split_plan`), so that reading a
    session's meta without its plan reads a few hundred bytes, not megabytes.

    Run after :func:`upgrade_to_4` too, which copies schema-3 metas whole. Only the metas with a
    plan are read, one at a time. A meta that is not JSON stays as it is: reading the session says
    it is damaged, as before.
    """
    columns = [row[1] for row in conn.execute("PRAGMA table_info(session_meta)")]
    if "plan" not in columns:  # else the table is new: migrate() made it for a schema-3 file
        conn.execute("ALTER TABLE session_meta ADD COLUMN plan TEXT")
    planned = conn.execute(
        "SELECT session_id FROM session_meta WHERE plan IS NULL "
        "AND CASE WHEN json_valid(meta) THEN json_type(meta, '$.plan') END IS NOT NULL"  # json_type() raises on bad JSON
    ).fetchall()
    for (sid,) in planned:
        (text,) = conn.execute("SELECT meta FROM session_meta WHERE session_id = ?", (sid,)).fetchone()
        try:
            meta = orjson.loads(text)
        except orjson.JSONDecodeError:
            continue  # JSON to SQLite (a lone surrogate, a number beyond a double) but not to orjson: left as it is
        if isinstance(meta, dict) and "plan" in meta:
            conn.execute("UPDATE session_meta SET meta = ?, plan = ? WHERE session_id = ?", (*split_plan(meta), sid))
