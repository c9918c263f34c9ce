"""The PostgreSQL event store (``postgresql://user@host:port/db?schema=NAME``).

Many processes on many machines can share one store. Everything lives in one
schema (``saucer`` unless ``?schema=`` names another), which saucer creates and
migrates itself: the ``saucer_schema`` table records each applied version,
:meth:`PostgresStore.migrate` brings a schema up to date (``saucer store
migrate``), and opening a store does it automatically the first time. Concurrent
migrators serialise on a transaction-level advisory lock.

This module is the store's logic; ``_postgres_conn`` holds the URL, the
schema's migrations and the connection pools, and ``_postgres_sql`` the
statements worth a name (the append statement, session rows, the rewrites of
history for a prune).

Appends
    One statement per batch checks and writes everything: it updates each
    session's head only where it still equals the version the commit was based
    on (and, for a leased writer, only where its lease token is still current),
    inserts the events of exactly those sessions, and ``NOTIFY``\\ s the watched ones, all
    in one transaction. A writer whose base version is stale gets
    :class:`ConflictError`; one whose token is outdated gets :class:`FencedError`.
    Concurrent appends of one process share that statement and its COMMIT
    (group commit, two batches in flight on two connections: see ``saucer.store._group``);
    ``synchronous_commit`` decides when PostgreSQL acknowledges a COMMIT, and saucer
    leaves it at the server's setting (``on`` by default: flushed to the WAL on disk).

Snapshots
    Snapshots are a cache of the fold (the events are the truth), so they are
    written on connections with ``synchronous_commit = off``: a crash can lose
    the newest snapshot, which costs a longer replay, never a wrong state, and
    a committing session does not wait for a second WAL flush.

Leases and fencing
    A lease is a row per session (owner, token, expires_at). Taking it is one
    ``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` that succeeds only when the
    lease is free, expired, or already ours; every change of holder increments
    the token. Commits of a leased writer carry its token, and the append
    statement locks the lease row (``FOR SHARE``) while comparing it, so a
    takeover and a stale holder's commit are strictly ordered: once another
    worker has the lease, the old holder's commits are refused, never
    interleaved. Expiry uses the **database server's clock**
    (``clock_timestamp()``), never the workers': workers on several hosts may
    disagree about the time, but they all ask the same server, so a lease
    expires at the same moment for everyone. ``Lease.expires_at`` is therefore
    in the server's epoch seconds. A lease row rather than an advisory lock,
    because a lock dies with its connection (a pooled connection or a network
    blip would silently drop ownership), cannot name its holder in an error,
    and cannot fence a writer that has already lost it.

Errors and lost connections
    Every ``psycopg`` error becomes a :class:`~saucer.store.StoreError`. A
    pooled connection the server has closed meanwhile (a restart,
    ``pg_terminate_backend``, an idle timeout) is recognised when it is taken
    from the pool, without a round trip (the server's goodbye is waiting on
    its socket), and replaced. A read, or any other call that is safe to
    repeat, whose connection breaks under it is retried once on a fresh
    connection; an append is not (it might be written twice): it fails with
    :class:`~saucer.store.OutcomeUnknownError`.

Watching
    :meth:`PostgresStore.watch` ``LISTEN``\\ s on one channel per schema and
    reads a session's new events when a notification names it (with a slow
    poll as a safety net); it falls back to polling if it cannot listen.
"""

from __future__ import annotations

import asyncio
import functools
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar, cast

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import PoolTimeout

from saucer.store._codec import (
    DamagedRecord,
    decode_payload,
    decode_rows,
    encode_payload,
    first_good_snapshot,
    formats_of,
    head_event,
    quarantine_payload,
)
from saucer.store._group import GroupCommitter, Pending
from saucer.store._postgres_conn import (
    DEFAULT_SCHEMA,
    SCHEMA_VERSION,
    Connections,
    applied_version,
    display_url,
    ensure_schema,
    one_line,
    quote,
    split_url,
)
from saucer.store._postgres_conn import migrate as migrate_schema
from saucer.store._postgres_listen import Listener, registrar, watch_notified
from saucer.store._postgres_sql import INFO_COLUMNS, ROW_COLUMNS, Statements, rounds_of, row_info
from saucer.store.base import (
    EventStore,
    Feature,
    Lease,
    LeaseHeldError,
    OutcomeUnknownError,
    SessionExistsError,
    SessionInfo,
    SessionNotFoundError,
    Snapshot,
    StoreError,
)
from saucer.store.model import Event, SessionHead
from saucer.store.recorder import check_fork_point
from saucer.store.summary import Counters, ListQuery, SessionSummary, make_summary
from saucer.store.upcast import FORMAT_VERSION

__all__ = ["PostgresStore", "SCHEMA_VERSION", "DEFAULT_SCHEMA", "split_url"]

_NOW = "extract(epoch FROM clock_timestamp())::double precision"


_F = TypeVar("_F", bound=Callable[..., Any])


def _translated(*, retry: bool) -> Callable[[_F], _F]:
    """Turn the ``psycopg`` errors escaping a method into :class:`StoreError`.

    ``retry=True`` (reads, and writes that are safe to repeat) runs the method
    once more, on a fresh connection, when its connection broke under it.
    """

    def decorate(method: _F) -> _F:
        @functools.wraps(method)
        def wrapper(self: PostgresStore, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except PoolTimeout as exc:
                raise self._db.error(exc) from exc
            except psycopg.OperationalError as exc:
                if not retry:
                    raise self._db.error(exc) from exc
                first = exc
            except psycopg.Error as exc:
                raise self._db.error(exc) from exc
            self._db.drop_broken()  # the others may have been closed too (a server restart): not those again
            try:
                return method(self, *args, **kwargs)
            except psycopg.Error as exc:
                raise self._db.error(exc, retried=isinstance(exc, psycopg.OperationalError)) from first

        return cast(_F, wrapper)

    return decorate


class PostgresStore(EventStore):
    """Events, snapshots and leases in one PostgreSQL schema, shared by any number of processes."""

    features = frozenset(
        {
            Feature.REPLACE_HISTORY,
            Feature.IMPORT,
            Feature.SNAPSHOT_PRUNING,
            Feature.QUARANTINE,
            Feature.GROUP_COMMIT,
            Feature.REWRITE,
        }
    )

    #: Concurrent appends of this process share one statement and COMMIT; False gives each its own.
    group_commit: bool = True

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 10,
        connect_timeout: float = 10.0,
        migrate: bool = True,
    ) -> None:
        self.url = url
        self.conninfo, self.schema = split_url(url)
        self.channel = f"saucer_{self.schema}"[:63]
        self._s = quote(self.schema)
        self._sql = Statements(self.schema, self.channel)
        try:
            if migrate:  # before the pools exist: a server that cannot be reached leaves nothing behind
                ensure_schema(self.conninfo, self.schema, connect_timeout)
        except psycopg.OperationalError as exc:
            raise StoreError(f"cannot connect to PostgreSQL at {display_url(url)}: {one_line(exc)}") from None
        except psycopg.Error as exc:
            raise StoreError(
                f"PostgreSQL at {display_url(url)}: cannot create or migrate schema {self.schema!r}: {one_line(exc)}"
            ) from None
        self._db = Connections(url, self.conninfo, self.schema, pool_size=pool_size, connect_timeout=connect_timeout)
        self._committer = GroupCommitter(self._write_batch, self._write_one, off_loop=True, max_inflight=2)
        self._listeners: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Listener] = weakref.WeakKeyDictionary()

    def close(self) -> None:
        self._committer.close()
        self._db.close()

    # ------------------------------------------------------------ migration

    @_translated(retry=True)
    def schema_version(self) -> int:
        """The schema's applied version (0 when saucer has not created it yet)."""
        with self._db.connect() as conn:
            return applied_version(conn, self.schema)

    @_translated(retry=True)
    def migrate(self) -> int:
        """Create the schema or bring it up to :data:`SCHEMA_VERSION`; return the version.

        Safe to run from many processes at once and again and again.
        """
        with self._db.connect() as conn:
            return migrate_schema(conn, self.schema)

    @_translated(retry=True)
    def format_version(self) -> int:
        with self._db.conn() as conn:
            row = conn.execute(f"SELECT newest FROM {self._s}.saucer_format").fetchone()
        return int(row[0]) if row else FORMAT_VERSION

    # ------------------------------------------------------------- sessions

    @_translated(retry=True)
    def kept_counters(self, session_id: str) -> Counters | None:
        with self._db.conn() as conn:
            return self._sql.counters(conn, session_id)

    @_translated(retry=True)
    def list_rows(self, query: ListQuery) -> list[SessionSummary]:
        with self._db.conn() as conn:
            return [make_summary(row) for row in conn.execute(*self._sql.listing(query, _NOW)).fetchall()]

    @_translated(retry=False)
    def create_row(self, info: SessionInfo, counters: Counters) -> None:
        s = self._s
        try:
            with self._db.transaction() as conn:
                if info.parent_id is not None:
                    self._sql.prune_lock(conn, info.parent_id, shared=True)
                    row = conn.execute(
                        f"SELECT head, coalesce((meta ->> 'pruned_to')::bigint, 0) FROM {s}.sessions WHERE session_id = %s",
                        (info.parent_id,),
                    ).fetchone()
                    check_fork_point(info, row)
                self._sql.insert_session(conn, info, counters)
        except pg_errors.UniqueViolation:
            raise SessionExistsError(f"session {info.session_id!r} already exists") from None

    @_translated(retry=False)
    def create_row_leased(self, info: SessionInfo, counters: Counters, owner: str, ttl: float) -> Lease:
        # One statement: the row and its runner's first lease (token 1) commit together.
        try:
            with self._db.conn() as conn:
                token, expires = self._sql.insert_session_leased(conn, info, counters, owner, ttl, _NOW)
        except pg_errors.UniqueViolation:
            raise SessionExistsError(f"session {info.session_id!r} already exists") from None
        return Lease(info.session_id, owner, token, expires)

    def row(self, session_id: str) -> SessionInfo | None:
        return self._session_row(session_id, INFO_COLUMNS)

    def log_row(self, session_id: str) -> SessionInfo | None:
        return self._session_row(session_id, ROW_COLUMNS)  # reading a log parses no plan

    @_translated(retry=True)
    def _session_row(self, session_id: str, columns: str) -> SessionInfo | None:
        if not isinstance(session_id, str) or "\x00" in session_id:
            return None  # PostgreSQL text cannot hold NUL, so no session has such an id
        with self._db.conn() as conn:
            row = conn.execute(
                f"SELECT {columns} FROM {self._s}.sessions WHERE session_id = %s", (session_id,)
            ).fetchone()
        return row_info(row) if row else None

    @_translated(retry=True)
    def forks_of(self, session_id: str) -> list[SessionInfo]:
        with self._db.conn() as conn:
            rows = conn.execute(
                f"SELECT {INFO_COLUMNS} FROM {self._s}.sessions WHERE parent_id = %s", (session_id,)
            ).fetchall()
        return [row_info(r) for r in rows]

    @_translated(retry=True)
    def sessions(self) -> list[SessionInfo]:
        with self._db.conn() as conn:
            rows = conn.execute(
                f"SELECT {INFO_COLUMNS} FROM {self._s}.sessions ORDER BY updated_at DESC, session_id"
            ).fetchall()
        return [row_info(r) for r in rows]

    @_translated(retry=True)
    def heads(self, session_ids: Iterable[str] | None) -> list[SessionHead]:
        # One statement: each session's row, the event at its head and its lease.
        s = self._s
        where = "" if session_ids is None else "WHERE s.session_id = ANY(%s) "
        with self._db.conn() as conn:
            rows = conn.execute(
                f"SELECT s.session_id, s.head, s.created_at, s.updated_at, s.parent_id, s.parent_version, s.meta, "
                f"e.ts, e.author, e.round, e.step, e.payload, e.crc, l.owner, l.token, l.expires_at, {_NOW} "
                f"FROM {s}.sessions s LEFT JOIN {s}.events e ON e.session_id = s.session_id AND e.version = s.head "
                f"LEFT JOIN {s}.leases l ON l.session_id = s.session_id {where}ORDER BY s.updated_at DESC, s.session_id",
                () if session_ids is None else ([sid for sid in session_ids if "\x00" not in sid],),
            ).fetchall()
        now = time.time()
        heads = []
        for row in rows:
            info = row_info(row[:7])
            lease = None
            if row[13] is not None:  # expiry on this machine's clock, as lease_of reports it
                lease = Lease(
                    info.session_id, row[13], int(row[14]), 0.0 if row[15] <= 0 else now + (row[15] - row[16])
                )
            if row[11] is None:  # no events, or a fork whose head is in its parent's log
                heads.append(SessionHead(info, self.last_event(info) if info.version else None, lease))
                continue
            heads.append(SessionHead(info, head_event(info.session_id, info.version, row[7:13]), lease))
        return heads

    @_translated(retry=True)
    def find(self, prefix: str, limit: int | None) -> list[SessionInfo]:
        with self._db.conn() as conn:
            rows = conn.execute(
                f"SELECT {INFO_COLUMNS} FROM {self._s}.sessions WHERE left(session_id, %s) = %s "
                "ORDER BY updated_at DESC, session_id LIMIT %s",
                (len(prefix), prefix, limit if limit is None else max(0, limit)),
            ).fetchall()
        return [row_info(r) for r in rows]

    @_translated(retry=True)
    def lease_of(self, session_id: str) -> Lease | None:
        with self._db.conn() as conn:
            row = conn.execute(
                f"SELECT owner, token, expires_at, {_NOW} FROM {self._s}.leases WHERE session_id = %s", (session_id,)
            ).fetchone()
        if row is None:
            return None
        # The server's clock decides expiry; report it on this machine's clock.
        expires = 0.0 if row[2] <= 0 else time.time() + (row[2] - row[3])
        return Lease(session_id, row[0], int(row[1]), expires)

    @_translated(retry=True)
    def delete_rows(self, session_id: str) -> None:
        with self._db.transaction() as conn:
            for table in ("events", "snapshots", "leases", "sessions"):
                conn.execute(f"DELETE FROM {self._s}.{table} WHERE session_id = %s", (session_id,))

    # --------------------------------------------------------------- events

    def write_event(self, event: Event, expected_version: int, fence: int | None) -> None:
        if self.group_commit:
            self._committer.append(event, expected_version, fence)
        else:
            self._write_one(Pending(event, expected_version, fence, blocking=False))

    def write_events(self, events: Sequence[Event], expected_version: int, fence: int | None) -> None:
        self._committer.write_events(events, expected_version, fence, shared=self.group_commit)

    def awrite_events(
        self, events: Sequence[Event], expected_version: int, fence: int | None, on_written: Callable[[], Any] | None
    ) -> Awaitable[None]:
        return self._committer.awrite_events(events, expected_version, fence, on_written, shared=self.group_commit)

    def awrite_event(
        self, event: Event, expected_version: int, fence: int | None, on_written: Callable[[], Any] | None
    ) -> Awaitable[None]:
        # Returns the committer's coroutine itself: one coroutine frame less per commit.
        if self.group_commit:
            return self._committer.append_async(event, expected_version, fence, on_written)
        return super().awrite_event(event, expected_version, fence, on_written)

    def _group_committer(self) -> GroupCommitter:
        return self._committer

    @_translated(retry=False)
    def _write_one(self, entry: Pending) -> None:
        self._write_batch([entry])
        if entry.error is not None:
            error, entry.error = entry.error, None
            raise error

    @_translated(retry=False)
    def _write_batch(self, entries: list[Pending]) -> None:
        """Write appends in ONE transaction; a refused entry fails only itself.

        One statement per *round*, and a round holds at most one entry per
        session; a batch only needs a second round (then inside an explicit
        transaction) when one session has two appends queued at once.

        If the connection breaks mid-way, a COMMIT may or may not have
        happened: those entries get an :class:`OutcomeUnknownError` saying so
        instead of being retried, which could write them twice.
        """
        rounds = rounds_of(entries)
        settled: set[int] = set()  # entries whose outcome is certain
        with self._db.conn() as conn:
            try:
                if len(rounds) == 1:
                    self._sql.write_round(conn, rounds[0], settled)
                else:
                    with conn.transaction():
                        for batch in rounds:
                            self._sql.write_round(conn, batch, set())
            except psycopg.Error as exc:
                if not conn.broken:
                    raise  # the server refused the statement or transaction: nothing was written
                for entry in entries:
                    if id(entry) not in settled:
                        entry.error = OutcomeUnknownError(
                            entry.event.session_id, entry.event.version, one_line(exc), "PostgreSQL", entry.event
                        )

    @_translated(retry=True)
    def read_own(self, session_id: str, after: int, upto: int | None) -> Iterator[Event]:
        with self._db.conn() as conn:
            # One statement, one snapshot: the head tells a damaged *trailing*
            # record from one in the middle, so it must agree with the rows.
            rows = conn.execute(
                f"SELECT version, ts, author, round, step, payload, crc, "
                f"(SELECT head FROM {self._s}.sessions WHERE session_id = %(sid)s) FROM {self._s}.events "
                "WHERE session_id = %(sid)s AND version > %(after)s AND version <= %(upto)s ORDER BY version",
                {"sid": session_id, "after": after, "upto": upto if upto is not None else 2**62},
            ).fetchall()
        head = rows[0][7] if rows else None
        return decode_rows(session_id, [row[:7] for row in rows], head=head)

    @_translated(retry=True)
    def own_formats(self, session_id: str) -> tuple[dict[int, int], dict[int, int]]:
        with self._db.conn() as conn:
            rows = conn.execute(
                f"SELECT version, payload FROM {self._s}.events WHERE session_id = %s", (session_id,)
            ).fetchall()
            snaps = conn.execute(
                f"SELECT version, state FROM {self._s}.snapshots WHERE session_id = %s", (session_id,)
            ).fetchall()
        return formats_of(rows), formats_of(snaps)

    @_translated(retry=False)
    def rewrite_rows(
        self,
        session_id: str,
        events: list[Event],
        snapshots: Sequence[Snapshot] = (),
        meta: dict[str, Any] | None = None,
    ) -> None:
        rows = []
        for event in events:
            payload, crc = encode_payload(event, session_id)
            rows.append((payload, crc, session_id, event.version))
        with self._db.transaction() as conn:
            with conn.cursor() as cur:
                found = 0
                for row in rows:
                    cur.execute(
                        f"UPDATE {self._s}.events SET payload = %s, crc = %s WHERE session_id = %s AND version = %s",
                        row,
                    )
                    found += cur.rowcount
            self._sql.rewrite_extras(conn, session_id, snapshots, meta)
            if found != len(rows):
                raise StoreError(
                    f"session {session_id!r}: some of the events to rewrite are not in its own log; nothing was rewritten"
                )

    @_translated(retry=True)
    def quarantine_record(self, session_id: str, version: int) -> bool:
        with self._db.transaction() as conn:
            row = conn.execute(
                f"SELECT payload, crc FROM {self._s}.events WHERE session_id = %s AND version = %s FOR UPDATE",
                (session_id, version),
            ).fetchone()
            if row is None:
                return False
            try:
                decode_payload(row[0], row[1])
                return False
            except DamagedRecord as exc:
                payload, crc = quarantine_payload(row[0], str(exc))
            conn.execute(
                f"UPDATE {self._s}.events SET payload = %s, crc = %s WHERE session_id = %s AND version = %s",
                (payload, crc, session_id, version),
            )
            return True

    # ------------------------------------------------------------ snapshots

    @_translated(retry=True)
    def own_snapshot(self, session_id: str, upto: int | None) -> Snapshot | None:
        with self._db.conn() as conn:
            rows = conn.execute(
                f"SELECT version, ts, state, crc FROM {self._s}.snapshots WHERE session_id = %s AND version <= %s "
                "ORDER BY version DESC LIMIT 3",
                (session_id, upto if upto is not None else 2**62),
            ).fetchall()
        return first_good_snapshot(session_id, rows)

    @_translated(retry=True)
    def save_snapshot(self, snapshot: Snapshot) -> None:
        # A snapshot is a cache of the fold: losing the newest one in a crash only
        # means a longer replay, so its COMMIT does not wait for the WAL flush.
        with self._db.cache_conn() as conn:
            self._sql.insert_snapshot(conn, snapshot)

    @_translated(retry=True)
    def prune_snapshots(self, session_id: str, keep: int) -> None:
        with self._db.cache_conn() as conn:
            conn.execute(
                f"DELETE FROM {self._s}.snapshots WHERE session_id = %(sid)s AND version NOT IN ("
                f"SELECT version FROM {self._s}.snapshots WHERE session_id = %(sid)s ORDER BY version DESC LIMIT %(keep)s)",
                {"sid": session_id, "keep": max(0, keep)},
            )

    @_translated(retry=True)
    def save_snapshot_pruned(self, snapshot: Snapshot, keep: int) -> None:
        with self._db.cache_conn() as conn:  # one round trip (see save_snapshot for the commit)
            self._sql.insert_snapshot_pruned(conn, snapshot, keep)

    @_translated(retry=True)
    def save_snapshot_released(self, snapshot: Snapshot, keep: int, lease: Lease) -> None:
        # One statement: a release's COMMIT need not wait for the WAL flush either (a release lost
        # in a crash costs a wait for the lease's expiry, never a wrong state).
        with self._db.cache_conn() as conn:
            self._sql.insert_snapshot_pruned(conn, snapshot, keep, lease)

    # ------------------------------------------------------------ retention

    @_translated(retry=True)  # a repeat finds the prune done (or does it)
    def prune_rows(self, session_id: str, cut: int, base: Event, snapshot: Snapshot) -> bool:
        with self._db.transaction() as conn:
            return self._sql.replace_below(conn, session_id, cut, base, snapshot)

    @_translated(retry=True)  # a repeat finds the fork detached and does nothing
    def materialise_rows(
        self, info: SessionInfo, events: list[Event], snapshot: Snapshot | None, meta: dict[str, Any]
    ) -> bool:
        with self._db.transaction() as conn:
            return self._sql.detach_fork(conn, info, events, snapshot, meta)

    @_translated(retry=False)
    def import_rows(
        self, info: SessionInfo, events: list[Event], snapshots: list[Snapshot], counters: Counters
    ) -> None:
        try:
            with self._db.transaction() as conn:
                self._sql.insert_session(conn, info, counters)
                self._sql.insert_events(conn, info.session_id, events)
                for snapshot in snapshots:
                    self._sql.insert_snapshot(conn, snapshot)
        except pg_errors.UniqueViolation:
            raise SessionExistsError(f"session {info.session_id!r} already exists") from None

    # --------------------------------------------------------------- leases

    @_translated(retry=True)  # safe to repeat: the same owner's lease is renewed, not taken twice
    def acquire_lease(self, session_id: str, owner: str, ttl: float) -> Lease:
        s = self._s
        with self._db.conn() as conn:
            try:
                row = self._sql.take_lease(conn, session_id, owner, ttl, _NOW)
            except pg_errors.ForeignKeyViolation:
                raise SessionNotFoundError(session_id) from None
            if row is not None:
                return Lease(session_id, owner, int(row[0]), float(row[1]))
            held = conn.execute(
                f"SELECT owner, expires_at, {_NOW} FROM {s}.leases WHERE session_id = %s", (session_id,)
            ).fetchone()
        if held is None:  # released and deleted in between: try again
            return self.acquire_lease(session_id, owner, ttl)
        # Report the expiry on this machine's clock, so "expires in N s" reads right here.
        raise LeaseHeldError(session_id, held[0], time.time() + (held[1] - held[2]))

    @_translated(retry=True)
    def release_lease(self, lease: Lease) -> None:
        with self._db.conn() as conn:
            conn.execute(
                f"UPDATE {self._s}.leases SET expires_at = 0 WHERE session_id = %s AND owner = %s AND token = %s",
                (lease.session_id, lease.owner, lease.token),
            )

    # ------------------------------------------------------------- watching

    async def watch(self, session_id: str, after: int = 0, *, interval: float = 0.2) -> AsyncIterator[Event]:
        """Yield the session's new events as they are committed, woken by NOTIFY: all the watchers of
        this store on one event loop share ONE LISTEN connection (see :func:`watch_notified`)."""
        listener = self._listeners.setdefault(
            asyncio.get_running_loop(), Listener(self._db.alisten, self.channel, registrar(self._db.conn, self._sql))
        )
        polling = functools.partial(super().watch, session_id, interval=interval)
        async for event in watch_notified(self, listener, session_id, after, interval, polling):
            yield event
