"""The backend contract: what a store backend implements (:class:`Recorder`).

A backend records sessions' rows, events, snapshots and leases on *its own*
tables, and answers for each session alone: it knows nothing of forks'
lineage, version checks, prunes or listings. Those are built once, on these
methods, by the collaborators of :class:`~saucer.store.EventStore`
(:mod:`saucer.store.lineage`, :mod:`saucer.store.listing`,
:mod:`saucer.store.pruning`, :mod:`saucer.store.rewriting`).

Eleven abstract methods make a working backend; the others have defaults a
backend overrides to be faster (one query instead of many) or to offer an
optional :class:`~saucer.store.model.Feature` it then declares in
:attr:`Recorder.features`. The contract suite :mod:`saucer.store.testing`
holds every backend to the same behaviour; ``tests/store/dict_backend.py`` is
a whole backend in a page.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any

from saucer.store.model import (
    Event,
    Feature,
    Lease,
    NotSupportedError,
    SessionHead,
    SessionInfo,
    SessionNotFoundError,
    Snapshot,
    VersionPrunedError,
)
from saucer.store.summary import Counters, ListQuery, SessionSummary

__all__ = ["Recorder", "check_fork_point"]


class Recorder(ABC):
    """Rows, events, snapshots and leases of sessions, each session on its own (see the module docs)."""

    #: Where the store is (``memory://``, ``sqlite:///...``), for messages and ``saucer`` commands.
    url: str = ""
    #: The optional features this backend has (see :class:`~saucer.store.model.Feature`).
    features: frozenset[Feature] = frozenset()

    # ------------------------------------------------------------------ the contract

    @abstractmethod
    def create_row(self, info: SessionInfo, counters: Counters) -> None:
        """Insert the session row ``info`` with its summary ``counters``;
        :class:`~saucer.store.SessionExistsError` if the id is taken.

        For a fork, atomically with the insert (against a concurrent prune of
        the parent): :func:`check_fork_point` with the parent's head and
        ``meta["pruned_to"]`` as they are in the same transaction.
        """

    @abstractmethod
    def row(self, session_id: str) -> SessionInfo | None:
        """The session's row (its whole meta), or None."""

    @abstractmethod
    def write_event(self, event: Event, expected_version: int, fence: int | None) -> None:
        """Append ``event`` (version ``expected_version + 1``) and fold it into the session's summary
        (:func:`saucer.store.summary.fold`), atomically.

        :class:`~saucer.store.ConflictError` if the head is not ``expected_version``,
        :class:`~saucer.store.FencedError` if ``fence`` is not the session's current lease token,
        :class:`~saucer.store.SessionNotFoundError` if there is no such session.
        """

    @abstractmethod
    def read_own(self, session_id: str, after: int, upto: int | None) -> Iterator[Event]:
        """This session's own events with ``after < version <= upto``, in order.

        A damaged trailing record is skipped with a warning; a damaged record
        followed by good ones raises :class:`~saucer.store.CorruptRecordError`.
        """

    @abstractmethod
    def own_snapshot(self, session_id: str, upto: int | None) -> Snapshot | None:
        """This session's own newest readable snapshot at or before ``upto``."""

    @abstractmethod
    def save_snapshot(self, snapshot: Snapshot) -> None:
        """Store a snapshot (replacing one at the same version)."""

    @abstractmethod
    def sessions(self) -> list[SessionInfo]:
        """Every session, most recently updated first (ties by session id)."""

    @abstractmethod
    def delete_rows(self, session_id: str) -> None:
        """Remove the session's row, events, snapshots, summary and lease (no error if it is gone)."""

    @abstractmethod
    def lease_of(self, session_id: str) -> Lease | None:
        """The session's current lease row, or None if no runner ever took one.

        ``expires_at`` is on this machine's clock; a released lease expires at 0.
        """

    @abstractmethod
    def acquire_lease(self, session_id: str, owner: str, ttl: float) -> Lease:
        """Take (or renew, for the same owner) the lease on a session.

        :class:`~saucer.store.LeaseHeldError` while another owner's lease is unexpired;
        :class:`~saucer.store.SessionNotFoundError` if there is no such session.
        Each takeover by a new owner increases the token.
        """

    @abstractmethod
    def release_lease(self, lease: Lease) -> None:
        """Give a lease up (no-op when it was already taken over)."""

    # ------------------------------------------------- defaults a backend may override

    def log_row(self, session_id: str) -> SessionInfo | None:
        """The session's row as reading its log needs it: its ``meta`` may hold only ``pruned_to``."""
        return self.row(session_id)

    def row_without_plan(self, session_id: str) -> tuple[SessionInfo, bool] | None:
        """The row with its meta's ``plan`` left out, and whether it has one (None: no such session)."""
        info = self.row(session_id)
        if info is None or "plan" not in info.meta:
            return None if info is None else (info, False)
        return SessionInfo(
            info.session_id,
            info.version,
            info.created_at,
            info.updated_at,
            info.parent_id,
            info.parent_version,
            {k: v for k, v in info.meta.items() if k != "plan"},
        ), True

    def awrite_event(
        self, event: Event, expected_version: int, fence: int | None, on_written: Callable[[], object] | None
    ) -> Awaitable[None]:
        """:meth:`write_event` from a coroutine (any awaitable), calling ``on_written()`` once the event
        is durable, even if the awaiting task was cancelled meanwhile; by default, synchronously."""
        return _write_now(self, event, expected_version, fence, on_written)

    def write_events(self, events: Sequence[Event], expected_version: int, fence: int | None) -> None:
        """Append ``events``, of the consecutive versions after ``expected_version``, as :meth:`write_event`
        does each one, in ONE transaction: all of them or none (a conflict, a fence or a crash refuses them
        all). By default each is written alone, in order (a crash may leave the first ones, as separate
        appends would); saucer's backends write them at once (one fsync, one round trip)."""
        for i, event in enumerate(events):
            self.write_event(event, expected_version + i, fence)

    def awrite_events(
        self, events: Sequence[Event], expected_version: int, fence: int | None, on_written: Callable[[], object] | None
    ) -> Awaitable[None]:
        """:meth:`write_events` from a coroutine, calling ``on_written()`` once all are durable (see
        :meth:`awrite_event`); by default, synchronously."""
        return _write_all_now(self, events, expected_version, fence, on_written)

    def note_meta_json(self, event: Event, meta_json: bytes) -> None:
        """The JSON of ``event``'s meta (``b""`` for none) as the append that made it encoded it, just
        before :meth:`write_event` (or :meth:`awrite_event`) is called with it: a backend that keeps
        JSON text (the memory store) may keep this rather than encode the meta again. By default, ignored."""
        return None

    def kept_counters(self, session_id: str) -> Counters | None:
        """The summary counters kept for the session (None: none kept, or no such session)."""
        return None

    def list_rows(self, query: ListQuery) -> list[SessionSummary] | None:
        """The rows of a listing from the kept summaries in one query (None: the store folds logs)."""
        return None

    def heads(self, session_ids: Iterable[str] | None) -> list[SessionHead] | None:
        """Sessions with their newest event and lease in one query (None: read session by session)."""
        return None

    def find(self, prefix: str, limit: int | None) -> list[SessionInfo]:
        """Sessions whose id starts with ``prefix``, most recently updated first, at most ``limit``."""
        found = [info for info in self.sessions() if info.session_id.startswith(prefix)]
        return found if limit is None else found[: max(0, limit)]

    def find_ids(self, prefix: str, limit: int | None) -> list[str]:
        """The ids :meth:`find` gives (a backend may skip reading the meta)."""
        return [info.session_id for info in self.find(prefix, limit)]

    def forks_of(self, session_id: str) -> list[SessionInfo]:
        """The sessions whose parent is this one (attached forks)."""
        return [i for i in self.sessions() if i.parent_id == session_id]

    def prune_snapshots(self, session_id: str, keep: int) -> None:
        """Drop this session's own snapshots except the newest ``keep`` (with :attr:`Feature.SNAPSHOT_PRUNING`);
        by default, none (snapshots are a cache of the fold: keeping them loses nothing)."""
        return None

    def save_snapshot_pruned(self, snapshot: Snapshot, keep: int) -> None:
        """:meth:`prune_snapshots` to the newest ``keep`` (never the snapshot's own version), then
        :meth:`save_snapshot`: a backend that waits on a server does both in one round trip."""
        self.prune_snapshots(snapshot.session_id, keep)
        self.save_snapshot(snapshot)

    def save_snapshot_released(self, snapshot: Snapshot, keep: int, lease: Lease) -> None:
        """:meth:`save_snapshot_pruned`, then :meth:`release_lease` (a runner closing its session): a backend
        that waits on a server does both in one round trip. When it raises, the lease may still be held."""
        self.save_snapshot_pruned(snapshot, keep)
        self.release_lease(lease)

    def create_row_leased(self, info: SessionInfo, counters: Counters, owner: str, ttl: float) -> Lease:
        """:meth:`create_row`, then :meth:`acquire_lease` for ``owner``: a backend that waits on a server
        does both in one transaction (the session is never seen without its runner's lease)."""
        self.create_row(info, counters)
        return self.acquire_lease(info.session_id, owner, ttl)

    def quarantine_record(self, session_id: str, version: int) -> bool:
        """Turn this session's own damaged record at ``version`` into an empty event (:attr:`Feature.QUARANTINE`)."""
        return False

    def migrate(self) -> int | None:
        """Create or upgrade the schema; its version (None: nothing to migrate)."""
        return None

    def format_version(self) -> int | None:
        """The newest record format the store holds (None: this code's, nothing outlives the process)."""
        return None

    def close(self) -> None:
        """Release connections. Idempotent."""
        return None

    # -------------------------------------------- optional features (declared in ``features``)

    def prune_rows(self, session_id: str, cut: int, base: Event, snapshot: Snapshot) -> bool:
        """:attr:`Feature.REPLACE_HISTORY`, in ONE transaction: delete this session's own events and
        snapshots below ``cut``, replace its own event at ``cut`` by ``base``, store ``snapshot``,
        record ``cut`` as ``meta["pruned_to"]`` and detach the session from its parent. Does nothing
        (True) if ``meta["pruned_to"]`` is already at or past ``cut``; False, changing nothing, if a
        fork of the session exists."""
        raise NotSupportedError(f"{type(self).__name__} cannot prune")

    def materialise_rows(
        self, info: SessionInfo, events: list[Event], snapshot: Snapshot | None, meta: dict[str, Any]
    ) -> bool:
        """:attr:`Feature.REPLACE_HISTORY`, in ONE transaction: give the fork ``info`` its own copy of
        ``events`` (each keeps, and reads back with, its own ``session_id``), store ``snapshot`` unless
        it has one there, merge ``meta`` into its meta and detach it from its parent. False, changing
        nothing, if it is no longer attached as ``info`` says."""
        raise NotSupportedError(f"{type(self).__name__} cannot materialise a fork")

    def import_rows(
        self, info: SessionInfo, events: list[Event], snapshots: list[Snapshot], counters: Counters
    ) -> None:
        """:attr:`Feature.IMPORT`, in ONE transaction: create the session ``info`` (no parent) with
        ``events``, ``snapshots`` and summary ``counters``; SessionExistsError if the id is taken."""
        raise NotSupportedError(f"{type(self).__name__} cannot import")

    def own_formats(self, session_id: str) -> tuple[dict[int, int], dict[int, int]]:
        """:attr:`Feature.REWRITE`: ``({version: format}, {snapshot version: format})`` of the
        session's own readable records."""
        raise NotSupportedError(f"{type(self).__name__} cannot report record formats")

    def rewrite_rows(
        self, session_id: str, events: list[Event], snapshots: Sequence[Snapshot], meta: dict[str, Any] | None
    ) -> None:
        """:attr:`Feature.REWRITE`, in ONE transaction: store ``events`` in place of the session's own
        events at their versions, ``snapshots``, and ``meta`` if given."""
        raise NotSupportedError(f"{type(self).__name__} cannot rewrite records")


def check_fork_point(info: SessionInfo, parent: tuple[int, int] | None) -> None:
    """For :meth:`Recorder.create_row` of the fork ``info``, given its parent's ``(head,
    meta["pruned_to"])`` read in the same transaction (None: no parent)."""
    if info.parent_id is None or info.parent_version is None:
        return
    if parent is None:
        raise SessionNotFoundError(info.parent_id)
    head, first = parent
    if info.parent_version < first:
        raise VersionPrunedError(info.parent_id, info.parent_version, first, head)


async def _write_now(
    recorder: Recorder, event: Event, expected_version: int, fence: int | None, on_written: Callable[[], object] | None
) -> None:
    recorder.write_event(event, expected_version, fence)
    if on_written is not None:
        on_written()


async def _write_all_now(
    recorder: Recorder,
    events: Sequence[Event],
    expected_version: int,
    fence: int | None,
    on_written: Callable[[], object] | None,
) -> None:
    recorder.write_events(events, expected_version, fence)
    if on_written is not None:
        on_written()
