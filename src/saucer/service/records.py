"""Durable records of service sessions: who owns them, their status, steps and outcome.

:class:`SessionRecordStore` is the small interface the server needs to
survive a restart: sessions are created, their status updated, each completed
step committed exactly once, and everything stays readable after the session
ends (sessions never vanish). Two implementations: :class:`SqliteSessionRecordStore`
(one file under the state dir; WAL, ``synchronous=FULL``, so a committed step
survives SIGKILL) and :class:`MemorySessionRecordStore` (tests, ephemeral servers).

The store also pins device ids to the principal that first registered them,
so after a restart another token cannot claim a device and receive the
commands of the sessions waiting for it, and keeps the grants through which
an owner shares a device with other principals (:mod:`saucer.service.access`).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from saucer.dispatch.messages import Result
from saucer.redaction import redact
from saucer.service.protocol import TaskSpec, now

_T = TypeVar("_T")


class SessionStatus(str, Enum):
    """Lifecycle of a service session; the last three are terminal."""

    PENDING = "pending"
    RUNNING = "running"
    WAITING_DEVICE = "waiting_device"
    #: ``finished``, the word of the CLI, the viewer and the engine; records written before read ``completed``.
    COMPLETED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @classmethod
    def _missing_(cls, value: object) -> SessionStatus | None:
        # A record stored by an earlier release, and a device's task_end (the wire keeps UFO's word).
        return cls.COMPLETED if value == "completed" else None

    @property
    def terminal(self) -> bool:
        """True once the session can no longer change."""
        return self in (SessionStatus.COMPLETED, SessionStatus.FAILED, SessionStatus.CANCELLED)


class StepRecord(BaseModel):
    """One committed step: its index, subtask, outcome and the results of its commands."""

    model_config = ConfigDict(extra="forbid")

    index: int = Field(ge=0)
    subtask: str = ""
    status: Literal["completed", "failed"]
    results: list[Result] = Field(default_factory=list)
    committed_at: float = Field(default_factory=now)

    @model_serializer(mode="wrap")
    def _without_secrets(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Stored and served forms alike: tool output may quote a token.
        return redact(handler(self))


class SessionRecord(BaseModel):
    """Everything durable about one service session."""

    model_config = ConfigDict(extra="forbid")

    session_id: str
    owner: str
    device_id: str
    task: TaskSpec
    status: SessionStatus = SessionStatus.PENDING
    created_at: float = Field(default_factory=now)
    updated_at: float = Field(default_factory=now)
    error: str | None = None
    results: list[Any] = Field(default_factory=list)
    attempts: int = 0
    resumed_from_step: int | None = None

    @model_serializer(mode="wrap")
    def _without_secrets(self, handler: SerializerFunctionWrapHandler) -> Any:
        # A task that carries a secret literally is stored (and so resumed) with *** in its place.
        return redact(handler(self))


class StepAlreadyCommitted(Exception):
    """A step index was committed twice; the second run must not have happened."""


class UnknownSession(KeyError):
    """No session with that id is recorded."""


class SessionRecordStore(Protocol):
    """Where the server keeps sessions, their committed steps and device ownership."""

    async def create_session(self, record: SessionRecord) -> None:
        """Record a new session; its id must be new."""
        ...

    async def update_session(self, session_id: str, *, derived: bool = False, **changes: Any) -> SessionRecord:
        """Apply ``changes`` (fields of :class:`SessionRecord`) and return the new record.

        ``derived``: the change is a projection of a durable log that rebuilds
        it if it is lost (a session's end, which the engine runner's event store
        holds: :meth:`SessionManager.rehydrate` finishes such a session again),
        so it need not wait for the disk; as :meth:`commit_step`.
        """
        ...

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session, or None if it was never recorded."""
        ...

    async def list_sessions(self, *, owner: str | None = None, active_only: bool = False) -> list[SessionRecord]:
        """Sessions, oldest first; only ``owner`` 's when given; only non-terminal ones when asked."""
        ...

    async def commit_step(self, session_id: str, step: StepRecord, *, derived: bool = False) -> None:
        """Durably record a completed step; raise :class:`StepAlreadyCommitted` for a repeated index.

        ``derived``: the step is a projection of a log that is durable already
        and that rebuilds the record if it is lost (the engine runner's event
        store, :meth:`~saucer.service.engine_runner.EngineTaskRunner.sync_steps`):
        it is written at once but need not wait for the disk; it becomes durable
        with the next write that does (in SQLite's WAL, writes reach the disk in
        order), and only a power cut before that can lose it.
        """
        ...

    async def steps(self, session_id: str) -> list[StepRecord]:
        """The committed steps of a session in index order."""
        ...

    async def claim_device(self, device_id: str, owner: str) -> str:
        """Pin ``device_id`` to ``owner`` unless already pinned; return the owner it is pinned to."""
        ...

    async def grant_device(self, device_id: str, principal: str) -> None:
        """Let ``principal`` use ``device_id`` (idempotent)."""
        ...

    async def revoke_device(self, device_id: str, principal: str) -> bool:
        """Take back a grant; False when there was none."""
        ...

    async def device_grants(self, device_id: str) -> list[str]:
        """The principals ``device_id`` is granted to, sorted."""
        ...

    async def close(self) -> None:
        """Release files and threads."""
        ...


class MemorySessionRecordStore:
    """A :class:`SessionRecordStore` in memory: fast, and gone with the process."""

    def __init__(self) -> None:
        self._sessions: dict[str, SessionRecord] = {}
        self._steps: dict[str, dict[int, StepRecord]] = {}
        self._devices: dict[str, str] = {}
        self._grants: dict[str, set[str]] = {}

    async def create_session(self, record: SessionRecord) -> None:
        """Record a new session."""
        if record.session_id in self._sessions:
            raise ValueError(f"session {record.session_id!r} already exists")
        self._sessions[record.session_id] = record.model_copy(deep=True)

    async def update_session(self, session_id: str, *, derived: bool = False, **changes: Any) -> SessionRecord:
        """Apply changes to a session."""
        current = self._sessions.get(session_id)
        if current is None:
            raise UnknownSession(session_id)
        updated = apply_changes(current, changes)
        self._sessions[session_id] = updated
        return updated.model_copy(deep=True)

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session or None."""
        record = self._sessions.get(session_id)
        return None if record is None else record.model_copy(deep=True)

    async def list_sessions(self, *, owner: str | None = None, active_only: bool = False) -> list[SessionRecord]:
        """Sessions, oldest first."""
        records = sorted(self._sessions.values(), key=lambda r: r.created_at)
        return [
            r.model_copy(deep=True)
            for r in records
            if (owner is None or r.owner == owner) and not (active_only and r.status.terminal)
        ]

    async def commit_step(self, session_id: str, step: StepRecord, *, derived: bool = False) -> None:
        """Record a completed step once."""
        if session_id not in self._sessions:
            raise UnknownSession(session_id)
        steps = self._steps.setdefault(session_id, {})
        if step.index in steps:
            raise StepAlreadyCommitted(f"session {session_id!r} step {step.index} is already committed")
        steps[step.index] = step.model_copy(deep=True)

    async def steps(self, session_id: str) -> list[StepRecord]:
        """Committed steps in order."""
        steps = self._steps.get(session_id, {})
        return [steps[i].model_copy(deep=True) for i in sorted(steps)]

    async def claim_device(self, device_id: str, owner: str) -> str:
        """First claim wins."""
        return self._devices.setdefault(device_id, owner)

    async def grant_device(self, device_id: str, principal: str) -> None:
        """Add a grant."""
        self._grants.setdefault(device_id, set()).add(principal)

    async def revoke_device(self, device_id: str, principal: str) -> bool:
        """Remove a grant."""
        granted = self._grants.get(device_id, set())
        found = principal in granted
        granted.discard(principal)
        return found

    async def device_grants(self, device_id: str) -> list[str]:
        """Grants of a device, sorted."""
        return sorted(self._grants.get(device_id, set()))

    async def close(self) -> None:
        """Nothing to release."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    status     TEXT NOT NULL,
    created_at REAL NOT NULL,
    record     BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_owner ON sessions (owner, created_at);
CREATE INDEX IF NOT EXISTS sessions_status ON sessions (status);
CREATE TABLE IF NOT EXISTS steps (
    session_id TEXT NOT NULL,
    idx        INTEGER NOT NULL,
    record     BLOB NOT NULL,
    PRIMARY KEY (session_id, idx)
);
CREATE TABLE IF NOT EXISTS devices (
    device_id TEXT PRIMARY KEY,
    owner     TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS device_grants (
    device_id TEXT NOT NULL,
    principal TEXT NOT NULL,
    PRIMARY KEY (device_id, principal)
);
"""

_TERMINAL = (*(s.value for s in SessionStatus if s.terminal), "completed")  # "completed": rows of earlier releases


class SqliteSessionRecordStore:
    """A :class:`SessionRecordStore` in one SQLite file.

    All access goes through one worker thread that owns the connection, so the
    event loop never blocks on disk and no lock is needed (or can deadlock).
    Writes are group-committed: the writes queued while the worker was busy
    (an fsync of the previous ones, a read) share one transaction with
    ``synchronous=FULL`` and one fsync, each in a savepoint of its own, so a
    refused write fails alone. A write returns once its transaction is
    committed: once ``commit_step`` returns, the step survives a SIGKILL of the
    server (and a power cut, unless it was ``derived``: see
    :meth:`SessionRecordStore.commit_step` and :meth:`SessionRecordStore.update_session`).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="saucer-records")
        self._conn: sqlite3.Connection | None = None
        self._writes: deque[_Write] = deque()
        self._writes_lock = threading.Lock()
        self._draining = False
        #: How many write transactions were committed (for tests and benchmarks).
        self.transactions = 0
        # Open eagerly (in the worker thread) so a bad path fails at construction.
        self._executor.submit(self._open).result()

    def _open(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.executescript(_SCHEMA)
        self._conn = conn

    async def _call(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        def run() -> _T:
            assert self._conn is not None, "store is closed"
            return fn(self._conn)

        return await asyncio.get_running_loop().run_in_executor(self._executor, run)

    async def _write(self, fn: Callable[[sqlite3.Connection], _T], *, derived: bool = False) -> _T:
        """Run ``fn`` in a write transaction, shared with the writes queued meanwhile; return once committed."""
        loop = asyncio.get_running_loop()
        write = _Write(fn, derived, loop, loop.create_future())
        with self._writes_lock:
            self._writes.append(write)
            start, self._draining = not self._draining, True
        if start:
            try:
                self._executor.submit(self._drain)
            except RuntimeError:  # the worker has stopped: the store is closed
                with self._writes_lock:
                    stranded, self._draining = list(self._writes), False
                    self._writes.clear()
                for queued in stranded:
                    queued.error = RuntimeError(f"the session record store {self.path} is closed")
                    with contextlib.suppress(RuntimeError):
                        queued.loop.call_soon_threadsafe(_settle, queued)
        result: _T = await write.future
        return result

    def _drain(self) -> None:
        """In the worker thread: write the queued writes, a batch (one transaction) at a time, until none is left."""
        while True:
            with self._writes_lock:
                batch = [w for w in self._writes if not w.future.cancelled()]  # a cancelled caller's write is not run
                self._writes.clear()
                if not batch:
                    self._draining = False
                    return
            try:
                self._write_batch(batch)
            except BaseException as exc:  # the transaction failed as a whole: none of the batch is written
                for write in batch:
                    write.result, write.error = None, exc
            for write in batch:
                with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits for it any more
                    write.loop.call_soon_threadsafe(_settle, write)

    def _write_batch(self, batch: list[_Write]) -> None:
        conn = self._conn
        if conn is None:
            raise RuntimeError(f"the session record store {self.path} is closed")
        durable = not all(w.derived for w in batch)
        if not durable:  # only derived writes: no fsync of their own (SessionRecordStore.commit_step)
            conn.execute("PRAGMA synchronous=NORMAL")
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for write in batch:
                    if len(batch) > 1:
                        conn.execute("SAVEPOINT write")
                    try:
                        write.result = write.fn(conn)
                    except Exception as exc:
                        if not conn.in_transaction:  # the error ended the whole transaction
                            raise
                        write.error = exc
                        if len(batch) == 1:
                            conn.execute("ROLLBACK")
                            return
                        conn.execute("ROLLBACK TO write")
                    if len(batch) > 1:
                        conn.execute("RELEASE write")
                conn.execute("COMMIT")
                self.transactions += 1
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        finally:
            if not durable:
                conn.execute("PRAGMA synchronous=FULL")

    async def create_session(self, record: SessionRecord) -> None:
        """Record a new session."""
        blob = record.model_dump_json().encode()

        def insert(conn: sqlite3.Connection) -> None:
            try:
                conn.execute(
                    "INSERT INTO sessions (session_id, owner, status, created_at, record) VALUES (?, ?, ?, ?, ?)",
                    (record.session_id, record.owner, record.status.value, record.created_at, blob),
                )
            except sqlite3.IntegrityError:
                raise ValueError(f"session {record.session_id!r} already exists") from None

        await self._write(insert)

    async def update_session(self, session_id: str, *, derived: bool = False, **changes: Any) -> SessionRecord:
        """Apply changes to a session in one transaction (``derived``: without waiting for the disk)."""

        def update(conn: sqlite3.Connection) -> SessionRecord:
            row = conn.execute("SELECT record FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
            if row is None:
                raise UnknownSession(session_id)
            updated = apply_changes(SessionRecord.model_validate_json(row[0]), changes)
            conn.execute(
                "UPDATE sessions SET status = ?, record = ? WHERE session_id = ?",
                (updated.status.value, updated.model_dump_json().encode(), session_id),
            )
            return updated

        return await self._write(update, derived=derived)

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session or None."""
        row = await self._call(
            lambda conn: conn.execute("SELECT record FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        )
        return None if row is None else SessionRecord.model_validate_json(row[0])

    async def list_sessions(self, *, owner: str | None = None, active_only: bool = False) -> list[SessionRecord]:
        """Sessions, oldest first."""
        sql = "SELECT record FROM sessions WHERE 1=1"
        args: list[Any] = []
        if owner is not None:
            sql += " AND owner = ?"
            args.append(owner)
        if active_only:
            sql += f" AND status NOT IN ({', '.join('?' for _ in _TERMINAL)})"
            args.extend(_TERMINAL)
        sql += " ORDER BY created_at, session_id"
        rows = await self._call(lambda conn: conn.execute(sql, args).fetchall())
        return [SessionRecord.model_validate_json(row[0]) for row in rows]

    async def commit_step(self, session_id: str, step: StepRecord, *, derived: bool = False) -> None:
        """Record a completed step once; the primary key refuses a second commit."""
        blob = step.model_dump_json().encode()

        def insert(conn: sqlite3.Connection) -> None:
            if conn.execute("SELECT 1 FROM sessions WHERE session_id = ?", (session_id,)).fetchone() is None:
                raise UnknownSession(session_id)
            try:
                conn.execute(
                    "INSERT INTO steps (session_id, idx, record) VALUES (?, ?, ?)", (session_id, step.index, blob)
                )
            except sqlite3.IntegrityError:
                raise StepAlreadyCommitted(f"session {session_id!r} step {step.index} is already committed") from None

        await self._write(insert, derived=derived)

    async def steps(self, session_id: str) -> list[StepRecord]:
        """Committed steps in order."""
        rows = await self._call(
            lambda conn: conn.execute(
                "SELECT record FROM steps WHERE session_id = ? ORDER BY idx", (session_id,)
            ).fetchall()
        )
        return [StepRecord.model_validate_json(row[0]) for row in rows]

    async def claim_device(self, device_id: str, owner: str) -> str:
        """First claim wins, durably."""

        def claim(conn: sqlite3.Connection) -> str:
            conn.execute("INSERT OR IGNORE INTO devices (device_id, owner) VALUES (?, ?)", (device_id, owner))
            owner_now: str = conn.execute("SELECT owner FROM devices WHERE device_id = ?", (device_id,)).fetchone()[0]
            return owner_now

        return await self._write(claim)

    async def grant_device(self, device_id: str, principal: str) -> None:
        """Add a grant, durably."""
        await self._write(
            lambda conn: conn.execute(
                "INSERT OR IGNORE INTO device_grants (device_id, principal) VALUES (?, ?)", (device_id, principal)
            )
        )

    async def revoke_device(self, device_id: str, principal: str) -> bool:
        """Remove a grant, durably."""
        removed: int = await self._write(
            lambda conn: (
                conn.execute(
                    "DELETE FROM device_grants WHERE device_id = ? AND principal = ?", (device_id, principal)
                ).rowcount
            )
        )
        return removed > 0

    async def device_grants(self, device_id: str) -> list[str]:
        """Grants of a device, sorted."""
        rows = await self._call(
            lambda conn: conn.execute(
                "SELECT principal FROM device_grants WHERE device_id = ? ORDER BY principal", (device_id,)
            ).fetchall()
        )
        return [row[0] for row in rows]

    async def close(self) -> None:
        """Close the database and stop the worker thread."""

        def close(conn: sqlite3.Connection) -> None:
            conn.close()
            self._conn = None

        if self._conn is not None:
            await self._call(close)
        self._executor.shutdown(wait=True)


class _Write:
    """One queued write of :class:`SqliteSessionRecordStore`: what it runs, and its outcome for its caller."""

    __slots__ = ("fn", "derived", "loop", "future", "result", "error")

    def __init__(
        self, fn: Callable[[sqlite3.Connection], Any], derived: bool, loop: asyncio.AbstractEventLoop, future: Any
    ) -> None:
        self.fn = fn
        self.derived = derived
        self.loop = loop
        self.future: asyncio.Future[Any] = future
        self.result: Any = None
        self.error: BaseException | None = None


def _settle(write: _Write) -> None:
    """In the write's loop: hand its outcome to its caller (unless the caller has gone)."""
    if write.future.done():
        return
    if write.error is not None:
        write.future.set_exception(write.error)
    else:
        write.future.set_result(write.result)


def apply_changes(record: SessionRecord, changes: dict[str, Any]) -> SessionRecord:
    """``record`` with ``changes`` (fields of :class:`SessionRecord`, validated) and a new ``updated_at``
    (``changes["updated_at"]`` when given: a caller that predicts the stored record names the time itself).

    The fields not changed are taken as they are (the task, already a valid :class:`TaskSpec`, is not
    validated again: pydantic keeps a model instance); ``record`` itself is not modified."""
    unknown = set(changes) - set(SessionRecord.model_fields) - {"session_id"}
    if unknown or "session_id" in changes:
        raise ValueError(f"cannot update session fields {sorted(unknown | ({'session_id'} & set(changes)))}")
    data = {name: getattr(record, name) for name in SessionRecord.model_fields}
    data.update(changes)
    if "updated_at" not in changes:
        data["updated_at"] = now()
    return SessionRecord.model_validate(data)
