"""How the PostgreSQL store reaches its server: URLs, the schema and its
migrations, and pools of connections that the server may close under them.

A store URL is ``postgresql://user@host:port/db?schema=NAME``; the schema
(``saucer`` by default) is created and migrated by saucer: ``saucer_schema``
records each applied version, ``saucer_format`` the newest record format the
schema holds (a newer one than this code reads is refused), and concurrent migrators serialise on a
transaction-level advisory lock. Every message names the server by its URL
without the password (:func:`display_url`).

:class:`Connections` owns the two pools of one store: one for everything, one
whose COMMITs do not wait for the WAL flush (for snapshots, a cache). A pooled
connection the server has closed meanwhile (a restart, ``pg_terminate_backend``,
an idle timeout) is recognised when it is taken from the pool, without a round
trip, and replaced.
"""

from __future__ import annotations

import contextlib
import select
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool, PoolTimeout

from saucer.store._postgres_migrate import SUMMARY_COLUMNS, count_summaries
from saucer.store.model import FormatTooNewError, StoreError
from saucer.store.upcast import FORMAT_VERSION

__all__ = [
    "DEFAULT_SCHEMA",
    "SCHEMA_VERSION",
    "Connections",
    "applied_version",
    "closed_by_server",
    "display_url",
    "ensure_schema",
    "migrate",
    "one_line",
    "quote",
    "record_format",
    "split_url",
    "too_new",
]

DEFAULT_SCHEMA = "saucer"

#: Each entry migrates the schema from version N to N + 1: statements (``{s}`` is the
#: quoted schema), or functions ``(connection, quoted schema)`` for what SQL alone cannot do.
_MIGRATIONS: list[list[str | Callable[[psycopg.Connection[Any], str], None]]] = [
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
    [  # 2: the newest record format the schema holds (saucer.store.upcast)
        """CREATE TABLE {s}.saucer_format (
            one    boolean PRIMARY KEY DEFAULT true CHECK (one),
            newest integer NOT NULL
        )""",
    ],
    [  # 3: the summary of each session, kept by its commits (saucer.store.summary)
        SUMMARY_COLUMNS,
        count_summaries,
    ],
    [  # 4: every commit moves its session's updated_at: while it was indexed, no commit's update of
        # the session row could be HOT (heap-only), and each one also wrote a new index entry. Without
        # it a commit costs the server ~20% less CPU; listings sort the session rows instead (top-N).
        "DROP INDEX IF EXISTS {s}.sessions_updated_at",
    ],
    [  # 5: the backend pids LISTENing for a session's commits: a commit notifies only a watched session,
        # so it no longer wakes every listener of the database (procrastinate's workers) for nothing.
        "ALTER TABLE {s}.sessions ADD COLUMN watchers integer[] NOT NULL DEFAULT '{{}}'",
    ],
]

#: The schema version this saucer writes and reads.
SCHEMA_VERSION = len(_MIGRATIONS)


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
        raise ValueError(f"PostgreSQL store URL {display_url(url)!r}: schema must be a name of 1 to 63 bytes")
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(rest), parts.fragment)), schema


def display_url(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    netloc = f"{userinfo.partition(':')[0]}:***@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def closed_by_server(conn: psycopg.Connection[Any]) -> bool:
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


def applied_version(conn: psycopg.Connection[Any], schema: str) -> int:
    """The schema's applied version (0 when saucer has not created it yet)."""
    try:
        row = conn.execute(f"SELECT max(version) FROM {quote(schema)}.saucer_schema").fetchone()
    except (pg_errors.UndefinedTable, pg_errors.InvalidSchemaName):
        return 0
    return int(row[0] or 0) if row else 0


def migrate(conn: psycopg.Connection[Any], schema: str) -> int:
    """Create ``schema`` or bring it up to :data:`SCHEMA_VERSION`, in one transaction; return the version.

    Safe to run from many processes at once and again and again.
    """
    s = quote(schema)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"saucer.migrate:{schema}",))
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {s}.saucer_schema ("
            "version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        current = applied_version(conn, schema)
        if current > SCHEMA_VERSION:
            raise StoreError(too_new(schema, current))
        for version in range(current + 1, SCHEMA_VERSION + 1):
            for statement in _MIGRATIONS[version - 1]:
                if callable(statement):
                    statement(conn, s)
                else:
                    conn.execute(statement.format(s=s))
            conn.execute(f"INSERT INTO {s}.saucer_schema (version) VALUES (%s)", (version,))
        record_format(conn, schema)
    return SCHEMA_VERSION


def ensure_schema(conninfo: str, schema: str, connect_timeout: float) -> None:
    """Migrate ``schema`` unless it is up to date, on a connection of its own."""
    with _connect(conninfo, connect_timeout) as conn:
        current = applied_version(conn, schema)
        if current > SCHEMA_VERSION:
            raise StoreError(too_new(schema, current))
        if current < SCHEMA_VERSION:
            migrate(conn, schema)
        else:
            record_format(conn, schema)


def record_format(conn: psycopg.Connection[Any], schema: str) -> int:
    """Refuse a schema holding records newer than :data:`~saucer.store.upcast.FORMAT_VERSION`,
    else record that version as seen (this code writes nothing older); return it."""
    s = quote(schema)
    row = conn.execute(f"SELECT newest FROM {s}.saucer_format").fetchone()
    if row is not None and row[0] > FORMAT_VERSION:
        raise FormatTooNewError(f"PostgreSQL schema {schema!r}", row[0], FORMAT_VERSION)
    if row is None or row[0] < FORMAT_VERSION:
        conn.execute(
            f"INSERT INTO {s}.saucer_format (newest) VALUES (%s) "
            f"ON CONFLICT (one) DO UPDATE SET newest = greatest({s}.saucer_format.newest, excluded.newest)",
            (FORMAT_VERSION,),
        )
    return FORMAT_VERSION


def _connect(conninfo: str, connect_timeout: float) -> psycopg.Connection[Any]:
    return psycopg.connect(conninfo, autocommit=True, connect_timeout=max(1, int(connect_timeout)))


def too_new(schema: str, version: int) -> str:
    """What to say about a schema written by a newer saucer."""
    return (
        f"PostgreSQL schema {schema!r} is at version {version}, newer than this saucer "
        f"understands ({SCHEMA_VERSION}); upgrade saucer"
    )


class Connections:
    """The connection pools of one store, and the one-sentence errors for what happens on them."""

    def __init__(self, url: str, conninfo: str, schema: str, *, pool_size: int, connect_timeout: float) -> None:
        self.url = url
        self.conninfo = conninfo
        self.schema = schema
        self._connect_timeout = max(1, int(connect_timeout))  # what psycopg accepts
        self._pool_timeout = max(connect_timeout, 30.0)
        self._pool: ConnectionPool | None = ConnectionPool(
            conninfo,
            min_size=1,
            max_size=max(1, pool_size),
            kwargs={"autocommit": True, "connect_timeout": self._connect_timeout},
            open=True,
            name=f"saucer:{schema}",
            timeout=self._pool_timeout,
        )
        self._cache_pool: ConnectionPool | None = None
        self._cache_lock = threading.Lock()

    def connect(self) -> psycopg.Connection[Any]:
        """A new connection of its own, outside the pools (for migrations)."""
        return _connect(self.conninfo, self._connect_timeout)

    async def alisten(self) -> psycopg.AsyncConnection[Any]:
        """A new asynchronous connection of its own, to LISTEN: named ``saucer listen <schema>`` in
        ``pg_stat_activity`` (one per process and event loop, see :mod:`saucer.store._postgres_listen`)."""
        return await psycopg.AsyncConnection.connect(
            self.conninfo,
            autocommit=True,
            connect_timeout=self._connect_timeout,
            application_name=f"saucer listen {self.schema}"[:63],
        )

    def conn(self) -> Any:
        """A pooled connection (a context manager), in autocommit mode."""
        if self._pool is None:
            raise StoreError(f"store {display_url(self.url)} is closed")
        return _checked(self._pool)

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection inside ONE transaction: committed if the block succeeds, rolled back if it raises."""
        with self.conn() as conn, conn.transaction():
            yield conn

    def cache_conn(self) -> Any:
        """A connection whose COMMITs do not wait for the WAL flush, for snapshot writes.

        A snapshot is a cache of the fold: losing the newest one in a crash only
        means a longer replay (events are always written durably), so there is
        no reason to make a committing session wait for its fsync.
        """
        if self._cache_pool is None:
            with self._cache_lock:
                if self._cache_pool is None:
                    if self._pool is None:
                        raise StoreError(f"store {display_url(self.url)} is closed")
                    self._cache_pool = ConnectionPool(
                        self.conninfo,
                        min_size=1,
                        max_size=4,
                        kwargs={"autocommit": True, "connect_timeout": self._connect_timeout},
                        configure=_commit_asynchronously,
                        open=True,
                        name=f"saucer-cache:{self.schema}",
                        timeout=self._pool_timeout,
                    )
        return _checked(self._cache_pool)

    def drop_broken(self) -> None:
        """Test the idle pooled connections and drop those that no longer work."""
        for pool in (self._pool, self._cache_pool):
            if pool is not None:
                with contextlib.suppress(psycopg.Error):  # the retry says what is wrong
                    pool.check()

    def error(self, exc: BaseException, *, retried: bool = False) -> StoreError:
        """The one-sentence :class:`StoreError` for a ``psycopg`` error."""
        where = f"PostgreSQL at {display_url(self.url)}"
        if isinstance(exc, PoolTimeout):
            return StoreError(f"cannot get a connection to {where}: {one_line(exc)}")
        if retried:
            return StoreError(f"lost the connection to {where}, and again on a fresh one: {one_line(exc)}")
        if isinstance(exc, psycopg.OperationalError):
            return StoreError(f"lost the connection to {where}: {one_line(exc)}")
        return StoreError(f"{where} refused the request: {one_line(exc)}")

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
        with self._cache_lock:
            cache, self._cache_pool = self._cache_pool, None
        if cache is not None:
            cache.close()


@contextmanager
def _checked(pool: ConnectionPool) -> Iterator[psycopg.Connection[Any]]:
    """A connection from ``pool`` that the server has not closed meanwhile (see :func:`closed_by_server`)."""
    attempts = pool.max_size + 1  # all of them may have been closed at once
    for attempt in range(attempts):
        with pool.connection() as conn:
            if attempt < attempts - 1 and closed_by_server(conn):
                conn.close()  # the pool replaces it
                continue
            yield conn
            return


def _commit_asynchronously(conn: psycopg.Connection[Any]) -> None:
    """The cache pool's connections: commits need not wait for the WAL flush (derived data)."""
    conn.execute("SET synchronous_commit = off")
