"""The PostgreSQL event store (``postgresql://user@host:port/db?schema=NAME``).

Many processes on many machines can share one store. Everything lives in one
schema (``saucer`` unless ``?schema=`` names another), which saucer creates and
migrates itself: the ``saucer_schema`` table records each applied version,
:meth:`PostgresStore.migrate` brings a schema up to date (``saucer store
migrate``), and opening a store does it automatically the first time. Concurrent
migrators serialise on a transaction-level advisory lock.

Appends
    One statement per batch checks and writes everything: it updates each
    session's head only where it still equals the version the commit was based
    on (and, for a leased writer, only where its lease token is still current),
    inserts the events of exactly those sessions, and ``NOTIFY``\\ s watchers, all
    in one transaction. A writer whose base version is stale gets
    :class:`ConflictError`; one whose token is outdated gets :class:`FencedError`.
    Concurrent appends of one process share that statement and its COMMIT
    (group commit, see ``saucer.store._group``); ``synchronous_commit`` decides
    when PostgreSQL acknowledges a COMMIT, and saucer leaves it at the
    server's setting (``on`` by default: flushed to the WAL on disk).

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
import select
import threading
import time
import warnings
from contextlib import contextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, Sequence, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson
import psycopg
from psycopg import errors as pg_errors
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from saucer.store._codec import (
    DamagedRecord,
    decode_payload,
    decode_rows,
    encode_payload,
    encode_state,
    first_good_snapshot,
    quarantine_payload,
)
from saucer.store._group import GroupCommitter, Pending
from saucer.store.base import (
    ConflictError,
    EventStore,
    Feature,
    FencedError,
    Lease,
    LeaseHeldError,
    OutcomeUnknownError,
    SessionExistsError,
    SessionInfo,
    SessionNotFoundError,
    Snapshot,
    StoreError,
)
from saucer.store.model import Event

__all__ = ["PostgresStore", "SCHEMA_VERSION", "DEFAULT_SCHEMA", "split_url"]

DEFAULT_SCHEMA = "saucer"

#: Each entry migrates the schema from version N to N + 1 (``{s}`` is the quoted schema).
_MIGRATIONS: list[list[str]] = [
    [
        """CREATE TABLE {s}.sessions (
            session_id     text PRIMARY KEY,
            head           bigint NOT NULL,
            created_at     double precision NOT NULL,
            updated_at     double precision NOT NULL,
            parent_id      text,
            parent_version bigint,
            meta           jsonb NOT NULL DEFAULT '{{}}'
        )""",
        "CREATE INDEX sessions_updated_at ON {s}.sessions (updated_at DESC)",
        """CREATE TABLE {s}.events (
            session_id text NOT NULL,
            version    bigint NOT NULL,
            ts         double precision NOT NULL,
            author     text NOT NULL,
            round      bigint,
            step       bigint,
            payload    bytea NOT NULL,
            crc        bigint,
            PRIMARY KEY (session_id, version)
        )""",
        """CREATE TABLE {s}.snapshots (
            session_id text NOT NULL,
            version    bigint NOT NULL,
            ts         double precision NOT NULL,
            state      bytea NOT NULL,
            crc        bigint,
            PRIMARY KEY (session_id, version)
        )""",
        """CREATE TABLE {s}.leases (
            session_id text PRIMARY KEY REFERENCES {s}.sessions (session_id) ON DELETE CASCADE,
            owner      text NOT NULL,
            token      bigint NOT NULL,
            expires_at double precision NOT NULL
        )""",
    ],
]

#: The schema version this saucer writes and reads.
SCHEMA_VERSION = len(_MIGRATIONS)

_NOW = "extract(epoch FROM clock_timestamp())::double precision"


def split_url(url: str) -> tuple[str, str]:
    """``postgresql://...?schema=NAME&sslmode=...`` -> (conninfo without ``schema``, schema name)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"not a PostgreSQL store URL: {url!r} (expected postgresql://user@host:port/db)")
    schema = DEFAULT_SCHEMA
    rest: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key == "schema":
            schema = value
        else:
            rest.append((key, value))
    if not schema or "\x00" in schema or len(schema.encode()) > 63:
        raise ValueError(f"PostgreSQL store URL {_display(url)!r}: schema must be a name of 1 to 63 bytes")
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(rest), parts.fragment)), schema


def _display(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    netloc = f"{userinfo.partition(':')[0]}:***@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _closed_by_server(conn: psycopg.Connection[Any]) -> bool:
    """Whether an idle pooled connection was closed by the server meanwhile.

    An idle connection has nothing to read, unless the server said goodbye
    (a termination message, then end of file): only then is it pinged.
    """
    try:
        if not select.select([conn.fileno()], [], [], 0)[0]:
            return False
        conn.execute("")
    except (psycopg.Error, OSError, ValueError):
        return True
    return False


_F = TypeVar("_F", bound=Callable[..., Any])


def _translated(*, retry: bool) -> Callable[[_F], _F]:
    """Turn the ``psycopg`` errors escaping a method into :class:`StoreError`.

    ``retry=True`` (reads, and writes that are safe to repeat) runs the method
    once more, on a fresh connection, when its connection broke under it.
    """

    def decorate(method: _F) -> _F:
        @functools.wraps(method)
        def wrapper(self: "PostgresStore", *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except PoolTimeout as exc:
                raise self._store_error(exc) from exc
            except psycopg.OperationalError as exc:
                if not retry:
                    raise self._store_error(exc) from exc
                first = exc
            except psycopg.Error as exc:
                raise self._store_error(exc) from exc
            self._drop_broken()  # the others may have been closed too (a server restart): not those again
            try:
                return method(self, *args, **kwargs)
            except psycopg.Error as exc:
                raise self._store_error(exc, retried=isinstance(exc, psycopg.OperationalError)) from first

        return wrapper  # type: ignore[return-value]

    return decorate


def _jsonb(value: Any) -> Jsonb:
    return Jsonb(value, dumps=lambda obj: orjson.dumps(obj).decode())


class PostgresStore(EventStore):
    """Events, snapshots and leases in one PostgreSQL schema, shared by any number of processes."""

    features = frozenset(
        {Feature.REPLACE_HISTORY, Feature.IMPORT, Feature.SNAPSHOT_PRUNING, Feature.QUARANTINE, Feature.GROUP_COMMIT}
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
        self._connect_timeout = connect_timeout
        s = _quote(self.schema)
        self._s = s
        self._sql_append = f"""
            WITH b AS (
                SELECT * FROM unnest(%b::text[], %b::bigint[], %b::double precision[], %b::text[],
                                     %b::bigint[], %b::bigint[], %b::bytea[], %b::bigint[], %b::bigint[])
                    AS b(session_id, expected, ts, author, round, step, payload, crc, fence)
            ),
            lk AS (
                SELECT l.session_id, l.token FROM {s}.leases l
                WHERE l.session_id IN (SELECT session_id FROM b WHERE fence IS NOT NULL)
                FOR SHARE
            ),
            up AS (
                UPDATE {s}.sessions s SET head = b.expected + 1, updated_at = b.ts
                FROM b
                WHERE s.session_id = b.session_id AND s.head = b.expected
                  AND (b.fence IS NULL OR EXISTS (
                        SELECT 1 FROM lk WHERE lk.session_id = b.session_id AND lk.token = b.fence))
                RETURNING s.session_id
            ),
            ins AS (
                INSERT INTO {s}.events (session_id, version, ts, author, round, step, payload, crc)
                SELECT b.session_id, b.expected + 1, b.ts, b.author, b.round, b.step, b.payload, b.crc
                FROM b JOIN up USING (session_id)
                RETURNING session_id, version
            )
            SELECT ins.session_id, pg_notify(%s, left(ins.version || ' ' || ins.session_id, 1990)) FROM ins
        """
        try:
            if migrate:
                self._ensure_schema()
        except psycopg.OperationalError as exc:
            raise StoreError(f"cannot connect to PostgreSQL at {_display(url)}: {_one_line(exc)}") from None
        except psycopg.Error as exc:
            raise StoreError(
                f"PostgreSQL at {_display(url)}: cannot create or migrate schema {self.schema!r}: {_one_line(exc)}"
            ) from None
        self._pool: ConnectionPool | None = ConnectionPool(
            self.conninfo,
            min_size=1,
            max_size=max(1, pool_size),
            kwargs={"autocommit": True, "connect_timeout": max(1, int(connect_timeout))},
            open=True,
            name=f"saucer:{self.schema}",
            timeout=max(connect_timeout, 30.0),
        )
        self._committer = GroupCommitter(self._write_batch, self._write_one)
        self._cache_pool: ConnectionPool | None = None
        self._cache_lock = threading.Lock()

    # ------------------------------------------------------------ plumbing

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.conninfo, autocommit=True, connect_timeout=max(1, int(self._connect_timeout)))

    def _conn(self) -> Any:
        if self._pool is None:
            raise StoreError(f"store {_display(self.url)} is closed")
        return self._checked(self._pool)

    @staticmethod
    @contextmanager
    def _checked(pool: ConnectionPool) -> Iterator[psycopg.Connection[Any]]:
        """A connection from ``pool`` that the server has not closed meanwhile (see :func:`_closed_by_server`)."""
        attempts = pool.max_size + 1  # all of them may have been closed at once
        for attempt in range(attempts):
            with pool.connection() as conn:
                if attempt < attempts - 1 and _closed_by_server(conn):
                    conn.close()  # the pool replaces it
                    continue
                yield conn
                return

    def _drop_broken(self) -> None:
        """Test the idle pooled connections and drop those that no longer work."""
        for pool in (self._pool, self._cache_pool):
            if pool is not None:
                try:
                    pool.check()
                except psycopg.Error:
                    pass  # the retry says what is wrong

    def _store_error(self, exc: BaseException, *, retried: bool = False) -> StoreError:
        """The one-sentence :class:`StoreError` for a ``psycopg`` error."""
        where = f"PostgreSQL at {_display(self.url)}"
        if isinstance(exc, PoolTimeout):
            return StoreError(f"cannot get a connection to {where}: {_one_line(exc)}")
        if retried:
            return StoreError(f"lost the connection to {where}, and again on a fresh one: {_one_line(exc)}")
        if isinstance(exc, psycopg.OperationalError):
            return StoreError(f"lost the connection to {where}: {_one_line(exc)}")
        return StoreError(f"{where} refused the request: {_one_line(exc)}")

    def _cache_conn(self) -> Any:
        """A connection whose COMMITs do not wait for the WAL flush, for snapshot writes.

        A snapshot is a cache of the fold: losing the newest one in a crash only
        means a longer replay (events are always written durably), so there is
        no reason to make a committing session wait for its fsync.
        """
        if self._cache_pool is None:
            with self._cache_lock:
                if self._cache_pool is None:
                    if self._pool is None:
                        raise StoreError(f"store {_display(self.url)} is closed")
                    self._cache_pool = ConnectionPool(
                        self.conninfo,
                        min_size=1,
                        max_size=4,
                        kwargs={"autocommit": True, "connect_timeout": max(1, int(self._connect_timeout))},
                        configure=lambda conn: conn.execute("SET synchronous_commit = off"),
                        open=True,
                        name=f"saucer-cache:{self.schema}",
                        timeout=max(self._connect_timeout, 30.0),
                    )
        return self._checked(self._cache_pool)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
        with self._cache_lock:
            cache, self._cache_pool = self._cache_pool, None
        if cache is not None:
            cache.close()

    # ------------------------------------------------------------ migration

    @_translated(retry=True)
    def schema_version(self) -> int:
        """The schema's applied version (0 when saucer has not created it yet)."""
        with self._connect() as conn:
            return self._applied_version(conn)

    def _applied_version(self, conn: psycopg.Connection[Any]) -> int:
        try:
            row = conn.execute(f"SELECT max(version) FROM {self._s}.saucer_schema").fetchone()
        except (pg_errors.UndefinedTable, pg_errors.InvalidSchemaName):
            return 0
        return int(row[0] or 0) if row else 0

    def _ensure_schema(self) -> None:
        with self._connect() as conn:
            current = self._applied_version(conn)
        if current > SCHEMA_VERSION:
            raise StoreError(self._too_new(current))
        if current < SCHEMA_VERSION:
            self.migrate()

    def _too_new(self, version: int) -> str:
        return (
            f"PostgreSQL schema {self.schema!r} is at version {version}, newer than this saucer "
            f"understands ({SCHEMA_VERSION}); upgrade saucer"
        )

    @_translated(retry=True)
    def migrate(self) -> int:
        """Create the schema or bring it up to :data:`SCHEMA_VERSION`; return the version.

        Safe to run from many processes at once and again and again.
        """
        s = self._s
        with self._connect() as conn:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"saucer.migrate:{self.schema}",))
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {s}.saucer_schema ("
                    "version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
                )
                current = self._applied_version(conn)
                if current > SCHEMA_VERSION:
                    raise StoreError(self._too_new(current))
                for version in range(current + 1, SCHEMA_VERSION + 1):
                    for statement in _MIGRATIONS[version - 1]:
                        conn.execute(statement.format(s=s))
                    conn.execute(f"INSERT INTO {s}.saucer_schema (version) VALUES (%s)", (version,))
        return SCHEMA_VERSION

    # ------------------------------------------------------------- sessions

    _INFO_COLUMNS = "session_id, head, created_at, updated_at, parent_id, parent_version, meta"

    @staticmethod
    def _row_info(row: Sequence[Any]) -> SessionInfo:
        meta = row[6]
        if isinstance(meta, (str, bytes)):
            meta = orjson.loads(meta)
        return SessionInfo(row[0], row[1], row[2], row[3], row[4], row[5], dict(meta or {}))

    def _insert_session(self, conn: psycopg.Connection[Any], info: SessionInfo) -> None:
        conn.execute(
            f"INSERT INTO {self._s}.sessions ({self._INFO_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (
                info.session_id,
                info.version,
                info.created_at,
                info.updated_at,
                info.parent_id,
                info.parent_version,
                _jsonb(info.meta),
            ),
        )

    def _prune_lock(self, conn: psycopg.Connection[Any], session_id: str, *, shared: bool = False) -> None:
        """Serialise, per session, prunes and materialisations (exclusive) with the making of its forks (shared)."""
        kind = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
        conn.execute(f"SELECT {kind}(hashtext(%s))", (f"saucer.prune:{self.schema}:{session_id}",))

    @_translated(retry=False)
    def _create(self, info: SessionInfo) -> None:
        s = self._s
        try:
            with self._conn() as conn, conn.transaction():
                if info.parent_id is not None:
                    self._prune_lock(conn, info.parent_id, shared=True)
                    row = conn.execute(
                        f"SELECT head, coalesce((meta ->> 'pruned_to')::bigint, 0) FROM {s}.sessions WHERE session_id = %s",
                        (info.parent_id,),
                    ).fetchone()
                    self._check_fork_point(info, row)
                self._insert_session(conn, info)
        except pg_errors.UniqueViolation:
            raise SessionExistsError(f"session {info.session_id!r} already exists") from None

    @_translated(retry=True)
    def _info(self, session_id: str) -> SessionInfo | None:
        if not isinstance(session_id, str) or "\x00" in session_id:
            return None  # PostgreSQL text cannot hold NUL, so no session has such an id
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT {self._INFO_COLUMNS} FROM {self._s}.sessions WHERE session_id = %s", (session_id,)
            ).fetchone()
        return self._row_info(row) if row else None

    @_translated(retry=True)
    def _forks(self, session_id: str) -> list[SessionInfo]:
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {self._INFO_COLUMNS} FROM {self._s}.sessions WHERE parent_id = %s", (session_id,)
            ).fetchall()
        return [self._row_info(r) for r in rows]

    @_translated(retry=True)
    def sessions(self) -> list[SessionInfo]:
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {self._INFO_COLUMNS} FROM {self._s}.sessions ORDER BY updated_at DESC, session_id"
            ).fetchall()
        return [self._row_info(r) for r in rows]

    @_translated(retry=True)
    def find_sessions(self, prefix: str = "", limit: int | None = None) -> list[SessionInfo]:
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {self._INFO_COLUMNS} FROM {self._s}.sessions WHERE left(session_id, %s) = %s "
                "ORDER BY updated_at DESC, session_id LIMIT %s",
                (len(prefix), prefix, limit if limit is None else max(0, limit)),
            ).fetchall()
        return [self._row_info(r) for r in rows]

    @_translated(retry=True)
    def lease_of(self, session_id: str) -> Lease | None:
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT owner, token, expires_at, {_NOW} FROM {self._s}.leases WHERE session_id = %s", (session_id,)
            ).fetchone()
        if row is None:
            return None
        # The server's clock decides expiry; report it on this machine's clock.
        expires = 0.0 if row[2] <= 0 else time.time() + (row[2] - row[3])
        return Lease(session_id, row[0], int(row[1]), expires)

    @_translated(retry=True)
    def _delete(self, session_id: str) -> None:
        with self._conn() as conn, conn.transaction():
            for table in ("events", "snapshots", "leases", "sessions"):
                conn.execute(f"DELETE FROM {self._s}.{table} WHERE session_id = %s", (session_id,))

    # --------------------------------------------------------------- events

    def _append(self, event: Event, expected_version: int, fence: int | None) -> None:
        if self.group_commit:
            self._committer.append(event, expected_version, fence)
        else:
            self._write_one(Pending(event, expected_version, fence, blocking=False))

    def _aappend(
        self, event: Event, expected_version: int, fence: int | None, on_written: Callable[[], Any] | None
    ) -> Awaitable[None]:
        # Returns the committer's coroutine itself: one coroutine frame less per commit.
        if self.group_commit:
            return self._committer.append_async(event, expected_version, fence, on_written)
        return super()._aappend(event, expected_version, fence, on_written)

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
        settled: set[int] = set()  # entries whose outcome is certain
        with self._conn() as conn:
            try:
                if len(rounds) == 1:
                    self._write_round(conn, rounds[0], settled)
                else:
                    with conn.transaction():
                        for batch in rounds:
                            self._write_round(conn, batch, set())
            except psycopg.Error as exc:
                if not conn.broken:
                    raise  # the server refused the statement or transaction: nothing was written
                for entry in entries:
                    if id(entry) not in settled:
                        entry.error = OutcomeUnknownError(
                            entry.event.session_id, entry.event.version, _one_line(exc), "PostgreSQL", entry.event
                        )

    def _write_round(self, conn: psycopg.Connection[Any], batch: list[Pending], settled: set[int]) -> None:
        events = [e.event for e in batch]
        done = conn.execute(
            self._sql_append,
            (
                [e.session_id for e in events],
                [e.expected for e in batch],
                [e.timestamp for e in events],
                [e.author for e in events],
                [e.round for e in events],
                [e.step for e in events],
                [e.payload for e in batch],
                [e.crc for e in batch],
                [e.fence for e in batch],
                self.channel,
            ),
        ).fetchall()
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

    @_translated(retry=True)
    def _read(self, session_id: str, after: int, upto: int | None) -> Iterator[Event]:
        with self._conn() as conn:
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
    def quarantine_record(self, session_id: str, version: int) -> bool:
        with self._conn() as conn, conn.transaction():
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
    def _snapshot(self, session_id: str, upto: int | None) -> Snapshot | None:
        with self._conn() as conn:
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
        with self._cache_conn() as conn:
            self._insert_snapshot(conn, snapshot)

    @_translated(retry=True)
    def prune_snapshots(self, session_id: str, keep: int) -> None:
        with self._cache_conn() as conn:
            conn.execute(
                f"DELETE FROM {self._s}.snapshots WHERE session_id = %(sid)s AND version NOT IN ("
                f"SELECT version FROM {self._s}.snapshots WHERE session_id = %(sid)s ORDER BY version DESC LIMIT %(keep)s)",
                {"sid": session_id, "keep": max(0, keep)},
            )

    # ------------------------------------------------------------ retention

    @_translated(retry=True)  # a repeat finds the prune done (or does it)
    def _prune(self, session_id: str, cut: int, base: Event, snapshot: Snapshot) -> bool:
        payload, crc = encode_payload(base)
        s = self._s
        with self._conn() as conn, conn.transaction():
            # Prunes of one session take turns, and no fork of it is made meanwhile;
            # appends go on (they only touch versions above the head, which is at or above the cut).
            self._prune_lock(conn, session_id)
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
            self._insert_snapshot(conn, snapshot)
            # Last, so that the session row (which every append updates) is locked only briefly.
            conn.execute(
                f"UPDATE {s}.sessions SET meta = meta || jsonb_build_object('pruned_to', %s::bigint), "
                "parent_id = NULL, parent_version = NULL WHERE session_id = %s",
                (cut, session_id),
            )
        return True

    def _insert_events(self, conn: psycopg.Connection[Any], owner: str, events: list[Event]) -> None:
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

    def _insert_snapshot(self, conn: psycopg.Connection[Any], snapshot: Snapshot, *, replace: bool = True) -> None:
        blob, crc = encode_state(snapshot.state)
        conflict = "DO UPDATE SET ts = EXCLUDED.ts, state = EXCLUDED.state, crc = EXCLUDED.crc" if replace else "DO NOTHING"
        conn.execute(
            f"INSERT INTO {self._s}.snapshots (session_id, version, ts, state, crc) VALUES (%s, %s, %s, %s, %s) "
            f"ON CONFLICT (session_id, version) {conflict}",
            (snapshot.session_id, snapshot.version, snapshot.timestamp, blob, crc),
        )

    @_translated(retry=True)  # a repeat finds the fork detached and does nothing
    def _materialise(self, info: SessionInfo, events: list[Event], snapshot: Snapshot | None, meta: dict[str, Any]) -> bool:
        s = self._s
        with self._conn() as conn, conn.transaction():
            self._prune_lock(conn, info.session_id)  # its attachment only changes under this lock
            row = conn.execute(
                f"SELECT parent_id, parent_version FROM {s}.sessions WHERE session_id = %s", (info.session_id,)
            ).fetchone()
            if row is None or (row[0], row[1]) != (info.parent_id, info.parent_version):
                return False
            self._insert_events(conn, info.session_id, events)
            if snapshot is not None:
                self._insert_snapshot(conn, snapshot, replace=False)
            # Last, so that the session row (which every append updates) is locked only briefly.
            conn.execute(
                f"UPDATE {s}.sessions SET parent_id = NULL, parent_version = NULL, meta = meta || %s "
                "WHERE session_id = %s",
                (_jsonb(meta), info.session_id),
            )
        return True

    @_translated(retry=False)
    def _import(self, info: SessionInfo, events: list[Event], snapshots: list[Snapshot]) -> None:
        try:
            with self._conn() as conn, conn.transaction():
                self._insert_session(conn, info)
                self._insert_events(conn, info.session_id, events)
                for snapshot in snapshots:
                    self._insert_snapshot(conn, snapshot)
        except pg_errors.UniqueViolation:
            raise SessionExistsError(f"session {info.session_id!r} already exists") from None

    # --------------------------------------------------------------- leases

    @_translated(retry=True)  # safe to repeat: the same owner's lease is renewed, not taken twice
    def acquire_lease(self, session_id: str, owner: str, ttl: float) -> Lease:
        s = self._s
        with self._conn() as conn:
            try:
                row = conn.execute(
                    f"""
                    INSERT INTO {s}.leases AS l (session_id, owner, token, expires_at)
                    VALUES (%(sid)s, %(owner)s, 1, {_NOW} + %(ttl)s)
                    ON CONFLICT (session_id) DO UPDATE
                        SET token = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > {_NOW}
                                         THEN l.token ELSE l.token + 1 END,
                            owner = EXCLUDED.owner,
                            expires_at = EXCLUDED.expires_at
                        WHERE l.owner = EXCLUDED.owner OR l.expires_at <= {_NOW}
                    RETURNING token, expires_at
                    """,
                    {"sid": session_id, "owner": owner, "ttl": float(ttl)},
                ).fetchone()
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
        with self._conn() as conn:
            conn.execute(
                f"UPDATE {self._s}.leases SET expires_at = 0 WHERE session_id = %s AND owner = %s AND token = %s",
                (lease.session_id, lease.owner, lease.token),
            )

    # ------------------------------------------------------------- watching

    async def watch(
        self, session_id: str, after: int = 0, *, interval: float = 0.2
    ) -> AsyncIterator[Event]:
        """Yield the session's new events as they are committed, woken by NOTIFY.

        Without notifications (no LISTEN possible, or the listening connection
        was lost) it polls every ``interval`` seconds; with them it still
        re-reads every few seconds as a safety net.
        """
        try:
            listener = await psycopg.AsyncConnection.connect(
                self.conninfo, autocommit=True, connect_timeout=max(1, int(self._connect_timeout))
            )
            await listener.execute(f"LISTEN {_quote(self.channel)}")
        except psycopg.Error as exc:
            warnings.warn(
                f"store {_display(self.url)}: cannot LISTEN ({exc}); watching {session_id!r} by polling",
                RuntimeWarning,
                stacklevel=2,
            )
            async for event in super().watch(session_id, after, interval=interval):
                yield event
            return
        safety = max(interval, 5.0)
        last = after
        try:
            while True:
                fresh = await asyncio.to_thread(lambda: list(self.read(session_id, last)))
                for event in fresh:
                    last = event.version
                    yield event
                if fresh:
                    continue
                try:
                    async for note in listener.notifies(timeout=safety):
                        _, _, sid = note.payload.partition(" ")
                        if sid == session_id:
                            break
                except psycopg.Error as exc:
                    warnings.warn(
                        f"store {_display(self.url)}: lost the LISTEN connection ({_one_line(exc)}); "
                        f"watching {session_id!r} by polling",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                    break
        finally:
            await listener.close()
        async for event in super().watch(session_id, last, interval=interval):
            yield event
