"""Statements of the SQLite store that rewrite or copy whole parts of a log,
run inside the caller's transaction: session rows, copied events and
snapshots, and the rewrites of history for a prune (:func:`replace_below`)
and for a fork that must stand alone (:func:`detach_fork`); and how a meta is
split between the columns ``meta`` and ``plan`` (:func:`split_plan`,
:func:`join_plan`).
"""

from __future__ import annotations

import sqlite3
from typing import Any

import orjson

from saucer.store._codec import encode_payload, encode_state
from saucer.store.model import Event, SessionExistsError, SessionInfo, SessionNotFoundError, Snapshot, StoreError
from saucer.store.summary import Counters, brief_of

__all__ = [
    "HEADS",
    "INFO_WITHOUT_PLAN",
    "detach_fork",
    "insert_events",
    "insert_session",
    "insert_snapshot",
    "join_plan",
    "replace_below",
    "rewrite_rows",
    "split_plan",
]


def split_plan(meta: dict[str, Any]) -> tuple[str, str | None]:
    """A session's meta as the columns ``meta`` and ``plan`` of ``session_meta``: the meta's JSON
    with ``0`` in place of its plan (so that its keys keep their order), and the plan's JSON (None:
    the meta has no ``"plan"``). Every write of those columns goes through here."""
    if "plan" not in meta:
        return orjson.dumps(meta).decode(), None
    return orjson.dumps({**meta, "plan": 0}).decode(), orjson.dumps(meta["plan"]).decode()


def join_plan(meta_text: str, plan_text: str | None) -> Any:
    """The meta that :func:`split_plan` split into ``meta_text`` and ``plan_text`` (None: the plan
    left out, or none); :class:`orjson.JSONDecodeError` if either is not JSON."""
    meta = orjson.loads(meta_text)
    if plan_text is not None and isinstance(meta, dict):
        meta["plan"] = orjson.loads(plan_text)
    return meta


#: Each session's row, the event at its head (from either event table) and its lease.
HEADS = """
SELECT s.session_id, s.head, s.created_at, s.updated_at, s.parent_id, s.parent_version, m.meta, m.plan,
       coalesce(e.ts, r.ts), coalesce(e.author, r.author), coalesce(e.round, r.round),
       coalesce(e.step, r.step), coalesce(e.payload, r.payload), coalesce(e.crc, r.crc),
       l.owner, l.token, l.expires_at
FROM sessions s JOIN session_meta m ON m.session_id = s.session_id
LEFT JOIN events e ON e.session_id = s.session_id AND e.version = s.head
LEFT JOIN events_recent r ON e.session_id IS NULL AND r.session_id = s.session_id AND r.version = s.head
LEFT JOIN leases l ON l.session_id = s.session_id
{where}
ORDER BY s.updated_at DESC, s.session_id
"""

#: A session's row with its meta, no plan (NULL) and whether it has one: the meta column is
#: small (0 holds the plan's place) and the plan column is neither parsed nor read. typeof(),
#: unlike IS NOT NULL (SQLite 3.40), reads only the column's type, not its overflow pages
#: (~2 ms for a 3 MB plan).
INFO_WITHOUT_PLAN = (
    "SELECT s.session_id, s.head, s.created_at, s.updated_at, s.parent_id, s.parent_version, "
    "m.meta, NULL, typeof(m.plan) <> 'null' "
    "FROM sessions s JOIN session_meta m ON m.session_id = s.session_id WHERE s.session_id = ?"
)


def insert_session(conn: sqlite3.Connection, info: SessionInfo, counters: Counters) -> None:
    """Insert a session's row (with its summary ``counters``) and its meta; :class:`SessionExistsError` if the id is taken."""
    try:
        conn.execute(
            "INSERT INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                info.session_id,
                info.version,
                info.created_at,
                info.updated_at,
                info.parent_id,
                info.parent_version,
                counters.status,
                counters.rounds,
                counters.steps,
                counters.cost,
                int(counters.cost_unknown),
                counters.reason,
            ),
        )
    except sqlite3.IntegrityError:
        raise SessionExistsError(f"session {info.session_id!r} already exists") from None
    conn.execute(
        "INSERT OR REPLACE INTO session_meta (session_id, task, mode, request, forked_from, forked_at, pruned_to, meta, plan) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (info.session_id, *brief_of(info.meta), *split_plan(info.meta)),
    )


def _set_meta(conn: sqlite3.Connection, session_id: str, meta: dict[str, Any]) -> None:
    """Replace a session's meta and the fields of it a listing shows."""
    conn.execute(
        "UPDATE session_meta SET task = ?, mode = ?, request = ?, forked_from = ?, forked_at = ?, pruned_to = ?, meta = ?, "
        "plan = ? WHERE session_id = ?",
        (*brief_of(meta), *split_plan(meta), session_id),
    )


def _meta_of(conn: sqlite3.Connection, session_id: str) -> dict[str, Any] | None:
    row = conn.execute("SELECT meta, plan FROM session_meta WHERE session_id = ?", (session_id,)).fetchone()
    return None if row is None else join_plan(row[0], row[1])


def insert_events(conn: sqlite3.Connection, owner: str, events: list[Event]) -> None:
    """Insert old events into ``owner``'s log, straight into ``events`` (they precede every recent row)."""
    rows = []
    for event in events:
        payload, crc = encode_payload(event, owner)
        rows.append((owner, event.version, event.timestamp, event.author, event.round, event.step, payload, crc))
    conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)


def insert_snapshot(conn: sqlite3.Connection, snapshot: Snapshot, verb: str = "INSERT OR REPLACE") -> None:
    blob, crc = encode_state(snapshot.state)
    conn.execute(
        f"{verb} INTO snapshots VALUES (?, ?, ?, ?, ?)",
        (snapshot.session_id, snapshot.version, snapshot.timestamp, blob, crc),
    )


def replace_below(conn: sqlite3.Connection, session_id: str, cut: int, base: Event, snapshot: Snapshot) -> bool:
    """The body of ``EventStore._prune``, in the caller's transaction."""
    payload, crc = encode_payload(base)
    meta = _meta_of(conn, session_id)
    if meta is None:
        raise SessionNotFoundError(session_id)
    if int(meta.get("pruned_to", 0)) >= cut:
        return True
    if conn.execute("SELECT 1 FROM sessions WHERE parent_id = ? LIMIT 1", (session_id,)).fetchone():
        return False
    conn.execute("UPDATE sessions SET parent_id = NULL, parent_version = NULL WHERE session_id = ?", (session_id,))
    _set_meta(conn, session_id, {**meta, "pruned_to": cut})
    for table in ("events", "events_recent"):  # the base event is in one of them
        conn.execute(f"DELETE FROM {table} WHERE session_id = ? AND version < ?", (session_id, cut))
        conn.execute(
            f"UPDATE {table} SET ts = ?, author = ?, round = ?, step = ?, payload = ?, crc = ? "
            "WHERE session_id = ? AND version = ?",
            (base.timestamp, base.author, base.round, base.step, payload, crc, session_id, cut),
        )
    conn.execute("DELETE FROM snapshots WHERE session_id = ? AND version < ?", (session_id, cut))
    insert_snapshot(conn, snapshot)
    return True


def detach_fork(
    conn: sqlite3.Connection, info: SessionInfo, events: list[Event], snapshot: Snapshot | None, meta: dict[str, Any]
) -> bool:
    """The body of ``EventStore._materialise``, in the caller's transaction."""
    updated = conn.execute(
        "UPDATE sessions SET parent_id = NULL, parent_version = NULL "
        "WHERE session_id = ? AND parent_id = ? AND parent_version = ?",
        (info.session_id, info.parent_id, info.parent_version),
    ).rowcount
    if updated != 1:
        return False
    _set_meta(conn, info.session_id, {**(_meta_of(conn, info.session_id) or {}), **meta})
    insert_events(conn, info.session_id, events)
    if snapshot is not None:
        insert_snapshot(conn, snapshot, "INSERT OR IGNORE")
    return True


def rewrite_rows(
    conn: sqlite3.Connection,
    session_id: str,
    events: list[Event],
    snapshots: Any = (),
    meta: dict[str, Any] | None = None,
) -> None:
    """The body of ``EventStore._rewrite``: new payloads for own events (in either table), snapshots and meta."""
    for snapshot in snapshots:
        insert_snapshot(conn, snapshot)
    if meta is not None:
        _set_meta(conn, session_id, meta)
    rows = []
    for event in events:
        payload, crc = encode_payload(event, session_id)
        rows.append((payload, crc, session_id, event.version))
    found = 0
    for table in ("events", "events_recent"):
        for row in rows:
            found += conn.execute(
                f"UPDATE {table} SET payload = ?, crc = ? WHERE session_id = ? AND version = ?", row
            ).rowcount
    if found != len(rows):
        raise StoreError(
            f"session {session_id!r}: some of the events to rewrite are not in its own log; nothing was rewritten"
        )
