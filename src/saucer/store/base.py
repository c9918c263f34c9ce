"""The event store interface shared by every backend (its records and errors,
from :mod:`saucer.store.model`, are re-exported here).

A store keeps, per session, an append-only log of :class:`~saucer.store.model.Event`
records numbered 1, 2, 3, ... and occasional snapshots of the materialised
state. It knows nothing about the Context beyond that: operations and states
are JSON data it stores and returns as they are.

Backends implement a handful of primitives on *their own* rows
(``_create``, ``_info``, ``_append``, ``_read``, ``_snapshot``, ...). The public
methods here add what is the same everywhere: forks that reference their
parent's log instead of copying it (copy-on-write lineage), version checks,
and polling for :meth:`EventStore.watch`. What a backend may leave out is
declared in :attr:`EventStore.features`, never guessed. The contract suite
:mod:`saucer.store.testing` holds every backend to the same behaviour.

Every error that leaves a store derives from :class:`StoreError`: backends
translate their driver's errors (``sqlite3``, ``psycopg``) at their edge.
Session ids follow one rule, checked wherever a session is made (:func:`check_session_id`).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, ClassVar

from saucer.redaction import redact
from saucer.store.listing import SessionListing
from saucer.store.model import (
    PARTICIPANTS_KEY,
    SESSION_ID_MAX_LENGTH,
    ConflictError,
    CorruptRecordError,
    DamagedStoreError,
    Event,
    Feature,
    FencedError,
    FormatTooNewError,
    InvalidSessionIdError,
    Lease,
    LeaseHeldError,
    NotParticipantError,
    NotSupportedError,
    OutcomeUnknownError,
    ReadOnlyError,
    SessionExistsError,
    SessionInfo,
    SessionNotFoundError,
    Snapshot,
    StoreError,
    StoreKeyError,
    VersionNotFoundError,
    VersionPrunedError,
    check_participants,
    check_session_id,
    check_version,
)
from saucer.store.rewriting import RecordRewriting
from saucer.store.streaming import EventStreaming
from saucer.store.summary import fork_meta
from saucer.store.upcast import FORMAT_VERSION

__all__ = [
    "StoreError",
    "ConflictError",
    "FencedError",
    "FormatTooNewError",
    "StoreKeyError",
    "SessionNotFoundError",
    "SessionExistsError",
    "CorruptRecordError",
    "DamagedStoreError",
    "InvalidSessionIdError",
    "OutcomeUnknownError",
    "ReadOnlyError",
    "LeaseHeldError",
    "NotSupportedError",
    "NotParticipantError",
    "VersionNotFoundError",
    "VersionPrunedError",
    "SESSION_ID_MAX_LENGTH",
    "check_session_id",
    "check_version",
    "SessionInfo",
    "Snapshot",
    "Lease",
    "Event",
    "Feature",
    "EventStore",
]


class EventStore(SessionListing, EventStreaming, RecordRewriting, ABC):
    """An append-only, versioned log of events per session, with snapshots and leases."""

    url: str = ""
    #: The optional features this backend has (see :class:`Feature`).
    features: ClassVar[frozenset[Feature]] = frozenset()

    # ------------------------------------------------------------ primitives

    @abstractmethod
    def _create(self, info: SessionInfo) -> None:
        """Insert a session row; raise :class:`SessionExistsError` if the id is taken.

        For a fork, atomically with the insert (against a concurrent prune of
        the parent): raise :class:`SessionNotFoundError` if the parent is gone
        and :class:`VersionPrunedError` if the parent's own ``meta["pruned_to"]``
        is past ``info.parent_version``.
        """

    @abstractmethod
    def _info(self, session_id: str) -> SessionInfo | None:
        """The session row, or None."""

    def _row(self, session_id: str) -> SessionInfo | None:
        """The session row as reading its log needs it, or None: its ``meta`` may hold only
        ``pruned_to`` (a backend whose meta is costly to load overrides :meth:`_info` so)."""
        return self._info(session_id)

    def _log_info(self, session_id: str) -> SessionInfo:
        info = self._row(session_id)
        if info is None:
            raise SessionNotFoundError(session_id)
        return info

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

    def find_sessions(self, prefix: str = "", limit: int | None = None) -> list[SessionInfo]:
        """Sessions whose id starts with ``prefix`` (case-sensitive), most recently updated first.

        ``limit`` caps how many come back; ``find_sessions(limit=1)`` is the
        most recently updated session. Backends with an index override this.
        """
        found = [info for info in self.sessions() if info.session_id.startswith(prefix)]
        return found if limit is None else found[: max(0, limit)]

    def find_session_ids(self, prefix: str = "", limit: int | None = None) -> list[str]:
        """The ids :meth:`find_sessions` gives, in its order, without reading the sessions' meta
        (a long plan's meta is megabytes; resolving ``last`` or a prefix needs only the ids)."""
        return [info.session_id for info in self.find_sessions(prefix, limit)]

    @abstractmethod
    def lease_of(self, session_id: str) -> Lease | None:
        """The session's current lease row, or None if no runner ever took one.

        ``expires_at`` is on this machine's clock; a released lease expires at 0.
        Readers use it to tell a live runner from one that vanished.
        """

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
        A backend without :attr:`Feature.SNAPSHOT_PRUNING` keeps everything.
        """

    def quarantine_record(self, session_id: str, version: int) -> bool:
        """Turn this session's own damaged record at ``version`` into an empty event.

        Called by a writer after a read skipped a damaged *trailing* record, so
        that the record does not become a fatal damaged record in the middle
        once newer events follow it. The replacement's ``meta`` keeps the
        reason and the original bytes. Returns True when a record was replaced;
        False when it is readable, absent, or the backend has no
        :attr:`Feature.QUARANTINE` (its records cannot be damaged).
        """
        return False

    def migrate(self) -> int | None:
        """Create or upgrade the store's schema; return its version (None: nothing to migrate).

        Opening a store migrates it already; this is for ``saucer store migrate``.
        """
        return None

    def format_version(self) -> int:
        """The newest record format this store holds (:mod:`saucer.store.upcast`); a store
        holding newer records than this code reads is refused when opened."""
        return FORMAT_VERSION

    def close(self) -> None:
        """Release connections. Idempotent."""

    def __enter__(self) -> EventStore:
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
        participants: Sequence[str] | None = None,
    ) -> SessionInfo:
        """Create an empty session, or a fork of ``parent_id`` at ``parent_version``.

        ``session_id`` must follow :func:`check_session_id`. A fork records
        ``forked_from`` and ``at`` in its meta (with its parent's task and mode:
        :func:`~saucer.store.summary.fork_meta`), and reads its parent's log up to
        ``parent_version`` (nothing is copied); a version of the parent that was
        pruned cannot be forked (:class:`VersionPrunedError`). ``participants``
        declares who may write (:attr:`SessionInfo.participants`, kept with the
        row from the first moment; None: every writer may).
        """
        check_session_id(session_id)
        now = time.time()
        version = 0
        meta = dict(meta or {})
        meta.pop(PARTICIPANTS_KEY, None)  # only the typed argument declares them
        if participants is not None:
            meta[PARTICIPANTS_KEY] = check_participants(participants)
        if parent_id is not None:
            parent = self.session_info(parent_id)
            if parent_version is None:
                parent_version = parent.version
            parent_version = check_version(parent_version, "parent_version")
            self._check_readable(parent, parent_version)
            version = parent_version
            meta = fork_meta(parent.meta, meta, parent_id, parent_version)
        info = SessionInfo(session_id, version, now, now, parent_id, parent_version, meta)
        self._create_with(info, self._new_counters(info))
        return info

    def session_info(self, session_id: str) -> SessionInfo:
        """The session's row; :class:`SessionNotFoundError` if unknown."""
        info = self._info(session_id)
        if info is None:
            raise SessionNotFoundError(session_id)
        return info

    def exists(self, session_id: str) -> bool:
        """Whether the session exists."""
        return self._row(session_id) is not None

    def head(self, session_id: str) -> int:
        """The session's latest version (0 for a new session)."""
        return self._log_info(session_id).version

    def delete_session(self, session_id: str) -> None:
        """Remove a session completely: its events, snapshots and lease (no error if it is gone).

        Refused with :class:`StoreError` while forks of it exist: they read its log.
        """
        forks = sorted(i.session_id for i in self._forks(session_id))
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
        """Commit ``ops`` as one event based on ``expected_version``; return the event.

        The operations are the store's once appended: a caller never changes them
        (nor their values) afterwards, so a store may keep them without a copy
        (the memory store does; a Context's operations hold values normalised and
        copied when they were set). ``meta`` stays the caller's.
        """
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
        """Events of the session's whole lineage with ``after < version <= upto``.

        A pruned session's log starts at its first readable version (whose
        event sets the whole state then); nothing before it is returned. The
        events are consecutive: a read that raced with a prune is done again.
        """
        after = check_version(after, "after")
        upto = None if upto is None else check_version(upto, "upto")
        for _ in range(3):
            info = self._log_info(session_id)
            start = max(after + 1, self._first(info))
            events = list(self._lineage(info, after, upto))
            if all(event.version == start + i for i, event in enumerate(events)):
                return iter(events)
        raise StoreError(f"session {session_id!r}: its log kept changing while being read (a prune?); try again")

    def _lineage(self, info: SessionInfo, after: int, upto: int | None) -> Iterator[Event]:
        """Own events of ``info``'s session and, below its branch point, its parent's lineage."""
        if info.parent_id is not None and info.parent_version is not None and after < info.parent_version:
            limit = info.parent_version if upto is None else min(upto, info.parent_version)
            yield from self._lineage(self._log_info(info.parent_id), after, limit)
            after = info.parent_version
        if upto is not None and upto <= after:
            return
        yield from self._read(info.session_id, after, upto)

    def latest_snapshot(self, session_id: str, upto: int | None = None) -> Snapshot | None:
        """The newest snapshot usable for the session at or before ``upto`` (own, else its parent's)."""
        info = self._log_info(session_id)
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

    async def watch(self, session_id: str, after: int = 0, *, interval: float = 0.2) -> AsyncIterator[Event]:
        """Yield the session's new events as they are committed (polling by default)."""
        import asyncio

        last = after
        while True:
            fresh = await asyncio.to_thread(lambda: list(self.read(session_id, last)))
            for event in fresh:
                last = event.version
                yield event
            if not fresh:
                await asyncio.sleep(interval)

    # ------------------------------------------------------------ versions

    def first_version(self, session_id: str) -> int:
        """The oldest version of the session that can still be read (0 unless pruned)."""
        return self._first(self._log_info(session_id))

    def _first(self, info: SessionInfo) -> int:
        # A fork that still reads its parent's log reads it from the parent's first version.
        own = int(info.meta.get("pruned_to", 0))
        if info.parent_id is None or info.parent_version is None or own > info.parent_version:
            return own
        parent = self._row(info.parent_id)
        return own if parent is None else max(own, self._first(parent))

    def check_readable(self, session_id: str, version: int) -> int:
        """``version`` if the session can be read at it; else :class:`VersionPrunedError`
        (below its first readable version) or :class:`VersionNotFoundError` (past its head)."""
        return self._check_readable(self._log_info(session_id), check_version(version))

    def _check_readable(self, info: SessionInfo, version: int) -> int:
        first = self._first(info)
        if 0 <= version < first:
            raise VersionPrunedError(info.session_id, version, first, info.version)
        if not first <= version <= info.version:
            raise VersionNotFoundError(info.session_id, version, first, info.version)
        return version

    @staticmethod
    def _check_fork_point(info: SessionInfo, parent: tuple[int, int] | None) -> None:
        """For a backend's ``_create`` of the fork ``info``, given its parent's ``(head,
        meta["pruned_to"])`` read in the same transaction (None: no parent)."""
        assert info.parent_id is not None and info.parent_version is not None
        if parent is None:
            raise SessionNotFoundError(info.parent_id)
        head, first = parent
        if info.parent_version < first:
            raise VersionPrunedError(info.parent_id, info.parent_version, first, head)

    def _forks(self, session_id: str) -> list[SessionInfo]:
        """The sessions that read this session's log (its attached forks)."""
        return [i for i in self.sessions() if i.parent_id == session_id]

    # ------------------------------------------------------------ retention

    def replace_history(self, session_id: str, cut: int, base_ops: list[dict[str, Any]], state: dict[str, Any]) -> int:
        """Cut the session's log at ``cut``; return its first readable version afterwards.

        The primitive of :func:`saucer.context.prune`, which picks the cut and
        folds the state there (a store does not interpret states). ``base_ops``
        set that whole state from an empty one; ``state`` is its wire form.
        Atomically, the session's own events and snapshots below ``cut`` go,
        its event at ``cut`` becomes a *base* event made of ``base_ops``
        (author ``system``, ``meta["pruned"]`` naming the original author), a
        snapshot of ``state`` is stored at ``cut``, and ``cut`` becomes its first
        readable version: that version and every later one read as before.

        Forks never lose a version: each fork that still reads this session's
        log first gets its own copy of the events it reads, then stands alone
        (``meta["forked_from"]`` and ``["at"]`` keep its origin). A fork itself
        is cut only above its branch point; then it stands alone too. A cut at
        or below the first readable version changes nothing (a concurrent
        prune went further). :class:`NotSupportedError` unless the backend
        declares :attr:`Feature.REPLACE_HISTORY`.
        """
        self._require(Feature.REPLACE_HISTORY, "replace history (prune)")
        cut = check_version(cut, "cut")
        for _ in range(5):
            info = self.session_info(session_id)
            first = self._first(info)
            if cut <= first:
                return first
            if cut > info.version:
                raise VersionNotFoundError(session_id, cut, first, info.version)
            if info.parent_id is not None and info.parent_version is not None and cut <= info.parent_version:
                raise ValueError(
                    f"session {session_id!r} is a fork of {info.parent_id!r} at version {info.parent_version}: "
                    f"it is cut only above that version, not at {cut}"
                )
            for fork in self._forks(session_id):
                self._materialise_fork(fork)
            if self._prune(
                session_id, cut, self._base_event(info, cut, base_ops), Snapshot(session_id, cut, time.time(), state)
            ):
                return self.first_version(session_id)
        raise StoreError(f"session {session_id!r}: new forks kept appearing while it was pruned; try again")

    def _base_event(self, info: SessionInfo, cut: int, ops: list[dict[str, Any]]) -> Event:
        """The base event that replaces the session's own event at ``cut`` (its time, round and step stay)."""
        original = next(iter(self._read(info.session_id, cut - 1, cut)), None)
        if original is None:
            raise StoreError(f"session {info.session_id!r}: cannot prune at version {cut}: its event is missing")
        return Event(
            session_id=info.session_id,
            version=cut,
            timestamp=original.timestamp,
            author="system",
            round=original.round,
            step=original.step,
            ops=ops,
            meta={"pruned": {"upto": cut, "author": original.author}},
        )

    def _materialise_fork(self, fork: SessionInfo) -> None:
        """Give a fork its own copy of the parent's lineage it reads, so it stands alone."""
        assert fork.parent_id is not None and fork.parent_version is not None
        first = self._first(fork)
        after = max(first - 1, 0)
        # The copies keep their own session ids: they stay attributed to where they were made.
        events = list(self.read(fork.parent_id, after, fork.parent_version))
        if len(events) != fork.parent_version - after:
            raise StoreError(
                f"session {fork.session_id!r}: cannot copy versions {after + 1}..{fork.parent_version} "
                f"of its parent {fork.parent_id!r} (some are missing); nothing was pruned"
            )
        snap = self.latest_snapshot(fork.parent_id, fork.parent_version)
        own = None if snap is None or snap.version < first else replace(snap, session_id=fork.session_id)
        meta = {"forked_from": fork.parent_id, "at": fork.parent_version}
        if first:
            meta["pruned_to"] = first
        self._materialise(fork, events, own, meta)

    def _prune(self, session_id: str, cut: int, base: Event, snapshot: Snapshot) -> bool:
        """Primitive of :meth:`replace_history`, in ONE transaction: delete this
        session's own events and snapshots below ``cut``, replace its own event at
        ``cut`` by ``base``, store ``snapshot`` (at ``cut``), record ``cut`` as
        ``meta["pruned_to"]``, and detach the session from its parent (its log no
        longer reads the parent's). Does nothing if ``meta["pruned_to"]`` is
        already at or past ``cut`` (a concurrent prune went further).

        Returns False, having changed nothing, if a fork of the session exists
        (one made since :meth:`replace_history` materialised the forks).
        """
        raise NotSupportedError(f"{type(self).__name__} does not declare {Feature.REPLACE_HISTORY} yet lacks _prune")

    def _materialise(
        self, info: SessionInfo, events: list[Event], snapshot: Snapshot | None, meta: dict[str, Any]
    ) -> bool:
        """Primitive of :meth:`replace_history`, in ONE transaction: give the fork ``info`` its
        own copy of ``events`` (its lineage up to its branch point; each keeps,
        and reads back with, its own ``session_id``), store ``snapshot`` unless it
        has one there, merge ``meta`` into its meta, and detach it from its parent.
        False, changing nothing, if it is no longer attached as ``info`` says."""
        raise NotSupportedError(
            f"{type(self).__name__} does not declare {Feature.REPLACE_HISTORY} yet lacks _materialise"
        )

    def _import(self, info: SessionInfo, events: list[Event], snapshots: list[Snapshot]) -> None:
        """Primitive of :meth:`import_log`, in ONE transaction: create the session
        ``info`` (no parent) with ``events`` and ``snapshots``;
        :class:`SessionExistsError` if the id is taken."""
        raise NotSupportedError(f"{type(self).__name__} does not declare {Feature.IMPORT} yet lacks _import")

    def import_log(self, info: SessionInfo, events: list[Event], snapshots: Sequence[Snapshot] = ()) -> None:
        """Create the session ``info`` (standing alone) with a checked log, in ONE transaction
        (:func:`saucer.context.transfer.import_session` checks each event first).

        ``events`` are consecutive up to ``info.version``, from 1 or from
        ``info.meta["pruned_to"]`` (a base event). :class:`SessionExistsError` if the id is taken;
        :class:`NotSupportedError` unless the backend declares :attr:`Feature.IMPORT`.
        """
        self._require(Feature.IMPORT, "import a session")
        check_session_id(info.session_id)
        first = int(info.meta.get("pruned_to", 0))
        start = first or 1
        if info.parent_id is not None or info.parent_version is not None:
            raise ValueError("an imported session stands alone: it has no parent")
        if [e.version for e in events] != list(range(start, info.version + 1)) or any(
            e.session_id != info.session_id for e in events
        ):
            raise ValueError(
                f"the events of {info.session_id!r} must be versions {start}..{info.version} of that session"
            )
        self._import(info, list(events), list(snapshots))

    def _require(self, feature: Feature, what: str) -> None:
        if feature not in self.features:
            raise NotSupportedError(
                f"{type(self).__name__} cannot {what}: it does not have the feature {feature.value!r}"
            )


def _new_event(
    session_id: str,
    expected_version: int,
    ops: list[dict[str, Any]],
    author: str,
    round: int | None,
    step: int | None,
    meta: dict[str, Any] | None,
) -> Event:
    return Event(
        session_id=session_id,
        version=expected_version + 1,
        timestamp=time.time(),
        author=author,
        round=round,
        step=step,
        ops=ops,
        meta=redact(dict(meta or {})),  # step records carry tool results and errors: no secrets in the log
    )
