"""The hot statements of the SQLite store, run inside the caller's transaction: appends (one, or
a group commit's batch) with the session's summary counters, and the listing query.

Each append checks the expected head (and the lease token, if fenced), folds
the event's :class:`~saucer.store.summary.SummaryDelta` into the counters kept
beside the head (:func:`saucer.store.summary.fold`) and inserts the event into
``events_recent`` (see :mod:`saucer.store.sqlite`).
"""

from __future__ import annotations

import sqlite3
from typing import Any

import orjson

from saucer.store._group import Pending
from saucer.store.model import ConflictError, FencedError, SessionNotFoundError
from saucer.store.summary import REQUEST_CHARS, Counters, ListQuery, SummaryDelta, fold, listed_sql, order_sql

__all__ = ["kept_counters", "listing", "write_batch", "write_one"]

_COUNTERS = "status, rounds, steps, cost, cost_unknown, reason"
_LISTED_STATUS, _RUNNER = listed_sql("?")
#: The columns of :func:`~saucer.store.summary.make_summary`, for :func:`listing`.
_LIST = f"""
SELECT s.session_id, s.head, s.created_at, s.updated_at, s.parent_id, s.parent_version,
       {_LISTED_STATUS} AS listed, s.rounds, s.steps, CASE WHEN s.cost_unknown THEN NULL ELSE s.cost END AS shown_cost,
       s.reason, m.task AS task, m.mode, m.request, m.forked_from, m.forked_at, {_RUNNER}
FROM sessions s JOIN session_meta m ON m.session_id = s.session_id
LEFT JOIN leases l ON l.session_id = s.session_id
"""


#: What a commit changes in its session's row (and nothing else).
_UPDATE_HEAD = (
    "UPDATE sessions SET head = ?, updated_at = ?, status = ?, rounds = ?, steps = ?, cost = ?, cost_unknown = ?, "
    "reason = ? WHERE session_id = ?"
)


def _counter_values(c: Counters) -> tuple[Any, ...]:
    return (c.status, c.rounds, c.steps, c.cost, int(c.cost_unknown), c.reason)


def kept_counters(conn: sqlite3.Connection, session_id: str) -> Counters | None:
    """The summary counters kept for a session (None: no such session)."""
    row = conn.execute(f"SELECT {_COUNTERS} FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
    return None if row is None else Counters(row[0], row[1], row[2], row[3], bool(row[4]), row[5])


def listing(query: ListQuery) -> tuple[str, list[Any]]:
    """The statement of ``list_sessions`` and its arguments: the hot rows, the listed fields of the
    meta (never the meta itself) and the leases; filtered, sorted and cut by SQLite."""
    where: list[str] = ["1"]
    args: list[Any] = [query.now, query.now]
    if query.ids is not None:
        where.append("s.session_id IN (SELECT value FROM json_each(?))")
        args.append(orjson.dumps(list(query.ids)).decode())
    if query.statuses is not None:
        where.append("listed IN (SELECT value FROM json_each(?))")
        args.append(orjson.dumps(sorted(query.statuses)).decode())
    if query.task is not None:
        where.append("instr(lower(m.task), lower(?)) > 0")
        args.append(query.task)
    if query.since is not None:
        where.append("s.updated_at >= ?")
        args.append(query.since)
    sql = f"{_LIST} WHERE {' AND '.join(where)} {order_sql(query, 'listed', 'm.task')} LIMIT ?"
    args.append(-1 if query.limit is None else query.limit)
    return sql, args


def write_one(cursor: sqlite3.Cursor, entry: Pending) -> None:
    """Write one append; raise its error.

    Two statements: ONE ``UPDATE`` of the session's row that checks the head (and the lease
    token) in its ``WHERE`` and folds the event's summary delta into the counters in SQL, as
    :func:`~saucer.store.summary.apply` does (the PostgreSQL store's append statement does the
    same), then the event's ``INSERT``. Only when the update matches no row is the row read, to
    say why (fenced off, no such session, or a conflict).
    """
    event = entry.event
    sql, args = _append_head(event, entry.expected, entry.fence)
    if cursor.execute(sql, args).rowcount != 1:
        _refused(cursor.connection, entry)
    round_, step = event.round, event.step
    # A None or bytes parameter costs sqlite3 an adaptation lookup (a failed attribute lookup on a
    # type, an AttributeError made and dropped): NULLs are written in the statement, and the
    # payload bound as a bytearray (stored as the same BLOB).
    cursor.execute(
        _INSERTS[round_ is None, step is None],
        (
            event.session_id,
            event.version,
            event.timestamp,
            event.author,
            *(() if round_ is None else (round_,)),
            *(() if step is None else (step,)),
            bytearray(entry.payload),
            entry.crc,
        ),
    )


def _insert_sql(no_round: bool, no_step: bool) -> str:
    return (
        "INSERT INTO events_recent VALUES (?, ?, ?, ?, "
        f"{'NULL' if no_round else '?'}, {'NULL' if no_step else '?'}, ?, ?)"
    )


_INSERTS = {(a, b): _insert_sql(a, b) for a in (False, True) for b in (False, True)}
_NO_DELTA = SummaryDelta()
#: The update statement of each shape of append (which parts of the delta it has), made once.
_HEAD_SQL: dict[tuple[bool, ...], str] = {}


def _append_head(event: Any, expected: int, fence: int | None) -> tuple[str, tuple[Any, ...]]:
    """The statement moving the session's head from ``expected`` to the event's version, with the
    counters after the event (:func:`~saucer.store.summary.apply`, in SQL), and its arguments."""
    d = event.summary
    step = event.step
    if d is None and fence is None:  # a plain commit (most are): one of two statements
        if step.__class__ is int:
            return _PLAIN_STEP, (event.version, event.timestamp, step, event.session_id, expected)
        if step is None:
            return _PLAIN, (event.version, event.timestamp, event.session_id, expected)
    d = d or _NO_DELTA
    if step.__class__ is not int and (isinstance(step, bool) or not isinstance(step, int)):
        step = None  # (a bool or None does not count as a step)
    reason = d.reason[:REQUEST_CHARS] if d.reason else None
    args: list[Any] = [event.version, event.timestamp]
    if d.status is not None:
        args.append(d.status)
    if d.final_steps is not None:
        args.append(d.final_steps)
    elif step is not None:
        args.append(step)
    if d.final_rounds is not None:
        args.append(d.final_rounds)
    elif d.rounds_add:
        args.append(d.rounds_add)
    if d.final_cost is not None:
        args += (float(d.final_cost), int(bool(d.unknown)))
    elif d.cost_add:
        args.append(float(d.cost_add))
    if reason is not None:
        args.append(reason)
    args += (event.session_id, expected)
    if fence is not None:
        args += (event.session_id, fence)
    shape = (
        d.status is not None,
        d.final_steps is not None,
        step is not None,
        d.final_rounds is not None,
        bool(d.rounds_add),
        d.final_cost is not None,
        bool(d.cost_add),
        bool(d.unknown),
        reason is not None,
        fence is not None,
    )
    sql = _HEAD_SQL.get(shape)
    if sql is None:
        sql = _HEAD_SQL[shape] = _head_sql(*shape)
    return sql, tuple(args)


def _head_sql(
    status: bool,
    final_steps: bool,
    step: bool,
    final_rounds: bool,
    rounds_add: bool,
    final_cost: bool,
    cost_add: bool,
    unknown: bool,
    reason: bool,
    fenced: bool,
) -> str:
    """The update of one shape of append; its parameters in the order :func:`_append_head` gives them."""
    sets = ["head = ?", "updated_at = ?"]
    if status:
        sets.append("status = ?")
    if final_steps:
        sets.append("steps = ?")
    elif step:
        sets.append("steps = max(steps, ?)")  # (the step, if it is past the count)
    if final_rounds:
        sets.append("rounds = ?")
    elif rounds_add:
        sets.append("rounds = rounds + ?")
    if final_cost:
        sets += ["cost = ?", "cost_unknown = ?"]
    else:
        if cost_add:
            sets.append("cost = cost + ?")
        if unknown:
            sets.append("cost_unknown = 1")
    sets.append("reason = ?" if reason else "reason = NULL")
    where = "session_id = ? AND head = ?"
    if fenced:
        where += " AND EXISTS (SELECT 1 FROM leases WHERE session_id = ? AND token = ?)"
    return f"UPDATE sessions SET {', '.join(sets)} WHERE {where}"


#: The updates of a commit with no summary delta and no fence, with a step and without.
_PLAIN_STEP = _head_sql(False, False, True, False, False, False, False, False, False, False)
_PLAIN = _head_sql(False, False, False, False, False, False, False, False, False, False)


def _refused(conn: sqlite3.Connection, entry: Pending) -> None:
    """The append's update matched no row: raise why (checked in the order the append checks)."""
    event = entry.event
    if entry.fence is not None:
        row = conn.execute("SELECT token, owner FROM leases WHERE session_id = ?", (event.session_id,)).fetchone()
        if row is None or row[0] != entry.fence:
            raise FencedError(event.session_id, entry.fence, row[0] if row else None, row[1] if row else None)
    row = conn.execute("SELECT head FROM sessions WHERE session_id = ?", (event.session_id,)).fetchone()
    if row is None:
        raise SessionNotFoundError(event.session_id)
    raise ConflictError(event.session_id, entry.expected, row[0])


def write_batch(conn: sqlite3.Connection, entries: list[Pending]) -> int:
    """Write many appends; a refused entry fails only itself (its ``error``). How many were written.

    The heads (and lease tokens) of the batch's sessions are read at once, each
    entry is checked against them in order, and the accepted ones are written
    with two ``executemany`` calls.
    """
    ids = list({e.event.session_id: None for e in entries})
    fenced = list({e.event.session_id: None for e in entries if e.fence is not None})
    updates: list[tuple[Any, ...]] = []
    rows: list[tuple[Any, ...]] = []
    heads: dict[str, tuple[int, Counters]] = {
        row[0]: (row[1], Counters(row[2], row[3], row[4], row[5], bool(row[6]), row[7]))
        for row in conn.execute(
            f"SELECT session_id, head, {_COUNTERS} FROM sessions WHERE session_id IN ({','.join('?' * len(ids))})",
            ids,
        )
    }
    leases: dict[str, tuple[int, str]] = {}
    if fenced:
        found = conn.execute(
            f"SELECT session_id, token, owner FROM leases WHERE session_id IN ({','.join('?' * len(fenced))})",
            fenced,
        )
        leases = {sid: (token, owner) for sid, token, owner in found}
    for entry in entries:
        event = entry.event
        sid = event.session_id
        lead = entry.lead
        if lead is not None and lead.error is not None:
            entry.error = lead.error  # appended with a refused one: refused with it
            continue
        if entry.fence is not None:
            token, owner = leases.get(sid, (None, None))
            if token != entry.fence:
                entry.error = FencedError(sid, entry.fence, token, owner)
                continue
        head = heads.get(sid)
        if head is None or head[0] != entry.expected:
            entry.error = SessionNotFoundError(sid) if head is None else ConflictError(sid, entry.expected, head[0])
            continue
        counters = fold(head[1], event)
        heads[sid] = (event.version, counters)
        updates.append((event.version, event.timestamp, *_counter_values(counters), sid))
        rows.append(
            (
                sid,
                event.version,
                event.timestamp,
                event.author,
                event.round,
                event.step,
                entry.payload,
                entry.crc,
            )
        )
    conn.executemany(_UPDATE_HEAD, updates)
    conn.executemany("INSERT INTO events_recent VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    return len(rows)
