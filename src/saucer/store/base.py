"""The event store interface shared by every backend, and its errors.

A store keeps, per session, an append-only log of :class:`~saucer.context.events.Event`
records numbered 1, 2, 3, ... and occasional snapshots of the materialised
state. It knows nothing about the Context beyond that.

Backends implement a handful of primitives on *their own* rows
(``_create``, ``_info``, ``_append``, ``_read``, ``_snapshot``, ...). The public
methods here add what is the same everywhere: forks that reference their
parent's log instead of copying it (copy-on-write lineage), version checks,
and polling for :meth:`EventStore.watch`. The shared contract suite in
``tests/store`` holds every backend to the same behaviour.

Errors follow PEP 249's shape: everything derives from :class:`StoreError`.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterator, Sequence

from saucer.redaction import redact

if TYPE_CHECKING:  # at run time it is imported where used: saucer.context imports this module
    from saucer.context.events import Event

__all__ = [
    "StoreError",
    "ConflictError",
    "FencedError",
    "SessionNotFoundError",
    "SessionExistsError",
    "CorruptRecordError",
    "ReadOnlyError",
    "LeaseHeldError",
    "SessionInfo",
    "Snapshot",
    "Lease",
    "EventStore",
]


class StoreError(Exception):
    """Base class of every store error."""


class ConflictError(StoreError):
    """Another writer committed first: the commit was based on a stale version.

    ``keys`` names the keys of the refused batch that were plain writes.
    """

    def __init__(self, session_id: str, expected: int, actual: int | None, keys: Sequence[str] = ()) -> None:
        self.session_id = session_id
        self.expected = expected
        self.actual = actual
        self.keys = list(keys)
        detail = f" (keys: {', '.join(self.keys)})" if self.keys else ""
        super().__init__(
            f"session {session_id!r}: commit based on version {expected}, but the store is at "
            f"version {actual}; another writer committed first{detail}. Call reload() and retry."
        )


class FencedError(ConflictError):
    """A commit carried a lease token that is no longer current (the lease was taken over)."""

    def __init__(self, session_id: str, token: int, current: int | None, holder: str | None) -> None:
        StoreError.__init__(
            self,
            f"session {session_id!r}: commit with lease token {token} refused; the lease is now "
            f"held by {holder!r} with token {current} (this writer was fenced off)",
        )
        self.session_id = session_id
        self.expected = token
        self.actual = current
        self.keys = []
        self.holder = holder


class SessionNotFoundError(StoreError, KeyError):
    """No session with that id."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        StoreError.__init__(self, f"no session {session_id!r} in this store")

    def __str__(self) -> str:
        return str(self.args[0])


class SessionExistsError(StoreError):
    """A session with that id already exists."""


class CorruptRecordError(StoreError):
    """A stored record of one session cannot be read; other sessions are unaffected."""

    def __init__(self, session_id: str, version: int, reason: str) -> None:
        self.session_id = session_id
        self.version = version
        self.reason = reason
        super().__init__(f"session {session_id!r}: record at version {version} is damaged ({reason})")


class ReadOnlyError(StoreError):
    """A write was attempted on a read-only Context (one opened ``at=`` a version)."""


class LeaseHeldError(StoreError):
    """Another worker holds the lease on the session."""

    def __init__(self, session_id: str, holder: str, expires_at: float) -> None:
        self.session_id = session_id
        self.holder = holder
        self.expires_at = expires_at
        left = max(0.0, expires_at - time.time())
        super().__init__(
            f"session {session_id!r} is being run by {holder!r} (lease expires in {left:.1f}s unless renewed)"
        )


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session's row: its head version and, for a fork, where it branched off."""

    session_id: str
    version: int
    created_at: float
    updated_at: float
    parent_id: str | None = None
    parent_version: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The materialised state of a session at ``version`` (wire form)."""

    session_id: str
    version: int
    timestamp: float
    state: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Lease:
    """The right to write a session, until ``expires_at``; ``token`` fences stale holders."""

    session_id: str
    owner: str
    token: int
    expires_at: float


class EventStore(ABC):
    """An append-only, versioned log of events per session, with snapshots and leases."""

    url: str = ""

    # ------------------------------------------------------------ primitives

    @abstractmethod
    def _create(self, info: SessionInfo) -> None:
        """Insert a session row; raise :class:`SessionExistsError` if the id is taken."""

    @abstractmethod
    def _info(self, session_id: str) -> SessionInfo | None:
        """The session row, or None."""

    @abstractmethod
    def _append(self, event: Event, expected_version: int, fence: int | None) -> None:
        """Append ``event`` (version ``expected_version + 1``) atomically.

        Raise :class:`ConflictError` if the head is not ``expected_version``,
        :class:`FencedError` if ``fence`` is not the session's current lease token.
        """

    @abstractmethod
    def _read(self, session_id: str, after: int, upto: int | None) -> Iterator[Event]:
        """This session's own events with ``after < version <= upto``, in order.

        A damaged trailing record is skipped with a warning; a damaged record
        followed by good ones raises :class:`CorruptRecordError`.
        """

    @abstractmethod
    def _snapshot(self, session_id: str, upto: int | None) -> Snapshot | None:
        """This session's own newest readable snapshot at or before ``upto``."""

    @abstractmethod
    def save_snapshot(self, snapshot: Snapshot) -> None:
        """Store a snapshot (replacing one at the same version)."""

    @abstractmethod
    def sessions(self) -> list[SessionInfo]:
        """Every session, most recently updated first (ties by session id)."""

    @abstractmethod
    def _delete(self, session_id: str) -> None:
        """Remove the session's row, events, snapshots and lease (no error if it is gone)."""

    @abstractmethod
    def acquire_lease(self, session_id: str, owner: str, ttl: float) -> Lease:
        """Take (or renew, for the same owner) the lease on a session.

        Raise :class:`LeaseHeldError` while another owner's lease is unexpired.
        Each takeover by a new owner increases the token.
        """

    @abstractmethod
    def release_lease(self, lease: Lease) -> None:
        """Give a lease up (no-op when it was already taken over)."""

    def prune_snapshots(self, session_id: str, keep: int) -> None:
        """Drop this session's own snapshots except the newest ``keep`` (0: all of them).

        Snapshots are a cache of the fold (hydrate needs only the newest), so
        pruning never loses data; it bounds the space a large state takes.
        The default keeps everything; backends override it.
        """

    def quarantine_record(self, session_id: str, version: int) -> bool:
        """Turn this session's own damaged record at ``version`` into an empty event.

        Called by a writer after a read skipped a damaged *trailing* record, so
        that the record does not become a fatal damaged record in the middle
        once newer events follow it. The replacement's ``meta`` keeps the
        reason and the original bytes. Returns True when a record was replaced;
        False when it is readable, absent, or the backend cannot do it.
        """
        return False

    def migrate(self) -> int | None:
        """Create or upgrade the store's schema; return its version (None: nothing to migrate).

        Opening a store migrates it already; this is for ``saucer store migrate``.
        """
        return None

    def close(self) -> None:
        """Release connections. Idempotent."""

    def __enter__(self) -> "EventStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------- public API

    def create_session(
        self,
        session_id: str,
        *,
        parent_id: str | None = None,
        parent_version: int | None = None,
        meta: dict[str, Any] | None = None,
    ) -> SessionInfo:
        """Create an empty session, or a fork of ``parent_id`` at ``parent_version``."""
        if not session_id or not isinstance(session_id, str):
            raise ValueError("session id must be a non-empty string")
        now = time.time()
        version = 0
        if parent_id is not None:
            parent = self.session_info(parent_id)
            if parent_version is None:
                parent_version = parent.version
            if not 0 <= parent_version <= parent.version:
                raise ValueError(
                    f"cannot fork {parent_id!r} at version {parent_version}: it has versions 0..{parent.version}"
                )
            version = parent_version
        info = SessionInfo(session_id, version, now, now, parent_id, parent_version, dict(meta or {}))
        self._create(info)
        return info

    def session_info(self, session_id: str) -> SessionInfo:
        """The session's row; :class:`SessionNotFoundError` if unknown."""
        info = self._info(session_id)
        if info is None:
            raise SessionNotFoundError(session_id)
        return info

    def exists(self, session_id: str) -> bool:
        """Whether the session exists."""
        return self._info(session_id) is not None

    def head(self, session_id: str) -> int:
        """The session's latest version (0 for a new session)."""
        return self.session_info(session_id).version

    def delete_session(self, session_id: str) -> None:
        """Remove a session completely: its events, snapshots and lease (no error if it is gone).

        Refused with :class:`StoreError` while forks of it exist: they read its log.
        """
        forks = sorted(i.session_id for i in self.sessions() if i.parent_id == session_id)
        if forks:
            raise StoreError(
                f"session {session_id!r} has forks that read its log ({', '.join(forks)}); delete them first"
            )
        self._delete(session_id)

    def append(
        self,
        session_id: str,
        expected_version: int,
        ops: list[dict[str, Any]],
        *,
        author: str,
        round: int | None = None,
        step: int | None = None,
        meta: dict[str, Any] | None = None,
        fence: int | None = None,
    ) -> Event:
        """Commit ``ops`` as one event based on ``expected_version``; return the event."""
        event = _new_event(session_id, expected_version, ops, author, round, step, meta)
        self._append(event, expected_version, fence)
        return event

    async def aappend(
        self,
        session_id: str,
        expected_version: int,
        ops: list[dict[str, Any]],
        *,
        author: str,
        round: int | None = None,
        step: int | None = None,
        meta: dict[str, Any] | None = None,
        fence: int | None = None,
        on_written: Callable[[Event], Any] | None = None,
    ) -> Event:
        """:meth:`append` for coroutines; durable when it returns.

        On the SQLite and PostgreSQL stores the appends of all the coroutines of
        one event loop that commit at the same time share one transaction (and
        one fsync), without a thread per session: this is how the engine
        commits its steps. ``on_written(event)`` is called as soon as the event
        is durable, even if the awaiting task was cancelled meanwhile (a
        cancelled append is either not written at all, or written and reported
        there).
        """
        event = _new_event(session_id, expected_version, ops, author, round, step, meta)
        await self._aappend(event, expected_version, fence, None if on_written is None else partial(on_written, event))
        return event

    async def _aappend(
        self, event: Event, expected_version: int, fence: int | None, on_written: Callable[[], Any] | None
    ) -> None:
        """Append from a coroutine (a backend may return any awaitable); by default, synchronously."""
        self._append(event, expected_version, fence)
        if on_written is not None:
            on_written()

    def read(self, session_id: str, after: int = 0, upto: int | None = None) -> Iterator[Event]:
        """Events of the session's whole lineage with ``after < version <= upto``."""
        info = self.session_info(session_id)
        if info.parent_id is not None and info.parent_version is not None and after < info.parent_version:
            limit = info.parent_version if upto is None else min(upto, info.parent_version)
            for event in self.read(info.parent_id, after, limit):
                yield event
            after = info.parent_version
        if upto is not None and upto <= after:
            return
        yield from self._read(session_id, after, upto)

    def latest_snapshot(self, session_id: str, upto: int | None = None) -> Snapshot | None:
        """The newest snapshot usable for the session at or before ``upto`` (own, else its parent's)."""
        info = self.session_info(session_id)
        own = self._snapshot(session_id, upto)
        if own is not None:
            return own
        if info.parent_id is not None and info.parent_version is not None:
            limit = info.parent_version if upto is None else min(upto, info.parent_version)
            return self.latest_snapshot(info.parent_id, limit)
        return None

    def events_since_snapshot(self, session_id: str) -> int:
        """How many events a hydrate of the head would fold after the latest snapshot."""
        snap = self.latest_snapshot(session_id)
        return self.head(session_id) - (snap.version if snap else 0)

    async def watch(
        self, session_id: str, after: int = 0, *, interval: float = 0.2
    ) -> AsyncIterator[Event]:
        """Yield the session's new events as they are committed (polling by default)."""
        last = after
        while True:
            fresh = await asyncio.to_thread(lambda: list(self.read(session_id, last)))
            for event in fresh:
                last = event.version
                yield event
            if not fresh:
                await asyncio.sleep(interval)

    # ------------------------------------------------------------ retention

    def _prune(self, session_id: str, cut: int, base: Event, snapshot: Snapshot) -> None:
        """Primitive of :meth:`prune`, in ONE transaction: delete this session's own
        events and snapshots below ``cut``, replace its own event at ``cut`` by
        ``base``, store ``snapshot`` (at ``cut``), and record ``cut`` as
        ``meta["pruned_to"]``. Does nothing if ``meta["pruned_to"]`` is already
        at or past ``cut`` (a concurrent prune went further)."""
        raise NotImplementedError(f"{type(self).__name__} does not support pruning")

    def first_version(self, session_id: str) -> int:
        """The oldest version of the session that can still be read (0 unless pruned)."""
        return int(self.session_info(session_id).meta.get("pruned_to", 0))

    def prune(self, session_id: str, keep_last: int | None = None, older_than: float | None = None) -> int:
        """Drop old history of a session; return its new first readable version.

        ``keep_last=N`` keeps the newest N events as they are; ``older_than=S``
        drops events committed more than S seconds ago. With both, an event is
        dropped only when both policies allow it. The version at the cut stays
        readable, and so does every later one: its event is replaced by a *base*
        event that sets the whole state as it was then (``meta["pruned"]``
        names the cut), and a snapshot of that state is stored beside it. So
        the remaining log replays on its own, even if snapshots are later
        dropped. Versions before the cut can no longer be read.

        The cut never goes past a version a fork of this session branched at
        (the fork still reads this log up to there), nor, for a fork, below
        its own first event.
        """
        from saucer.context.events import Event

        if keep_last is None and older_than is None:
            raise ValueError("prune needs keep_last and/or older_than")
        if keep_last is not None and keep_last < 0:
            raise ValueError(f"keep_last must be >= 0, not {keep_last}")
        if older_than is not None and older_than < 0:
            raise ValueError(f"older_than must be >= 0 seconds, not {older_than}")
        info = self.session_info(session_id)
        start = max(self.first_version(session_id), info.parent_version or 0)
        cut = info.version
        if keep_last is not None:
            cut = min(cut, info.version - keep_last)
        if older_than is not None:
            threshold = time.time() - older_than
            old = start
            for event in self._read(session_id, start, cut):
                if event.timestamp >= threshold:
                    break
                old = event.version
            cut = min(cut, old)
        for child in self.sessions():
            if child.parent_id == session_id and child.parent_version is not None:
                cut = min(cut, child.parent_version)
        if cut <= start:
            return self.first_version(session_id)
        original = next(iter(self._read(session_id, cut - 1, cut)), None)
        if original is None:
            raise StoreError(f"session {session_id!r}: cannot prune at version {cut}: its event is missing")
        before = self._state_at(session_id, info.parent_version) if info.parent_version else None
        after = self._state_at(session_id, cut)
        base = Event(
            session_id=session_id,
            version=cut,
            timestamp=original.timestamp,
            author="system",
            round=original.round,
            step=original.step,
            ops=_base_ops(before, after),
            meta={"pruned": {"upto": cut, "author": original.author}},
        )
        from saucer.context.events import state_to_wire

        snapshot = Snapshot(session_id, cut, time.time(), state_to_wire(after))
        self._prune(session_id, cut, base, snapshot)
        return self.first_version(session_id)

    def _state_at(self, session_id: str, version: int) -> Any:
        """The session's materialised state at ``version`` (a :class:`~saucer.context.events.State`)."""
        from saucer.context.events import State, apply_ops, state_from_wire

        snap = self.latest_snapshot(session_id, version)
        state = state_from_wire(snap.state) if snap else State()
        for event in self.read(session_id, snap.version if snap else 0, version):
            apply_ops(state, event.ops)
        return state


def _base_ops(before: Any, after: Any) -> list[dict[str, Any]]:
    """Operations that turn state ``before`` (None: empty) into state ``after``."""
    from saucer.context.events import state_to_wire

    wire = state_to_wire(after)
    ops: list[dict[str, Any]] = []
    if before is not None:
        ops += [{"op": "delete", "name": k} for k in before.names if k not in after.names]
        ops += [{"op": "delete", "var": k} for k in before.vars if k not in after.vars]
    ops += [{"op": "set", "name": k, "value": v} for k, v in wire["names"].items()]
    ops += [{"op": "set", "var": k, "value": v} for k, v in wire["vars"].items()]
    return ops


_Event: Any = None


def _new_event(
    session_id: str,
    expected_version: int,
    ops: list[dict[str, Any]],
    author: str,
    round: int | None,
    step: int | None,
    meta: dict[str, Any] | None,
) -> Event:
    global _Event
    if _Event is None:
        from saucer.context.events import Event  # here: saucer.context imports this module

        _Event = Event
    return _Event(
        session_id=session_id,
        version=expected_version + 1,
        timestamp=time.time(),
        author=author,
        round=round,
        step=step,
        ops=ops,
        meta=redact(dict(meta or {})),  # step records carry tool results and errors: no secrets in the log
    )
