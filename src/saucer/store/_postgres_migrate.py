"""The upgrades of a PostgreSQL store's schema that move data (run inside the
migration's transaction, see ``_postgres_conn.migrate``)."""

from __future__ import annotations

from typing import Any

import orjson
import psycopg

from saucer.store._summarise import count_sessions
from saucer.store.summary import brief_of

__all__ = ["SUMMARY_COLUMNS", "count_summaries"]

#: Schema 3: each session's summary counters and the fields of its meta a listing shows.
SUMMARY_COLUMNS = (
    "ALTER TABLE {s}.sessions ADD COLUMN status text, ADD COLUMN rounds bigint NOT NULL DEFAULT 0, "
    "ADD COLUMN steps bigint NOT NULL DEFAULT 0, ADD COLUMN cost double precision NOT NULL DEFAULT 0, "
    "ADD COLUMN cost_unknown boolean NOT NULL DEFAULT false, ADD COLUMN reason text, ADD COLUMN task text, "
    "ADD COLUMN mode text, ADD COLUMN request text, ADD COLUMN forked_from text, ADD COLUMN forked_at bigint"
)


def count_summaries(conn: psycopg.Connection[Any], s: str) -> None:
    """Fill the columns of :data:`SUMMARY_COLUMNS` for the sessions stored before them."""
    sessions = {}
    for sid, head, parent_id, parent_version, meta in conn.execute(
        f"SELECT session_id, head, parent_id, parent_version, meta FROM {s}.sessions"
    ).fetchall():
        if isinstance(meta, (str, bytes)):
            meta = orjson.loads(meta)
        sessions[sid] = (head, parent_id, parent_version, meta if isinstance(meta, dict) else {})

    def own_rows(sid: str, after: int, upto: int) -> list[tuple[Any, ...]]:
        return conn.execute(
            f"SELECT version, ts, author, round, step, payload, crc FROM {s}.events "
            "WHERE session_id = %s AND version > %s AND version <= %s ORDER BY version",
            (sid, after, upto),
        ).fetchall()

    counted = count_sessions(sessions, own_rows)
    with conn.cursor() as cur:
        cur.executemany(
            f"UPDATE {s}.sessions SET status = %s, rounds = %s, steps = %s, cost = %s, cost_unknown = %s, reason = %s, "
            "task = %s, mode = %s, request = %s, forked_from = %s, forked_at = %s WHERE session_id = %s",
            [
                (c.status, c.rounds, c.steps, c.cost, c.cost_unknown, c.reason, *brief_of(sessions[sid][3])[:5], sid)
                for sid, c in counted.items()
            ],
        )
