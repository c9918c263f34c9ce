"""The statements of the PostgreSQL store that deserve a name, run on a
connection (and inside the transaction) its caller holds.

The append statement checks and writes a whole batch of appends at once: it
moves each session's head only where it still equals the version the commit
was based on (and, for a leased writer, only where its lease token is still
current, the lease row locked ``FOR SHARE`` meanwhile), inserts the events of
exactly those sessions, and ``NOTIFY``\\ s the watched ones. The rest writes session
rows, copied events and snapshots, and rewrites a session's history for a
prune (:meth:`Statements.replace_below`) or a fork that must stand alone
(:meth:`Statements.detach_fork`).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import orjson
import psycopg
from psycopg.types.json import Jsonb

from saucer.store._codec import encode_payload, encode_state
from saucer.store._group import Pending, unrefused
from saucer.store._postgres_conn import quote
from saucer.store.model import (
    ConflictError,
    Event,
    FencedError,
    Lease,
    SessionInfo,
    SessionNotFoundError,
    Snapshot,
)
from saucer.store.summary import REQUEST_CHARS, Counters, ListQuery, brief_of, listed_sql, order_sql

__all__ = ["Statements", "INFO_COLUMNS", "ROW_COLUMNS", "row_info", "rounds_of"]

_AZ = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_BY_CODE_POINT = ' COLLATE "C"'  # text sorted as Python sorts it, whatever the database's collation

#: The columns of a session row, in :class:`SessionInfo`'s order.
INFO_COLUMNS = "session_id, head, created_at, updated_at, parent_id, parent_version, meta"
#: The same, with a meta of ``pruned_to`` alone: what reading a log needs (``EventStore._row``).
ROW_COLUMNS = (
    "session_id, head, created_at, updated_at, parent_id, parent_version, "
    "jsonb_strip_nulls(jsonb_build_object('pruned_to', meta -> 'pruned_to'))"
)


def row_info(row: Sequence[Any]) -> SessionInfo:
    """A session row (:data:`INFO_COLUMNS`) as a :class:`SessionInfo`."""
    meta = row[6]
    if isinstance(meta, (str, bytes)):
        meta = orjson.loads(meta)
    return SessionInfo(row[0], row[1], row[2], row[3], row[4], row[5], dict(meta or {}))


def rounds_of(entries: list[Pending]) -> list[list[Pending]]:
    """A batch's appends as the rounds its statements write, in order: at most one entry per session
    in a round (a session's second append queued at once, or the events appended with it, go later)."""
    rounds: list[list[Pending]] = [[]]
    seen: list[set[str]] = [set()]
    for entry in entries:
        sid = entry.event.session_id
        i = 0
        while sid in seen[i]:
            i += 1
            if i == len(rounds):
                rounds.append([])
                seen.append(set())
        rounds[i].append(entry)
        seen[i].add(sid)
    return rounds


_session_of = operator.attrgetter("event.session_id")


def _jsonb(value: Any) -> Jsonb:
    return Jsonb(value, dumps=lambda obj: orjson.dumps(obj).decode())


_SESSION_VALUES = (
    f"({INFO_COLUMNS}, status, rounds, steps, cost, cost_unknown, reason, task, mode, request, forked_from, forked_at) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)


def _session_params(info: SessionInfo, counters: Counters) -> tuple[Any, ...]:
    return (
        info.session_id,
        info.version,
        info.created_at,
        info.updated_at,
        info.parent_id,
        info.parent_version,
        _jsonb(info.meta),
        counters.status,
        counters.rounds,
        counters.steps,
        counters.cost,
        counters.cost_unknown,
        counters.reason,
        *brief_of(info.meta)[:5],
    )


def _float(value: float | None) -> float | str | None:
    """A float as JSON: the non-finite ones as the text PostgreSQL reads (JSON has no NaN)."""
    if value is None or math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _row(entry: Pending) -> dict[str, Any]:
    """One append of a batch as the append statement's JSON row (its payload travels apart)."""
    event = entry.event
    row: dict[str, Any] = {
        "s": event.session_id,
        "e": entry.expected,
        "t": _float(event.timestamp),
        "a": event.author,
        "r": event.round,
        "p": event.step,
        "c": entry.crc,
        "f": entry.fence,
    }
    d = event.summary
    if d is not None:  # counted as summary.apply() does, in SQL (the step from the event; the rest from its delta)
        row.update(
            ds=d.status,
            dr=d.rounds_add,
            dc=_float(d.cost_add),
            du=d.unknown,
            dn=d.reason[:REQUEST_CHARS] if d.reason else None,
            fr=d.final_rounds,
            fs=d.final_steps,
            fc=_float(d.final_cost),
        )
    return row


class Statements:
    """The statements of one schema; ``channel`` is where appends are announced."""

    def __init__(self, schema: str, channel: str) -> None:
        self.schema = schema
        self.channel = channel
        s = self._s = quote(schema)
        # The batch arrives as two parameters: its rows as ONE JSON array (short keys, a key
        # left out is NULL; encoded by orjson in one C call) and the payloads as one bytea
        # array, zipped back together by ROWS FROM. Seventeen arrays dumped element by element
        # by psycopg's Python array dumper cost the writer more than the rest of the batch.
        self._append = f"""
            WITH b AS (
                SELECT * FROM ROWS FROM (
                    json_to_recordset(%s::json) AS (
                        s text, e bigint, t double precision, a text, r bigint, p bigint, c bigint, f bigint,
                        ds text, dr bigint, dc double precision, du boolean, dn text, fr bigint, fs bigint,
                        fc double precision),
                    unnest(%b::bytea[])
                ) AS b(session_id, expected, ts, author, round, step, crc, fence,
                       d_status, d_rounds, d_cost, d_unknown, d_reason, f_rounds, f_steps, f_cost, payload)
            ),
            lk AS (
                SELECT l.session_id, l.token FROM {s}.leases l
                WHERE l.session_id IN (SELECT session_id FROM b WHERE fence IS NOT NULL)
                FOR SHARE
            ),
            up AS (
                UPDATE {s}.sessions s SET head = b.expected + 1, updated_at = b.ts,
                    status = coalesce(b.d_status, s.status),
                    steps = coalesce(b.f_steps, CASE WHEN b.step > s.steps THEN b.step ELSE s.steps END),
                    rounds = coalesce(b.f_rounds, s.rounds + coalesce(b.d_rounds, 0)),
                    cost = coalesce(b.f_cost, s.cost + coalesce(b.d_cost, 0)),
                    cost_unknown = CASE WHEN b.f_cost IS NOT NULL THEN coalesce(b.d_unknown, false)
                                        ELSE s.cost_unknown OR coalesce(b.d_unknown, false) END,
                    reason = b.d_reason
                FROM b
                WHERE s.session_id = b.session_id AND s.head = b.expected
                  AND (b.fence IS NULL OR EXISTS (
                        SELECT 1 FROM lk WHERE lk.session_id = b.session_id AND lk.token = b.fence))
                RETURNING s.session_id, s.head, cardinality(s.watchers) > 0 AS watched
            ),
            ins AS (
                INSERT INTO {s}.events (session_id, version, ts, author, round, step, payload, crc)
                SELECT b.session_id, b.expected + 1, b.ts, b.author, b.round, b.step, b.payload, b.crc
                FROM b JOIN up USING (session_id)
            )
            SELECT session_id, CASE WHEN watched THEN pg_notify(%s, left(head || ' ' || session_id, 1990)) END
            FROM up
        """
        # A pid leaves a session's watchers when it unregisters, or when a registration
        # finds no backend with it any more (its listener died).
        alive = "(SELECT pid FROM pg_stat_activity)"
        self._watch = (
            f"UPDATE {s}.sessions SET watchers = ARRAY(SELECT DISTINCT w FROM unnest(watchers || %(pid)s::integer) w "
            f"WHERE w = %(pid)s::integer OR w IN {alive}) WHERE session_id = %(sid)s"
        )
        self._unwatch = (
            f"UPDATE {s}.sessions SET watchers = ARRAY(SELECT w FROM unnest(watchers) w "
            f"WHERE w <> %(pid)s::integer AND w IN {alive}) WHERE session_id = %(sid)s AND %(pid)s::integer = ANY(watchers)"
        )

    def set_watcher(self, conn: psycopg.Connection[Any], pid: int, session_id: str, watched: bool) -> bool:
        """Add the backend ``pid`` (a LISTEN connection) to the session's watchers, or remove it:
        commits notify only the sessions with watchers (see ``_postgres_listen``). False: no such
        session row (yet)."""
        return conn.execute(self._unwatch if not watched else self._watch, {"pid": pid, "sid": session_id}).rowcount > 0

    # --------------------------------------------------------------- appends

    def write_round(self, conn: psycopg.Connection[Any], batch: list[Pending], settled: set[int]) -> None:
        """Run the append statement for ``batch`` (at most one entry per session).

        Each entry it did not write gets its error; every entry goes into
        ``settled`` (its outcome is certain) once the statement has returned.
        """
        batch = unrefused(batch)
        if not batch:
            return
        # In session order: the statement locks the session rows in the order of its rows, so two
        # batches in flight at once that share sessions (two writers of each) lock them in the same
        # order, one waiting for the other, instead of each holding a row the other needs (a deadlock,
        # which PostgreSQL breaks only after deadlock_timeout, failing a batch into per-commit writes).
        batch.sort(key=_session_of)
        try:
            rows = orjson.dumps([_row(entry) for entry in batch]).decode()
        except orjson.JSONEncodeError as exc:  # a text psycopg could not have sent either (e.g. a lone surrogate)
            raise psycopg.DataError(f"cannot encode the batch: {exc}") from None
        done = conn.execute(self._append, (rows, [e.payload for e in batch], self.channel), prepare=True).fetchall()
        ok = {row[0] for row in done}
        refused = [e for e in batch if e.event.session_id not in ok]
        for entry in refused:
            # Certainly not written; _refuse() says why when it can.
            entry.error = ConflictError(entry.event.session_id, entry.expected, None)
        settled.update(id(e) for e in batch)
        if refused:
            self._refuse(conn, refused)

    def _refuse(self, conn: psycopg.Connection[Any], entries: list[Pending]) -> None:
        """Set the error of each entry the append statement did not write."""
        rows = conn.execute(
            f"SELECT s.session_id, s.head, l.token, l.owner FROM {self._s}.sessions s "
            f"LEFT JOIN {self._s}.leases l ON l.session_id = s.session_id WHERE s.session_id = ANY(%s)",
            ([e.event.session_id for e in entries],),
        ).fetchall()
        found = {row[0]: row[1:] for row in rows}
        for entry in entries:
            sid = entry.event.session_id
            if sid not in found:
                entry.error = SessionNotFoundError(sid)
                continue
            head, token, owner = found[sid]
            if entry.fence is not None and token != entry.fence:
                entry.error = FencedError(sid, entry.fence, token, owner)
            else:
                entry.error = ConflictError(sid, entry.expected, head)

    # --------------------------------------------------------------- listing

    def listing(self, query: ListQuery, now: str) -> tuple[str, list[Any]]:
        """The statement of ``list_sessions`` and its arguments: one query over the session
        rows (their summary columns, never their meta) and the leases, whose expiry is
        compared with ``now`` (SQL: the server's clock)."""
        status, runner = listed_sql(now)
        where: list[str] = ["true"]
        args: list[Any] = []
        if query.ids is not None:
            where.append("s.session_id = ANY(%s)")
            args.append([sid for sid in query.ids if "\x00" not in sid])
        if query.statuses is not None:
            where.append(f"({status}) = ANY(%s)")
            args.append(sorted(query.statuses))
        if query.task is not None:
            where.append(
                f"strpos(translate(s.task, '{_AZ}', '{_AZ.lower()}'), translate(%s, '{_AZ}', '{_AZ.lower()}')) > 0"
            )
            args.append(query.task)
        if query.since is not None:
            where.append("s.updated_at >= %s")
            args.append(query.since)
        args.append(query.limit)
        sql = (
            f"SELECT s.session_id, s.head, s.created_at, s.updated_at, s.parent_id, s.parent_version, "
            f"{status} AS listed, s.rounds, s.steps, CASE WHEN s.cost_unknown THEN NULL ELSE s.cost END AS shown_cost, "
            f"s.reason, s.task AS task, s.mode, s.request, s.forked_from, s.forked_at, {runner} "
            f"FROM {self._s}.sessions s LEFT JOIN {self._s}.leases l ON l.session_id = s.session_id "
            f"WHERE {' AND '.join(where)} {order_sql(query, status, 's.task', _BY_CODE_POINT)} LIMIT %s"
        )
        return sql, args

    def counters(self, conn: psycopg.Connection[Any], session_id: str) -> Counters | None:
        """The summary counters of a session (None: no such session)."""
        row = conn.execute(
            f"SELECT status, rounds, steps, cost, cost_unknown, reason FROM {self._s}.sessions WHERE session_id = %s",
            (session_id,),
        ).fetchone()
        return None if row is None else Counters(row[0], int(row[1]), int(row[2]), float(row[3]), bool(row[4]), row[5])

    # ------------------------------------------------------------------ rows

    def insert_session(self, conn: psycopg.Connection[Any], info: SessionInfo, counters: Counters) -> None:
        """Insert a session's row, with its summary ``counters`` and the fields of its meta a listing shows."""
        conn.execute(f"INSERT INTO {self._s}.sessions {_SESSION_VALUES}", _session_params(info, counters))

    def insert_session_leased(
        self, conn: psycopg.Connection[Any], info: SessionInfo, counters: Counters, owner: str, ttl: float, now: str
    ) -> tuple[int, float]:
        """:meth:`insert_session` and the session's first lease for ``owner`` in ONE statement:
        ``(token, expires_at)`` (on the server's clock, ``now``)."""
        row = conn.execute(
            f"WITH made AS (INSERT INTO {self._s}.sessions {_SESSION_VALUES} RETURNING session_id) "
            f"INSERT INTO {self._s}.leases (session_id, owner, token, expires_at) "
            f"SELECT session_id, %s, 1, {now} + %s FROM made RETURNING token, expires_at",
            (*_session_params(info, counters), owner, float(ttl)),
        ).fetchone()
        assert row is not None  # the session was made (else UniqueViolation): so was its lease
        return int(row[0]), float(row[1])

    def insert_events(self, conn: psycopg.Connection[Any], owner: str, events: list[Event]) -> None:
        """Insert events into ``owner``'s log (see :func:`encode_payload` for events of another session)."""
        rows = []
        for event in events:
            payload, crc = encode_payload(event, owner)
            rows.append((owner, event.version, event.timestamp, event.author, event.round, event.step, payload, crc))
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {self._s}.events (session_id, version, ts, author, round, step, payload, crc) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                rows,
            )

    def rewrite_extras(
        self, conn: psycopg.Connection[Any], session_id: str, snapshots: Any, meta: dict[str, Any] | None
    ) -> None:
        """The rest of ``_rewrite`` (in its transaction): snapshots replaced, and the meta with the fields a listing shows."""
        for snapshot in snapshots:
            self.insert_snapshot(conn, snapshot)
        if meta is not None:
            task, mode, request = brief_of(meta)[:3]
            conn.execute(
                f"UPDATE {self._s}.sessions SET meta = %s, task = %s, mode = %s, request = %s WHERE session_id = %s",
                (_jsonb(meta), task, mode, request, session_id),
            )

    def take_lease(
        self, conn: psycopg.Connection[Any], session_id: str, owner: str, ttl: float, now: str
    ) -> tuple[Any, ...] | None:
        """Take or renew the session's lease for ``owner``: ``(token, expires_at)``, or None while another holds it
        (``ForeignKeyViolation`` for an unknown session). A change of holder increments the token."""
        s = self._s
        return conn.execute(
            f"""
            INSERT INTO {s}.leases AS l (session_id, owner, token, expires_at)
            VALUES (%(sid)s, %(owner)s, 1, {now} + %(ttl)s)
            ON CONFLICT (session_id) DO UPDATE
                SET token = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > {now}
                                 THEN l.token ELSE l.token + 1 END,
                    owner = EXCLUDED.owner,
                    expires_at = EXCLUDED.expires_at
                WHERE l.owner = EXCLUDED.owner OR l.expires_at <= {now}
            RETURNING token, expires_at
            """,
            {"sid": session_id, "owner": owner, "ttl": float(ttl)},
        ).fetchone()

    def insert_snapshot_pruned(
        self, conn: psycopg.Connection[Any], snapshot: Snapshot, keep: int, release: Lease | None = None
    ) -> None:
        """Drop the session's snapshots but the newest ``keep`` (and the one at this version) and store
        ``snapshot``, and give ``release`` back (a lease still held as it is), in ONE statement."""
        blob, crc = encode_state(snapshot.state)
        s = self._s
        released = (
            f"released AS (UPDATE {s}.leases SET expires_at = 0 "
            "WHERE session_id = %(lsid)s AND owner = %(owner)s AND token = %(token)s), "
            if release is not None
            else ""
        )
        conn.execute(
            f"WITH {released}dropped AS (DELETE FROM {s}.snapshots WHERE session_id = %(sid)s AND version <> %(version)s "
            f"AND version NOT IN (SELECT version FROM {s}.snapshots WHERE session_id = %(sid)s "
            "ORDER BY version DESC LIMIT %(keep)s)) "
            f"INSERT INTO {s}.snapshots (session_id, version, ts, state, crc) "
            "VALUES (%(sid)s, %(version)s, %(ts)s, %(state)s, %(crc)s) "
            "ON CONFLICT (session_id, version) DO UPDATE SET ts = EXCLUDED.ts, state = EXCLUDED.state, crc = EXCLUDED.crc",
            {
                "sid": snapshot.session_id,
                "version": snapshot.version,
                "keep": max(0, keep),
                "ts": snapshot.timestamp,
                "state": blob,
                "crc": crc,
                **(
                    {"lsid": release.session_id, "owner": release.owner, "token": release.token}
                    if release is not None
                    else {}
                ),
            },
        )

    def insert_snapshot(self, conn: psycopg.Connection[Any], snapshot: Snapshot, *, replace: bool = True) -> None:
        blob, crc = encode_state(snapshot.state)
        conflict = (
            "DO UPDATE SET ts = EXCLUDED.ts, state = EXCLUDED.state, crc = EXCLUDED.crc" if replace else "DO NOTHING"
        )
        conn.execute(
            f"INSERT INTO {self._s}.snapshots (session_id, version, ts, state, crc) VALUES (%s, %s, %s, %s, %s) "
            f"ON CONFLICT (session_id, version) {conflict}",
            (snapshot.session_id, snapshot.version, snapshot.timestamp, blob, crc),
        )

    def prune_lock(self, conn: psycopg.Connection[Any], session_id: str, *, shared: bool = False) -> None:
        """Serialise, per session, prunes and materialisations (exclusive) with the making of its forks (shared)."""
        kind = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
        conn.execute(f"SELECT {kind}(hashtext(%s))", (f"saucer.prune:{self.schema}:{session_id}",))

    # --------------------------------------------------------------- history

    def replace_below(
        self, conn: psycopg.Connection[Any], session_id: str, cut: int, base: Event, snapshot: Snapshot
    ) -> bool:
        """The body of ``EventStore._prune``, in the caller's transaction."""
        payload, crc = encode_payload(base)
        s = self._s
        # Prunes of one session take turns, and no fork of it is made meanwhile;
        # appends go on (they only touch versions above the head, which is at or above the cut).
        self.prune_lock(conn, session_id)
        row = conn.execute(
            f"SELECT coalesce((meta ->> 'pruned_to')::bigint, 0) FROM {s}.sessions WHERE session_id = %s",
            (session_id,),
        ).fetchone()
        if row is None:
            raise SessionNotFoundError(session_id)
        if row[0] >= cut:
            return True
        if conn.execute(f"SELECT 1 FROM {s}.sessions WHERE parent_id = %s LIMIT 1", (session_id,)).fetchone():
            return False
        conn.execute(f"DELETE FROM {s}.events WHERE session_id = %s AND version < %s", (session_id, cut))
        conn.execute(
            f"UPDATE {s}.events SET ts = %s, author = %s, round = %s, step = %s, payload = %s, crc = %s "
            "WHERE session_id = %s AND version = %s",
            (base.timestamp, base.author, base.round, base.step, payload, crc, session_id, cut),
        )
        conn.execute(f"DELETE FROM {s}.snapshots WHERE session_id = %s AND version < %s", (session_id, cut))
        self.insert_snapshot(conn, snapshot)
        # Last, so that the session row (which every append updates) is locked only briefly.
        conn.execute(
            f"UPDATE {s}.sessions SET meta = meta || jsonb_build_object('pruned_to', %s::bigint), "
            "parent_id = NULL, parent_version = NULL WHERE session_id = %s",
            (cut, session_id),
        )
        return True

    def detach_fork(
        self,
        conn: psycopg.Connection[Any],
        info: SessionInfo,
        events: list[Event],
        snapshot: Snapshot | None,
        meta: dict[str, Any],
    ) -> bool:
        """The body of ``EventStore._materialise``, in the caller's transaction."""
        s = self._s
        self.prune_lock(conn, info.session_id)  # its attachment only changes under this lock
        row = conn.execute(
            f"SELECT parent_id, parent_version FROM {s}.sessions WHERE session_id = %s", (info.session_id,)
        ).fetchone()
        if row is None or (row[0], row[1]) != (info.parent_id, info.parent_version):
            return False
        self.insert_events(conn, info.session_id, events)
        if snapshot is not None:
            self.insert_snapshot(conn, snapshot, replace=False)
        # Last, so that the session row (which every append updates) is locked only briefly.
        conn.execute(
            f"UPDATE {s}.sessions SET parent_id = NULL, parent_version = NULL, meta = meta || %s, "
            "forked_from = CASE WHEN %s::text IS NOT NULL THEN %s::text ELSE forked_from END, "
            "forked_at = CASE WHEN %s::bigint IS NOT NULL THEN %s::bigint ELSE forked_at END WHERE session_id = %s",
            (_jsonb(meta), *[brief_of(meta)[3]] * 2, *[brief_of(meta)[4]] * 2, info.session_id),
        )
        return True
