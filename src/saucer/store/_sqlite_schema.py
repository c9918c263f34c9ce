"""The SQLite file of a store: its tables, their upgrade, the pragmas a
connection needs, what a URL names, and what its errors say.

A store is one file in WAL mode with ``synchronous=FULL``. A session's row in
``sessions`` is what every commit rewrites: its head, update time and summary
counters (:mod:`saucer.store.summary`), nothing larger. Its meta is in
``session_meta``, written when the session is made and when a prune or a
fork's detachment changes it, with the few fields a listing shows in columns
of their own (before the meta, so that reading them never reads the meta's
overflow pages), and the meta's ``plan`` (megabytes for a long plan) in the
last column, ``plan``, with ``0`` holding its place in ``meta``
(``_sqlite_sql.split_plan``): a resume reads the meta without reading the
plan. Its schema version
is in ``saucer_schema``; an older file is upgraded in place when it is opened
(the tables added since are created), a newer one is refused. The newest
record format the file holds is in ``saucer_format``; a file with records
newer than this code reads is refused too. Every
``sqlite3`` error becomes one sentence (:func:`store_error`): a file that is
not a database, or whose pages are damaged, is a
:class:`~saucer.store.DamagedStoreError` naming the file and the command that
checks it.
"""

from __future__ import annotations

import shlex
import sqlite3
from pathlib import Path
from typing import Any

from saucer.store._sqlite_migrate import upgrade_to_4, upgrade_to_5
from saucer.store.model import DamagedStoreError, FormatTooNewError, StoreError
from saucer.store.upcast import FORMAT_VERSION

__all__ = ["SCHEMA_VERSION", "Closed", "connect", "damaged", "migrate", "path_from_url", "record_format", "store_error"]

SCHEMA_VERSION = 5  # 2: events_recent; 3: saucer_format; 4: session_meta and the summary counters; 5: session_meta.plan

_SCHEMA = """
CREATE TABLE IF NOT EXISTS saucer_schema (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS saucer_format (one INTEGER PRIMARY KEY CHECK (one = 1), newest INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
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
);
CREATE TABLE IF NOT EXISTS session_meta (
    session_id  TEXT PRIMARY KEY,
    task        TEXT,
    mode        TEXT,
    request     TEXT,
    forked_from TEXT,
    forked_at   INTEGER,
    pruned_to   INTEGER NOT NULL DEFAULT 0,
    meta        TEXT NOT NULL DEFAULT '{}',
    plan        TEXT
);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    version    INTEGER NOT NULL,
    ts         REAL NOT NULL,
    author     TEXT NOT NULL,
    round      INTEGER,
    step       INTEGER,
    payload    BLOB NOT NULL,
    crc        INTEGER,
    PRIMARY KEY (session_id, version)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events_recent (
    session_id TEXT NOT NULL,
    version    INTEGER NOT NULL,
    ts         REAL NOT NULL,
    author     TEXT NOT NULL,
    round      INTEGER,
    step       INTEGER,
    payload    BLOB NOT NULL,
    crc        INTEGER
);
CREATE TABLE IF NOT EXISTS snapshots (
    session_id TEXT NOT NULL,
    version    INTEGER NOT NULL,
    ts         REAL NOT NULL,
    state      BLOB NOT NULL,
    crc        INTEGER,
    PRIMARY KEY (session_id, version)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS leases (
    session_id TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    token      INTEGER NOT NULL,
    expires_at REAL NOT NULL
);
"""


def path_from_url(url: str) -> Path:
    """``sqlite:///a/b.db`` -> ``a/b.db``; ``sqlite:////tmp/x.db`` -> ``/tmp/x.db``."""
    if not url.startswith("sqlite:///"):
        raise ValueError(
            f"not an SQLite store URL: {url!r} (expected sqlite:///relative/path.db or sqlite:////abs/path.db)"
        )
    rest = url[len("sqlite:///") :]
    if not rest:
        raise ValueError(f"SQLite store URL {url!r} names no file")
    return Path(rest)


class Closed:
    """Stands in for the connection after close(), so a late call says why it fails."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def __getattr__(self, name: str) -> Any:
        raise StoreError(f"the SQLite store {str(self._path)!r} is closed")


def connect(path: Path, busy_timeout: float) -> sqlite3.Connection:
    """A connection to ``path`` in autocommit mode (transactions are explicit), with the store's pragmas."""
    conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=busy_timeout)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        # Checkpoint the WAL into the database every 256 pages (1 MB) rather
        # than SQLite's 1000: commits then mostly overwrite WAL space that is
        # already allocated, and an fdatasync that does not grow the file is
        # markedly cheaper (it needs no metadata journal commit). The extra
        # checkpoints cost a few µs per commit on average.
        conn.execute("PRAGMA wal_autocheckpoint=256")
        # After an unusually large transaction, give the WAL's space back.
        conn.execute("PRAGMA journal_size_limit=4194304")
    except BaseException:
        conn.close()
        raise
    return conn


def migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Inside a write transaction: create the tables or bring them up to :data:`SCHEMA_VERSION`."""
    for statement in _SCHEMA.strip().split(";"):
        if statement.strip():
            conn.execute(statement)
    row = conn.execute("SELECT version FROM saucer_schema").fetchone()
    if row is None:
        conn.execute("INSERT INTO saucer_schema VALUES (?)", (SCHEMA_VERSION,))
    elif row[0] > SCHEMA_VERSION:
        raise StoreError(
            f"{path}: store schema version {row[0]} is newer than this saucer ({SCHEMA_VERSION}); upgrade saucer"
        )
    elif row[0] < SCHEMA_VERSION:  # the tables above were added by CREATE ... IF NOT EXISTS
        if row[0] < 4:
            upgrade_to_4(conn)
        if row[0] < 5:
            upgrade_to_5(conn)
        conn.execute("UPDATE saucer_schema SET version = ?", (SCHEMA_VERSION,))
    record_format(conn, str(path))


def record_format(conn: sqlite3.Connection, where: str) -> int:
    """Inside a write transaction: refuse a store holding records newer than
    :data:`~saucer.store.upcast.FORMAT_VERSION`, else record that version as
    seen (this code writes nothing older); return the newest format recorded."""
    row = conn.execute("SELECT newest FROM saucer_format").fetchone()
    if row is not None and row[0] > FORMAT_VERSION:
        raise FormatTooNewError(f"the SQLite store {where}", row[0], FORMAT_VERSION)
    if row is None or row[0] < FORMAT_VERSION:
        conn.execute(
            "INSERT INTO saucer_format (one, newest) VALUES (1, ?) "
            "ON CONFLICT (one) DO UPDATE SET newest = max(newest, excluded.newest)",
            (FORMAT_VERSION,),
        )
    return FORMAT_VERSION


def damaged(path: Path, reason: str) -> DamagedStoreError:
    """The error for a file whose content cannot be read, with the command that checks it."""
    return DamagedStoreError(
        f"SQLite file {path}", reason, f'sqlite3 {shlex.quote(str(path))} "PRAGMA integrity_check"'
    )


def store_error(exc: sqlite3.Error, path: Path, busy_timeout: float) -> StoreError:
    """The one-sentence :class:`StoreError` for a ``sqlite3`` error."""
    name = exc.sqlite_errorname or ""  # Python >= 3.11 names the SQLite error code
    if name.startswith(("SQLITE_NOTADB", "SQLITE_CORRUPT")) or "malformed" in str(exc) or "not a database" in str(exc):
        return damaged(path, str(exc))
    if name.startswith("SQLITE_BUSY") or "locked" in str(exc):
        return StoreError(
            f"SQLite store {path}: another process kept the database locked for {busy_timeout:g}s ({exc}); try again"
        )
    return StoreError(f"SQLite store {path}: {exc}")
