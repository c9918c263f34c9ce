"""Where the queue lives: its own schema beside the store's, in the same PostgreSQL database.

A store at ``postgresql://.../db?schema=S`` (``saucer`` by default) has its
queue in schema ``S_queue``: procrastinate's tables (jobs, workers, events)
and saucer's ``saucer_jobs``, one row per *job identity* (a plan's resolved
path + content hash, or a request's session id). The primary key of
``saucer_jobs`` is what makes "a plan already queued, running or finished is
not queued again" hold between enqueuers on any number of hosts: claiming an
identity is one ``INSERT ... ON CONFLICT DO NOTHING``.

:func:`migrate_queue` creates the schema (``saucer store migrate`` calls it)
under a transaction-scoped advisory lock, so two processes starting at once
never both create it. Workers and enqueuers call :func:`ensure_queue` too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import psycopg

from saucer.store._postgres_conn import display_url, one_line, split_url

__all__ = [
    "QueueUnavailableError",
    "QueueLocation",
    "queue_location",
    "migrate_queue",
    "ensure_queue",
    "QUEUE_SCHEMA_VERSION",
]

#: The version of saucer's own queue tables (procrastinate's version is recorded beside it).
QUEUE_SCHEMA_VERSION = 1

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_SAUCER_TABLES = """
CREATE TABLE IF NOT EXISTS saucer_queue_schema (
    version integer NOT NULL,
    procrastinate text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS saucer_jobs (
    key text PRIMARY KEY,
    session_id text NOT NULL,
    kind text NOT NULL,
    source text NOT NULL,
    queue_name text NOT NULL,
    job_id bigint,
    requeues integer NOT NULL DEFAULT 0,
    claimed_by text NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS saucer_jobs_session_idx ON saucer_jobs (session_id);
CREATE INDEX IF NOT EXISTS saucer_jobs_job_idx ON saucer_jobs (job_id);
ALTER TABLE saucer_jobs ADD COLUMN IF NOT EXISTS reason text;
"""


class QueueUnavailableError(Exception):
    """The queue cannot be used: the store is not PostgreSQL, or its server cannot be reached. One sentence."""


@dataclass(frozen=True)
class QueueLocation:
    """The queue of one PostgreSQL store: how to connect and which schema holds it."""

    store_url: str
    conninfo: str
    schema: str

    @property
    def display(self) -> str:
        """The store URL without its password, for messages."""
        return display_url(self.store_url)

    def connect_kwargs(self) -> dict[str, Any]:
        """Connection arguments that put the queue's schema first on the search path."""
        return {"options": f"-c search_path={self.schema}"}


def queue_location(store_url: str) -> QueueLocation:
    """The queue beside the store at ``store_url``; :class:`QueueUnavailableError` for SQLite and memory stores."""
    scheme = store_url.split(":", 1)[0].lower()
    if scheme not in ("postgresql", "postgres"):
        kind = {"sqlite": "an SQLite", "memory": "an in-memory"}.get(scheme, f"a {scheme!r}")
        raise QueueUnavailableError(
            f"a queue needs a PostgreSQL store, and {display_url(store_url)} is {kind} store; "
            "pass --store postgresql://USER@HOST:PORT/DB (or set store.url / SAUCER_STORE_URL), "
            "or run the plans in this process without --queue"
        )
    try:
        conninfo, store_schema = split_url(store_url)
    except ValueError as exc:
        raise QueueUnavailableError(str(exc)) from None
    schema = f"{store_schema[:57]}_queue"
    if not _NAME.match(schema):
        raise QueueUnavailableError(
            f"the queue's schema would be {schema!r}; a queue needs a store schema made of letters, digits and _ "
            "(?schema=NAME in the store URL)"
        )
    return QueueLocation(store_url, conninfo, schema)


def _procrastinate_version() -> str:
    import procrastinate

    return str(procrastinate.__version__)


def migrate_queue(location: QueueLocation, connect_timeout: float = 10.0) -> tuple[int, str]:
    """Create the queue's schema, or check it; return (saucer's queue version, procrastinate's version).

    Idempotent and safe to run from several processes at once (an advisory
    lock serialises them). A schema made by another procrastinate version is
    refused with a sentence saying so, rather than half-upgraded.
    """
    from procrastinate.schema import SchemaManager

    try:
        with (
            psycopg.connect(
                location.conninfo, connect_timeout=int(connect_timeout), **location.connect_kwargs()
            ) as conn,
            conn.transaction(),
        ):
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"saucer-queue:{location.schema}",))
            conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{location.schema}"')
            present = conn.execute(
                "SELECT 1 FROM information_schema.tables WHERE table_schema = %s AND table_name = 'procrastinate_jobs'",
                (location.schema,),
            ).fetchone()
            if not present:
                conn.execute(SchemaManager.get_schema())
            conn.execute(_SAUCER_TABLES)
            row = conn.execute(
                "SELECT version, procrastinate FROM saucer_queue_schema ORDER BY applied_at DESC LIMIT 1"
            ).fetchone()
            if row is None:
                row = (QUEUE_SCHEMA_VERSION, _procrastinate_version())
                conn.execute("INSERT INTO saucer_queue_schema (version, procrastinate) VALUES (%s, %s)", row)
    except psycopg.Error as exc:
        raise QueueUnavailableError(
            f"PostgreSQL at {location.display}: cannot create or open the queue schema {location.schema!r}: {one_line(exc)}"
        ) from None
    version, made_by = int(row[0]), str(row[1])
    if made_by.split(".")[:2] != _procrastinate_version().split(".")[:2]:
        raise QueueUnavailableError(
            f"the queue schema {location.schema!r} was made with procrastinate {made_by} and this saucer has "
            f"{_procrastinate_version()}; drain the queue, then drop the schema and run saucer store migrate"
        )
    return version, made_by


_ensured: set[str] = set()


def ensure_queue(location: QueueLocation) -> None:
    """:func:`migrate_queue` once per process and schema."""
    key = f"{location.conninfo}\0{location.schema}"
    if key not in _ensured:
        migrate_queue(location)
        _ensured.add(key)
