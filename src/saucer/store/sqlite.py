"""The SQLite event store (``sqlite:///relative.db`` or ``sqlite:////absolute.db``).

WAL mode with ``synchronous=FULL``: a commit is on disk (one WAL fsync) when
:meth:`append` returns. Each append is one ``BEGIN IMMEDIATE`` transaction that
checks the expected version with a conditional update, so concurrent writers
in other threads or processes can never interleave or overwrite each other.
Appending writes one row; nothing is ever rewritten.

Two event tables. ``events`` is clustered by (session, version), so reading a
session's history touches few pages; but a hundred sessions committing
together would then dirty a hundred of its pages per transaction, and SQLite
writes every dirty page whole to the WAL. New events therefore go to the small
``events_recent`` table, whose rows sit in order of arrival, with no index (an
index on the session would again be dirtied all over by each batch), and are
moved into ``events`` in bulk, sorted, once ``fold_every`` of them have
gathered (inside a later commit's transaction, so a crash never leaves a row in
both or neither). A read scans those few rows. For any one session every row of
``events`` is older than every row of ``events_recent``: a read takes the
first, then the second. Versions stay unique because every append checks and
moves the session's head in the same transaction.

Every ``sqlite3`` error is turned into a :class:`~saucer.store.StoreError` at
this module's edge: a file that is not a database, or whose pages are
damaged, is a :class:`~saucer.store.DamagedStoreError` naming the file and the
command that checks it. ``_sqlite_schema`` holds the tables, their upgrade and
those messages; ``_sqlite_write`` the appends and the listing; ``_sqlite_sql`` the statements that rewrite history for a prune.
Every transaction goes through :meth:`SQLiteStore._transaction`.
"""

from __future__ import annotations

import functools
import sqlite3
import threading
import time
import warnings
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

import orjson

from saucer.store._codec import (
    DamagedRecord,
    decode_payload,
    decode_rows,
    encode_state,
    first_good_snapshot,
    formats_of,
    head_event,
    quarantine_payload,
)
from saucer.store._group import GroupCommitter, Pending
from saucer.store._sqlite_schema import SCHEMA_VERSION, Closed, connect, damaged, path_from_url, store_error
from saucer.store._sqlite_schema import migrate as migrate_schema
from saucer.store._sqlite_sql import (
    HEADS,
    INFO_WITHOUT_PLAN,
    detach_fork,
    insert_events,
    insert_session,
    insert_snapshot,
    join_plan,
    replace_below,
    rewrite_rows,
)
from saucer.store._sqlite_write import kept_counters as counters_of
from saucer.store._sqlite_write import listing, write_batch, write_one
from saucer.store.base import (
    EventStore,
    Feature,
    Lease,
    LeaseHeldError,
    SessionInfo,
    SessionNotFoundError,
    Snapshot,
    StoreError,
)
from saucer.store.model import Event, SessionHead
from saucer.store.recorder import check_fork_point
from saucer.store.summary import (
    Counters,
    ListQuery,
    SessionSummary,
    make_summary,
)

__all__ = ["SQLiteStore", "SCHEMA_VERSION", "path_from_url"]

#: A session's row as :class:`SessionInfo` columns (its meta and plan are in ``session_meta``).
_INFO = (
    "SELECT s.session_id, s.head, s.created_at, s.updated_at, s.parent_id, s.parent_version, m.meta, m.plan "
    "FROM sessions s JOIN session_meta m ON m.session_id = s.session_id"
)
_F = TypeVar("_F", bound=Callable[..., Any])


def _translated(method: _F) -> _F:
    """Turn the ``sqlite3`` errors escaping ``method`` into :class:`StoreError` (one sentence)."""

    @functools.wraps(method)
    def wrapper(self: SQLiteStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as exc:
            raise store_error(exc, self.path, self._busy_timeout) from exc

    return cast(_F, wrapper)


class SQLiteStore(EventStore):
    """Events, snapshots and leases in one SQLite file."""

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

    def __init__(self, path: str | Path, *, busy_timeout: float = 30.0) -> None:
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        self._busy_timeout = busy_timeout
        self._lock = threading.RLock()
        # A closed store has a Closed in place of its connection (a late call says why it fails).
        self._conn: sqlite3.Connection = cast(sqlite3.Connection, Closed(self.path))
        # The cursor of the appends (one per store, used under the lock): Connection.execute makes
        # and drops a cursor per statement, and an append runs four.
        self._cursor: sqlite3.Cursor = cast(sqlite3.Cursor, self._conn)
        # Coroutines' appends are written by the committer's writer thread: the event loop runs its
        # other work (other sessions, HTTP, WebSockets) while a batch waits for its fsync.
        self._committer = GroupCommitter(self._write_batch, self._write_one, off_loop=True)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot create the folder of the SQLite store {str(self.path)!r}: {exc.strerror or exc}"
            ) from None
        self._open(busy_timeout)

    @_translated
    def _open(self, busy_timeout: float) -> None:
        self._conn = connect(self.path, busy_timeout)
        self._cursor = self._conn.cursor()
        try:
            self.migrate()
        except BaseException:
            self.close()
            raise

    @contextmanager
    def _transaction(self, kind: str = "IMMEDIATE") -> Iterator[sqlite3.Connection]:
        """One transaction: committed if the block succeeds, rolled back if it raises."""
        with self._lock:
            conn = self._conn
            conn.execute(f"BEGIN {kind}")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:  # an error may have ended it already (e.g. a damaged page)
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def close(self) -> None:
        self._committer.close()
        with self._lock:
            if isinstance(self._conn, sqlite3.Connection):
                self._conn.close()
                self._conn = cast(sqlite3.Connection, Closed(self.path))
                self._cursor = cast(sqlite3.Cursor, self._conn)

    # ------------------------------------------------------------- sessions

    @_translated
    def create_row(self, info: SessionInfo, counters: Counters) -> None:
        with self._transaction() as conn:
            if info.parent_id is not None:
                row = conn.execute(
                    "SELECT s.head, m.pruned_to FROM sessions s JOIN session_meta m ON m.session_id = s.session_id "
                    "WHERE s.session_id = ?",
                    (info.parent_id,),
                ).fetchone()
                check_fork_point(info, row)
            insert_session(conn, info, counters)

    @_translated
    def kept_counters(self, session_id: str) -> Counters | None:
        with self._lock:
            return counters_of(self._conn, session_id)

    @_translated
    def list_rows(self, query: ListQuery) -> list[SessionSummary]:
        sql, args = listing(query)
        with self._lock:
            rows = self._conn.execute(sql, args).fetchall()
        return [make_summary(row) for row in rows]

    def _row_info(self, row: tuple[Any, ...]) -> SessionInfo:
        try:
            meta = join_plan(row[6], row[7])
        except orjson.JSONDecodeError as exc:
            raise damaged(self.path, f"the meta of session {row[0]!r} is not JSON: {exc}") from None
        return SessionInfo(row[0], row[1], row[2], row[3], row[4], row[5], meta)

    @_translated
    def row(self, session_id: str) -> SessionInfo | None:
        with self._lock:
            row = self._conn.execute(f"{_INFO} WHERE s.session_id = ?", (session_id,)).fetchone()
        return self._row_info(row) if row else None

    @_translated
    def row_without_plan(self, session_id: str) -> tuple[SessionInfo, bool] | None:
        # The plan stays in its column, neither read nor parsed (a 3 MB plan would take ~45-80 ms to parse).
        with self._lock:
            row = self._conn.execute(INFO_WITHOUT_PLAN, (session_id,)).fetchone()
        if row is None:
            return None
        info = self._row_info(row[:8])
        if row[8] and isinstance(info.meta, dict):
            info.meta.pop("plan", None)  # the 0 that holds the plan's place
        return info, bool(row[8])

    @_translated
    def log_row(self, session_id: str) -> SessionInfo | None:
        # Reading a log needs no meta but its first readable version: never parse a plan for it.
        with self._lock:
            row = self._conn.execute(
                "SELECT s.session_id, s.head, s.created_at, s.updated_at, s.parent_id, s.parent_version, m.pruned_to "
                "FROM sessions s JOIN session_meta m ON m.session_id = s.session_id WHERE s.session_id = ?",
                (session_id,),
            ).fetchone()
        return (
            None
            if row is None
            else SessionInfo(row[0], row[1], row[2], row[3], row[4], row[5], {"pruned_to": row[6]} if row[6] else {})
        )

    @_translated
    def sessions(self) -> list[SessionInfo]:
        with self._lock:
            rows = self._conn.execute(f"{_INFO} ORDER BY s.updated_at DESC, s.session_id").fetchall()
        return [self._row_info(r) for r in rows]

    @_translated
    def heads(self, session_ids: Iterable[str] | None) -> list[SessionHead]:
        # One read transaction: each session's row, the event at its head
        # (from either event table) and its lease.
        with self._transaction("DEFERRED") as conn:
            if session_ids is None:
                rows = conn.execute(HEADS.format(where="")).fetchall()
            else:
                ids = orjson.dumps(list(session_ids)).decode()
                rows = conn.execute(
                    HEADS.format(where="WHERE s.session_id IN (SELECT value FROM json_each(?))"), (ids,)
                ).fetchall()
        return [self._head(row) for row in rows]

    def _head(self, row: tuple[Any, ...]) -> SessionHead:
        info = self._row_info(row[:8])
        lease = Lease(info.session_id, row[14], row[15], row[16]) if row[14] is not None else None
        if row[12] is None:  # no events, or a fork whose head is in its parent's log
            return SessionHead(info, self.last_event(info) if info.version else None, lease)
        return SessionHead(info, head_event(info.session_id, info.version, row[8:14]), lease)

    @_translated
    def find(self, prefix: str, limit: int | None) -> list[SessionInfo]:
        return [self._row_info(r) for r in self._found(_INFO, prefix, limit)]

    @_translated
    def find_ids(self, prefix: str, limit: int | None) -> list[str]:
        return [r[0] for r in self._found("SELECT s.session_id FROM sessions s", prefix, limit)]

    def _found(self, select: str, prefix: str, limit: int | None) -> list[tuple[Any, ...]]:
        with self._lock:
            found: list[tuple[Any, ...]] = self._conn.execute(
                f"{select} WHERE substr(s.session_id, 1, ?) = ? ORDER BY s.updated_at DESC, s.session_id LIMIT ?",
                (len(prefix), prefix, -1 if limit is None else max(0, limit)),
            ).fetchall()
        return found

    @_translated
    def lease_of(self, session_id: str) -> Lease | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT owner, token, expires_at FROM leases WHERE session_id = ?", (session_id,)
            ).fetchone()
        return Lease(session_id, row[0], row[1], row[2]) if row else None

    @_translated
    def forks_of(self, session_id: str) -> list[SessionInfo]:
        with self._lock:
            rows = self._conn.execute(f"{_INFO} WHERE s.parent_id = ?", (session_id,)).fetchall()
        return [self._row_info(r) for r in rows]

    @_translated
    def delete_rows(self, session_id: str) -> None:
        with self._transaction() as conn:
            for table in ("events", "events_recent", "snapshots", "leases", "session_meta", "sessions"):
                conn.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))

    # --------------------------------------------------------------- events

    #: Concurrent appends of this process share one transaction and fsync (see
    #: ``saucer.store._group``); False writes each append in its own transaction.
    group_commit: bool = True

    def write_event(self, event: Event, expected_version: int, fence: int | None) -> None:
        if self.group_commit:
            self._group_committer().append(event, expected_version, fence)
        else:
            self._write_one(Pending(event, expected_version, fence, blocking=False))

    def write_events(self, events: Sequence[Event], expected_version: int, fence: int | None) -> None:
        self._group_committer().write_events(events, expected_version, fence, shared=self.group_commit)

    def awrite_events(
        self, events: Sequence[Event], expected_version: int, fence: int | None, on_written: Callable[[], Any] | None
    ) -> Awaitable[None]:
        return self._group_committer().awrite_events(
            events, expected_version, fence, on_written, shared=self.group_commit
        )

    def awrite_event(
        self, event: Event, expected_version: int, fence: int | None, on_written: Callable[[], Any] | None
    ) -> Awaitable[None]:
        # Returns the committer's coroutine itself: one coroutine frame less per commit.
        if self.group_commit:
            return self._group_committer().append_async(event, expected_version, fence, on_written)
        return super().awrite_event(event, expected_version, fence, on_written)

    def _write_one(self, entry: Pending) -> None:
        """Write one append in its own transaction; raise its error."""
        # What _transaction() and @_translated do, inline: this runs once per commit (a
        # generator-based context manager and a wrapper's frame cost more than the statements' own
        # Python), on the store's one cursor.
        try:
            with self._lock:
                cursor = self._cursor
                cursor.execute("BEGIN IMMEDIATE")
                try:
                    write_one(cursor, entry)
                    self._recent += 1
                    if self._recent >= self.fold_every:
                        self._fold_if_due(0)
                except BaseException:
                    conn = self._conn
                    if conn.in_transaction:  # an error may have ended it already (e.g. a damaged page)
                        conn.execute("ROLLBACK")
                    raise
                cursor.execute("COMMIT")
        except sqlite3.Error as exc:
            raise store_error(exc, self.path, self._busy_timeout) from exc

    @_translated
    def migrate(self) -> int:
        """Create or upgrade the schema (done on open too); return its version."""
        with self._transaction() as conn:
            migrate_schema(conn, self.path)
            self._recent = conn.execute("SELECT count(*) FROM events_recent").fetchone()[0]
        return SCHEMA_VERSION

    @_translated
    def format_version(self) -> int:
        with self._lock:
            row = self._conn.execute("SELECT newest FROM saucer_format").fetchone()
        return int(row[0])

    def _group_committer(self) -> GroupCommitter:
        return self._committer

    @_translated
    def _write_batch(self, entries: list[Pending]) -> None:
        """Write many appends in ONE transaction; a refused entry fails only itself.

        Inside the write transaction the heads (and lease tokens) of the batch's
        sessions are read at once, each entry is checked against them in order,
        and the accepted ones are written with two ``executemany`` calls.
        """
        with self._transaction() as conn:
            added = write_batch(conn, entries)
            self._fold_if_due(added)

    #: Move ``events_recent`` into ``events`` once this process has added this many rows to it.
    fold_every = 2048
    _recent = 0

    def _fold_if_due(self, added: int) -> None:
        """Inside a write transaction: count ``added`` new recent rows; fold them if due.

        A fold that fails (it cannot, short of a hand-edited duplicate) is
        undone alone, with a warning: the commit it rides on goes through.
        """
        self._recent += added
        if self._recent < self.fold_every:
            return
        self._recent = 0
        conn = self._conn
        conn.execute("SAVEPOINT fold")
        try:
            conn.execute("INSERT INTO events SELECT * FROM events_recent ORDER BY session_id, version")
            conn.execute("DELETE FROM events_recent")
        except sqlite3.Error as exc:
            conn.execute("ROLLBACK TO fold")
            warnings.warn(
                f"{self.path}: could not move recent events into the events table: {exc}", RuntimeWarning, stacklevel=2
            )
        finally:
            conn.execute("RELEASE fold")

    @_translated
    def read_own(self, session_id: str, after: int, upto: int | None) -> Iterator[Event]:
        args = (session_id, after, upto if upto is not None else 2**62)
        columns = "SELECT version, ts, author, round, step, payload, crc FROM"
        where = "WHERE session_id = ? AND version > ? AND version <= ? ORDER BY version"
        # One read transaction, so that the head and the rows agree (the
        # head tells a damaged *trailing* record from one in the middle),
        # and that no fold moves rows between the two queries.
        with self._transaction("DEFERRED") as conn:
            row = conn.execute("SELECT head FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
            rows = conn.execute(f"{columns} events {where}", args).fetchall()
            rows += conn.execute(f"{columns} events_recent {where}", args).fetchall()
        return decode_rows(session_id, rows, head=row[0] if row else None)

    @_translated
    def own_formats(self, session_id: str) -> tuple[dict[int, int], dict[int, int]]:
        with self._transaction("DEFERRED") as conn:
            rows = conn.execute(
                "SELECT version, payload FROM events WHERE session_id = ? UNION ALL "
                "SELECT version, payload FROM events_recent WHERE session_id = ?",
                (session_id, session_id),
            ).fetchall()
            snaps = conn.execute("SELECT version, state FROM snapshots WHERE session_id = ?", (session_id,)).fetchall()
        return formats_of(rows), formats_of(snaps)

    @_translated
    def rewrite_rows(
        self,
        session_id: str,
        events: list[Event],
        snapshots: Sequence[Snapshot] = (),
        meta: dict[str, Any] | None = None,
    ) -> None:
        with self._transaction() as conn:
            rewrite_rows(conn, session_id, events, snapshots, meta)

    @_translated
    def quarantine_record(self, session_id: str, version: int) -> bool:
        replaced = False
        with self._transaction() as conn:
            for table in ("events", "events_recent"):
                row = conn.execute(
                    f"SELECT payload, crc FROM {table} WHERE session_id = ? AND version = ?", (session_id, version)
                ).fetchone()
                if row is None:
                    continue
                try:
                    decode_payload(row[0], row[1])
                except DamagedRecord as exc:
                    payload, crc = quarantine_payload(row[0], str(exc))
                    conn.execute(
                        f"UPDATE {table} SET payload = ?, crc = ? WHERE session_id = ? AND version = ?",
                        (payload, crc, session_id, version),
                    )
                    replaced = True
        return replaced

    # ------------------------------------------------------------ snapshots

    @_translated
    def own_snapshot(self, session_id: str, upto: int | None) -> Snapshot | None:
        with self._lock:
            # Newest first and lazily: usually only the first blob is read; a
            # damaged one falls back to the next.
            cursor = self._conn.execute(
                "SELECT version, ts, state, crc FROM snapshots WHERE session_id = ? AND version <= ? "
                "ORDER BY version DESC",
                (session_id, upto if upto is not None else 2**62),
            )
            try:
                return first_good_snapshot(session_id, cursor)
            finally:
                cursor.close()

    @contextmanager
    def _unsynced(self) -> Iterator[sqlite3.Connection]:
        """Run a write without its own fsync: snapshots and lease releases only.

        In WAL mode a write at ``synchronous=NORMAL`` is made durable by the
        next ``FULL`` commit (the WAL reaches the disk in order), and a SIGKILL
        loses nothing: only a power cut before that commit can. A snapshot is
        derived data: losing the newest one only means a longer replay, never a
        wrong state. A lost release leaves the lease to expire (its owner takes
        it back at once, see :meth:`acquire_lease`).
        """
        with self._lock:
            conn = self._conn
            conn.execute("PRAGMA synchronous=NORMAL")
            try:
                yield conn
            finally:
                conn.execute("PRAGMA synchronous=FULL")

    @_translated
    def save_snapshot(self, snapshot: Snapshot) -> None:
        blob, crc = encode_state(snapshot.state)
        with self._unsynced() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO snapshots VALUES (?, ?, ?, ?, ?)",
                (snapshot.session_id, snapshot.version, snapshot.timestamp, blob, crc),
            )

    @_translated
    def prune_snapshots(self, session_id: str, keep: int) -> None:
        with self._unsynced() as conn:
            conn.execute(
                "DELETE FROM snapshots WHERE session_id = ? AND version NOT IN ("
                "SELECT version FROM snapshots WHERE session_id = ? ORDER BY version DESC LIMIT ?)",
                (session_id, session_id, max(0, keep)),
            )

    # --------------------------------------------------------------- leases

    @_translated
    def acquire_lease(self, session_id: str, owner: str, ttl: float) -> Lease:
        with self._transaction() as conn:
            if conn.execute("SELECT 1 FROM sessions WHERE session_id = ?", (session_id,)).fetchone() is None:
                raise SessionNotFoundError(session_id)
            now = time.time()
            row = conn.execute(
                "SELECT owner, token, expires_at FROM leases WHERE session_id = ?", (session_id,)
            ).fetchone()
            token = row[1] if row else 0
            if row is not None and row[0] != owner and row[2] > now:
                raise LeaseHeldError(session_id, row[0], row[2])
            if row is None or row[0] != owner or row[2] <= now:
                token += 1
            conn.execute("INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?)", (session_id, owner, token, now + ttl))
        return Lease(session_id, owner, token, now + ttl)

    @_translated
    def release_lease(self, lease: Lease) -> None:
        # No fsync of its own (_unsynced): losing a release costs a wait for the expiry, never a wrong state.
        with self._unsynced():
            self._conn.execute(
                "UPDATE leases SET expires_at = 0 WHERE session_id = ? AND owner = ? AND token = ?",
                (lease.session_id, lease.owner, lease.token),
            )

    # ------------------------------------------------------------ retention

    @_translated
    def prune_rows(self, session_id: str, cut: int, base: Event, snapshot: Snapshot) -> bool:
        with self._transaction() as conn:
            return replace_below(conn, session_id, cut, base, snapshot)

    @_translated
    def materialise_rows(
        self, info: SessionInfo, events: list[Event], snapshot: Snapshot | None, meta: dict[str, Any]
    ) -> bool:
        with self._transaction() as conn:
            return detach_fork(conn, info, events, snapshot, meta)

    @_translated
    def import_rows(
        self, info: SessionInfo, events: list[Event], snapshots: list[Snapshot], counters: Counters
    ) -> None:
        with self._transaction() as conn:
            insert_session(conn, info, counters)
            insert_events(conn, info.session_id, events)
            for snapshot in snapshots:
                insert_snapshot(conn, snapshot)
