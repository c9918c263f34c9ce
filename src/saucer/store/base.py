"""The event store interface shared by every backend (its records and errors,
from :mod:`saucer.store.model`, are re-exported here).

A store keeps, per session, an append-only log of :class:`~saucer.store.model.Event`
records numbered 1, 2, 3, ... and occasional snapshots of the materialised
state. It knows nothing about the Context beyond that: operations and states
are JSON data it stores and returns as they are.

A backend implements the :class:`~saucer.store.recorder.Recorder` contract on
*its own* rows (eleven abstract methods with public names). The public methods
here add what is the same everywhere, held in collaborators built on that
contract alone: :class:`~saucer.store.lineage.Lineage` (forks that reference
their parent's log instead of copying it, version checks, streams),
:class:`~saucer.store.listing.SummaryKeeper` (summaries and listings),
:class:`~saucer.store.pruning.Pruner` (prune and import) and
:class:`~saucer.store.rewriting.Rewriter` (records rewritten in place). What a
backend may leave out is declared in :attr:`EventStore.features`, never
guessed. The contract suite :mod:`saucer.store.testing` holds every backend to
the same behaviour.

Every error that leaves a store derives from :class:`StoreError`: backends
translate their driver's errors (``sqlite3``, ``psycopg``) at their edge.
Session ids follow one rule, checked wherever a session is made (:func:`check_session_id`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from functools import cached_property, partial
from typing import Any

import orjson

from saucer.redaction import redact, redact_text
from saucer.store.lineage import DEFAULT_BATCH, Lineage
from saucer.store.listing import SummaryKeeper
from saucer.store.model import (
    SESSION_ID_MAX_LENGTH,
    ConflictError,
    CorruptRecordError,
    DamagedStoreError,
    Event,
    EventDraft,
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
    SessionHead,
    SessionInfo,
    SessionNotFoundError,
    Snapshot,
    StoreError,
    StoreKeyError,
    ValueNotStorableError,
    VersionNotFoundError,
    VersionPrunedError,
    check_session_id,
    check_version,
    creation_meta,
    make_event,
)
from saucer.store.pruning import Pruner
from saucer.store.recorder import Recorder
from saucer.store.rewriting import Rewriter
from saucer.store.summary import ListQuery, SessionSummary, SummaryDelta, fork_meta
from saucer.store.upcast import FORMAT_VERSION

__all__ = [
    "StoreError",
    "ConflictError",
    "FencedError",
    "FormatTooNewError",
    "StoreKeyError",
    "ValueNotStorableError",
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
    "EventDraft",
    "Feature",
    "EventStore",
    "Recorder",
    "SummaryDelta",
]


class EventStore(Recorder):
    """An append-only, versioned log of events per session, with snapshots, leases and summaries.

    A backend implements the :class:`~saucer.store.recorder.Recorder` methods; everything
    public here is built on them by the store's collaborators (see the module docs).
    """

    # ------------------------------------------------------------ collaborators

    @cached_property
    def lineage(self) -> Lineage:
        """Reads across forks and prunes (built on this store's recorder methods)."""
        return Lineage(self)

    @cached_property
    def summaries(self) -> SummaryKeeper:
        """The per-session summaries and listings."""
        return SummaryKeeper(self, self.lineage)

    @cached_property
    def pruner(self) -> Pruner:
        """Prune and import."""
        return Pruner(self, self.lineage, self.summaries)

    @cached_property
    def rewriter(self) -> Rewriter:
        """Records rewritten in place (``saucer store migrate --rewrite``, ``rekey``)."""
        return Rewriter(self)

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def format_version(self) -> int:
        """The newest record format this store holds (:mod:`saucer.store.upcast`); a store
        holding newer records than this code reads is refused when opened."""
        return FORMAT_VERSION

    # ---------------------------------------------------------- sessions

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
        meta = creation_meta(session_id, meta, participants)
        now = time.time()
        version = 0
        if parent_id is not None:
            parent = self.session_info(parent_id)
            if parent_version is None:
                parent_version = parent.version
            parent_version = check_version(parent_version, "parent_version")
            self.lineage.check_readable(parent, parent_version)
            version = parent_version
            meta = fork_meta(parent.meta, meta, parent_id, parent_version)
        info = SessionInfo(session_id, version, now, now, parent_id, parent_version, meta)
        self.create_row(info, self.summaries.new_counters(info))
        return info

    def create_session_leased(
        self,
        session_id: str,
        *,
        owner: str,
        ttl: float,
        meta: dict[str, Any] | None = None,
        participants: Sequence[str] | None = None,
    ) -> tuple[SessionInfo, Lease]:
        """:meth:`create_session` (not a fork) and :meth:`acquire_lease` for ``owner`` at once: what a
        runner starting a new session does. The PostgreSQL store makes both in ONE statement (one
        round trip, one transaction); :class:`SessionExistsError` if the id is taken (nothing is leased)."""
        meta = creation_meta(session_id, meta, participants)
        now = time.time()
        info = SessionInfo(session_id, 0, now, now, None, None, meta)
        return info, self.create_row_leased(info, self.summaries.new_counters(info), owner, ttl)

    def session_info(self, session_id: str) -> SessionInfo:
        """The session's row; :class:`SessionNotFoundError` if unknown."""
        info = self.row(session_id)
        if info is None:
            raise SessionNotFoundError(session_id)
        return info

    def session_info_without_plan(self, session_id: str) -> tuple[SessionInfo, bool]:
        """The session's row with its meta's ``plan`` left out, and whether the meta has one.

        What a resume reads first: a stored plan of 10^4 steps is megabytes of JSON,
        read (:meth:`session_plan`) only when a step of it runs. SQLite leaves it
        unparsed. :class:`SessionNotFoundError` if unknown.
        """
        found = self.row_without_plan(session_id)
        if found is None:
            raise SessionNotFoundError(session_id)
        return found

    def session_plan(self, session_id: str) -> Any:
        """The ``plan`` of the session's meta (None if it has none); :class:`SessionNotFoundError` if unknown."""
        return self.session_info(session_id).meta.get("plan")

    def exists(self, session_id: str) -> bool:
        """Whether the session exists."""
        return self.log_row(session_id) is not None

    def head(self, session_id: str) -> int:
        """The session's latest version (0 for a new session)."""
        return self.lineage.log_info(session_id).version

    def find_sessions(self, prefix: str = "", limit: int | None = None) -> list[SessionInfo]:
        """Sessions whose id starts with ``prefix`` (case-sensitive), most recently updated first.

        ``limit`` caps how many come back; ``find_sessions(limit=1)`` is the
        most recently updated session.
        """
        return self.find(prefix, limit)

    def find_session_ids(self, prefix: str = "", limit: int | None = None) -> list[str]:
        """The ids :meth:`find_sessions` gives, in its order, without reading the sessions' meta
        (a long plan's meta is megabytes; resolving ``last`` or a prefix needs only the ids)."""
        return self.find_ids(prefix, limit)

    def delete_session(self, session_id: str) -> None:
        """Remove a session completely: its events, snapshots and lease (no error if it is gone).

        Refused with :class:`StoreError` while forks of it exist: they read its log.
        """
        forks = sorted(i.session_id for i in self.forks_of(session_id))
        if forks:
            raise StoreError(
                f"session {session_id!r} has forks that read its log ({', '.join(forks)}); delete them first"
            )
        self.delete_rows(session_id)

    def forks(self, session_id: str) -> list[SessionInfo]:
        """The sessions forked from this one that still read its log (a fork that stands alone
        after a prune keeps its origin in ``meta["forked_from"]`` instead)."""
        return sorted(self.forks_of(session_id), key=lambda info: info.session_id)

    # ------------------------------------------------------------ events

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
        summary: SummaryDelta | None = None,
    ) -> Event:
        """Commit ``ops`` as one event based on ``expected_version``; return the event.

        ``summary`` says what the commit changes in the session's summary (what
        :meth:`list_sessions` shows; None: only the step counter moves, to ``step``).
        The operations are the store's once appended: a caller never changes them
        (nor their values) afterwards, so a store may keep them without a copy
        (a Context's operations hold values normalised and copied when they were
        set). ``meta`` stays the caller's.
        """
        event, meta_json = new_event(session_id, expected_version, ops, author, round, step, meta, summary)
        self.note_meta_json(event, meta_json)
        self.write_event(event, expected_version, fence)
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
        summary: SummaryDelta | None = None,
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
        event, meta_json = new_event(session_id, expected_version, ops, author, round, step, meta, summary)
        self.note_meta_json(event, meta_json)
        await self.awrite_event(
            event, expected_version, fence, None if on_written is None else partial(on_written, event)
        )
        return event

    def aappend_write(
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
        summary: SummaryDelta | None = None,
    ) -> Awaitable[None]:
        """:meth:`aappend` without a coroutine of its own (a Context's commit, once per step): the
        event is made (and refused) at once, and the write is returned to be awaited at once; the
        event reaches the caller through ``on_written`` only."""
        event, meta_json = new_event(session_id, expected_version, ops, author, round, step, meta, summary)
        self.note_meta_json(event, meta_json)
        return self.awrite_event(
            event, expected_version, fence, None if on_written is None else partial(on_written, event)
        )

    def append_many(
        self, session_id: str, expected_version: int, drafts: Sequence[EventDraft], *, fence: int | None = None
    ) -> list[Event]:
        """Commit ``drafts`` as the consecutive events after ``expected_version``, in ONE transaction:
        all of them or none (a conflict on the first refuses them all). Each keeps its own author,
        round, step, meta, summary and time, as separate :meth:`append` calls would record them."""
        events = _new_events(session_id, expected_version, drafts)
        self.write_events(events, expected_version, fence)
        return events

    async def aappend_many(
        self,
        session_id: str,
        expected_version: int,
        drafts: Sequence[EventDraft],
        *,
        fence: int | None = None,
        on_written: Callable[[list[Event]], Any] | None = None,
    ) -> list[Event]:
        """:meth:`append_many` for coroutines (one fsync, shared as :meth:`aappend`'s are), calling
        ``on_written(events)`` as soon as they are durable (see :meth:`aappend`)."""
        events = _new_events(session_id, expected_version, drafts)
        await self.awrite_events(
            events, expected_version, fence, None if on_written is None else partial(on_written, events)
        )
        return events

    def read(self, session_id: str, after: int = 0, upto: int | None = None) -> Iterator[Event]:
        """Events of the session's whole lineage with ``after < version <= upto``.

        A pruned session's log starts at its first readable version (whose
        event sets the whole state then); nothing before it is returned. The
        events are consecutive: a read that raced with a prune is done again.
        """
        return self.lineage.read(session_id, after, upto)

    def iter_events(
        self, session_id: str, after: int = 0, upto: int | None = None, *, batch: int = DEFAULT_BATCH
    ) -> Iterator[Event]:
        """The events of the session's whole lineage with ``after < version <= upto``, read
        ``batch`` versions at a time (the same events, in the same order, as :meth:`read`).

        ``upto`` defaults to the session's head when the iteration starts:
        events committed meanwhile are not included. A pruned session's
        stream starts at its first readable version. Each batch is its own
        read: if the log changes under the stream (a prune, a deleted
        session), it raises :class:`StoreError` (or :class:`SessionNotFoundError`)
        rather than skip or repeat a version.
        """
        return self.lineage.iter_events(session_id, after, upto, batch)

    def last_event(self, info: SessionInfo) -> Event | None:
        """The event at ``info.version`` (of its lineage), or None: no events, a damaged
        newest record, or the session deleted meanwhile."""
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a damaged trailing record: the listing shows no last event
            return self.lineage.last_event(info)

    def latest_snapshot(self, session_id: str, upto: int | None = None) -> Snapshot | None:
        """The newest snapshot usable for the session at or before ``upto`` (own, else its parent's)."""
        return self.lineage.latest_snapshot(session_id, upto)

    def events_since_snapshot(self, session_id: str) -> int:
        """How many events a hydrate of the head would fold after the latest snapshot."""
        snap = self.latest_snapshot(session_id)
        return self.head(session_id) - (snap.version if snap else 0)

    async def watch(self, session_id: str, after: int = 0, *, interval: float = 0.2) -> AsyncIterator[Event]:
        """Yield the session's new events as they are committed (polling by default)."""
        import asyncio

        last = after
        while True:
            fresh = await asyncio.to_thread(_listed, self.read, session_id, last)
            for event in fresh:
                last = event.version
                yield event
            if not fresh:
                await asyncio.sleep(interval)

    # ------------------------------------------------------------ versions

    def first_version(self, session_id: str) -> int:
        """The oldest version of the session that can still be read (0 unless pruned)."""
        return self.lineage.first(self.lineage.log_info(session_id))

    def check_readable(self, session_id: str, version: int) -> int:
        """``version`` if the session can be read at it; else :class:`VersionPrunedError`
        (below its first readable version) or :class:`VersionNotFoundError` (past its head)."""
        return self.lineage.check_readable(self.lineage.log_info(session_id), check_version(version))

    # ------------------------------------------------------------ listings

    def list_sessions(
        self,
        *,
        limit: int | None = None,
        status: str | Iterable[str] | None = None,
        task: str | None = None,
        since: float | None = None,
        sort: str = "updated",
        descending: bool | None = None,
        ids: Iterable[str] | None = None,
    ) -> list[SessionSummary]:
        """The sessions' summaries (what ``saucer sessions`` shows), from ONE query on saucer's backends.

        - ``limit``: at most this many rows (None: all);
        - ``status``: only sessions listed with this status, or one of these
          (``running``, ``interrupted``, ``finished``, ``failed``, ``error``,
          ``stopped``, ``-`` for a session the engine did not make);
        - ``task``: only sessions whose task contains this text (ASCII letters
          compared without case);
        - ``since``: only sessions updated at or after this time (epoch seconds);
        - ``sort``: one of :data:`~saucer.store.summary.SORT_KEYS`
          (``updated``, ``created``, ``id``, ``task``, ``status``, ``rounds``,
          ``steps``, ``cost``, ``version``); ``descending`` defaults to True
          except for ``id`` and ``task``; None values sort last, ties by id;
        - ``ids``: only these sessions (those that exist).

        Each :class:`~saucer.store.summary.SessionSummary` is kept up to date by
        the commits themselves, from the :class:`~saucer.store.summary.SummaryDelta`
        each one carries (see :mod:`saucer.store.summary` for what each field
        counts); ``status`` is derived at the time of the query (a session not
        ended whose runner's lease expired is ``interrupted``). ValueError or
        TypeError name a bad argument.
        """
        return self.summaries.listing(ListQuery.of(limit, status, task, since, sort, descending, ids))

    def session_heads(self, session_ids: Iterable[str] | None = None) -> list[SessionHead]:
        """Sessions with their newest event and their lease, in the order of :meth:`sessions`:
        every session, or those of ``session_ids`` that exist.

        The durable backends answer in one query whatever the number of
        sessions (a listing page must not read once per session). A damaged
        newest record gives ``last=None``.
        """
        return self.summaries.heads(session_ids)

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
        return self.pruner.replace_history(session_id, cut, base_ops, state)

    def import_log(self, info: SessionInfo, events: list[Event], snapshots: Sequence[Snapshot] = ()) -> None:
        """Create the session ``info`` (standing alone) with a checked log, in ONE transaction
        (:func:`saucer.context.transfer.import_session` checks each event first).

        ``events`` are consecutive up to ``info.version``, from 1 or from
        ``info.meta["pruned_to"]`` (a base event). :class:`SessionExistsError` if the id is taken;
        :class:`NotSupportedError` unless the backend declares :attr:`Feature.IMPORT`.
        """
        self.pruner.import_log(info, events, snapshots)

    def record_formats(self, session_id: str) -> tuple[dict[int, int], dict[int, int]]:
        """``({version: format}, {snapshot version: format})`` of this session's *own*
        stored records (damaged ones left out); needs :attr:`Feature.REWRITE`."""
        return self.rewriter.record_formats(session_id)

    def rewrite_events(
        self,
        session_id: str,
        events: Sequence[Event],
        snapshots: Sequence[Snapshot] = (),
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Store ``events`` again (current format) in place of this session's own events at the same versions,
        with ``snapshots`` and its stored ``meta`` if given, in ONE transaction (all or none after a crash; needs
        :attr:`Feature.REWRITE`); the caller promises the same meaning (upcast, or sealed with another key)."""
        self.rewriter.rewrite_events(session_id, events, snapshots, meta)


def new_event(
    session_id: str,
    expected_version: int,
    ops: list[dict[str, Any]],
    author: str,
    round: int | None,
    step: int | None,
    meta: dict[str, Any] | None,
    summary: SummaryDelta | None,
    timestamp: float | None = None,
) -> tuple[Event, bytes]:
    """The event :meth:`EventStore.append` writes, and its meta's JSON as it is stored (``b""`` for none).

    The meta is encoded once, here, where it becomes durable: what a backend could not write is
    :class:`ValueNotStorableError` before anything is sent (a batch of commits shares one
    transaction), and the same text is scanned for secrets (step records carry tool results and
    errors: none in the log). A backend that keeps the JSON (the memory store) is given it
    (:meth:`~saucer.store.recorder.Recorder.note_meta_json`) rather than encode it again.
    """
    if summary is not None and summary.__class__ is not SummaryDelta and not isinstance(summary, SummaryDelta):
        raise TypeError(f"summary must be a SummaryDelta or None, not {type(summary).__name__}")
    if meta:
        meta = dict(meta)
        try:
            encoded = _dumps(meta)
        except TypeError as exc:  # orjson.JSONEncodeError: not JSON data, or nested too deeply
            raise ValueNotStorableError("meta", "", str(exc)) from None
        clean = redact(meta, encoded=encoded)
        if clean is not meta:  # a secret was taken out: the text stored is the clean one's
            meta, encoded = clean, _dumps(clean)
    else:
        meta, encoded = {}, b""
    if summary is not None and summary.reason:
        # a summary's reason is an error's or a refusal's text too (listed by saucer sessions, exported)
        summary = replace(summary, reason=redact_text(summary.reason))
    when = time.time() if timestamp is None else timestamp
    return make_event(session_id, expected_version + 1, when, author, round, step, ops, meta, summary), encoded


def _new_events(session_id: str, expected_version: int, drafts: Sequence[EventDraft]) -> list[Event]:
    """The events of :meth:`EventStore.append_many` (ValueError for none)."""
    if not drafts:
        raise ValueError("append_many needs at least one event")
    return [
        new_event(session_id, expected_version + i, d.ops, d.author, d.round, d.step, d.meta, d.summary, d.timestamp)[0]
        for i, d in enumerate(drafts)
    ]


_dumps = orjson.dumps


def _listed(read: Callable[[str, int], Iterator[Event]], session_id: str, after: int) -> list[Event]:
    return list(read(session_id, after))
