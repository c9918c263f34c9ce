"""The Context: one typed, shared, event-sourced state per session.

``Context()`` is a detached, in-memory Context with UFO's API.
``Context.open(store_or_url, session_id)`` binds it to an event store: every
change becomes an operation; :meth:`Context.commit` writes the pending
operations as one event; opening again replays the latest snapshot plus the
events after it through the same fold that live writes use.

Durability modes:

- ``step`` (default): the engine calls :meth:`Context.commit_step` at each step
  boundary, so a step's changes land together or not at all.
- ``strict``: every change is committed before the call that made it returns.
- ``exit``: changes are committed when the Context is closed.

The class is a composition: one :class:`~saucer.context.working.WorkingCopy` (the
state it works on and where it is bound: every shared field is declared there) and
collaborators with one concern each (typed access, the committer, the snapshotter,
the participants gate, UFO's rest, the history queries; see ``Context.__init__``),
whose API it exposes by explicit delegation. It opens a session, makes the Contexts
of its past (``state_at``, ``fork``), and closes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Self

from saucer.context.access import TypedAccess
from saucer.context.commit import Committer
from saucer.context.compat import ClassOrInstance, RoundValue, UfoCompat
from saucer.context.events import Event, copy_json
from saucer.context.forking import fork
from saucer.context.handle import StoreHandle
from saucer.context.loading import Loader
from saucer.context.names import ContextNames
from saucer.context.opening import attach, check_open_args
from saucer.context.participants import ParticipantGate
from saucer.context.queries import HistoryQueries, changes, history_key
from saucer.context.snapshots import KEEP_SNAPSHOTS, Snapshotter
from saucer.context.types import Change, EventMeta, Json, Key, Op
from saucer.context.working import Durability, WorkingCopy, check_text
from saucer.store.base import EventStore, Lease, SummaryDelta

__all__ = ["Context", "Durability"]


class Context:
    """Typed, shared state of one session, with UFO's Context API and AG2's context vars.

    Read with :meth:`get`, write with :meth:`set` (both take a
    :class:`ContextNames` member or its name). Free-form variables live in
    :attr:`vars` and change through :meth:`update_vars`, :meth:`incr`,
    :meth:`append` and :meth:`compare_and_set`.
    """

    def __init__(self) -> None:
        work = self._work = WorkingCopy()
        self._snapshots = Snapshotter(work)
        self._gate = ParticipantGate()
        self._load = Loader(work, self._snapshots, self._gate)
        self._committer = Committer(work, self._snapshots, self._gate, self._load)
        self._access = TypedAccess(work, self._committer.record)
        self._compat = UfoCompat(work, self._access, self._committer.record)
        self._queries = HistoryQueries(work)
        # Hot calls bound once to their collaborator (the class's methods document them, serve unbound calls).
        self.get = work.get  # type: ignore[method-assign]  # the same signature, bound once
        self.set = self._access.set  # type: ignore[method-assign]  # the same signature, bound once
        self.get_var = self._access.get_var  # type: ignore[method-assign]  # the same signature, bound once
        self.charge = self._compat.charge  # type: ignore[method-assign]  # the same signature, bound once
        self.commit = self._committer.commit  # type: ignore[method-assign]  # the same signature, bound once
        self.acommit = self._committer.acommit  # type: ignore[method-assign]  # the same signature, bound once
        self.commit_step = self._committer.commit_step  # type: ignore[method-assign]  # the same, bound once
        self.acommit_step = self._committer.acommit_step  # type: ignore[method-assign]  # the same, bound once
        # Set when this Context opened the store itself (from a URL): the last of it and its forks closes it.
        self._handle: StoreHandle | None = None
        #: The command dispatcher agents use (runtime only; see :meth:`attach_command_dispatcher`).
        self.command_dispatcher: Any = None  # a dispatch-layer object: this layer may not name its type

    # ================================================================ opening

    @classmethod
    def open(
        cls,
        store: EventStore | str,
        session_id: str,
        *,
        author: str = "system",
        durability: Durability = "step",
        at: int | None = None,
        create: bool = True,
        snapshot_every: int = 100,
        meta: dict[str, Any] | None = None,
        fence: int | None = None,
        keep_snapshots: int = KEEP_SNAPSHOTS,
        serialise: bool = False,
        participants: Iterable[str] | None = None,
        fresh: bool = False,
    ) -> Self:
        """Open (or create) a session's Context in ``store`` (an :class:`EventStore` or a URL).

        ``at=VERSION`` (an int) gives a read-only Context as it was at that
        version; a version that was pruned raises
        :class:`~saucer.store.VersionPrunedError` naming the first readable one.
        ``create=False`` raises :class:`~saucer.store.SessionNotFoundError`
        for an unknown session; a new session's id must follow
        :func:`~saucer.store.base.check_session_id`. ``fence`` is a lease token every commit carries.
        A snapshot is stored every ``snapshot_every`` events (spaced further
        apart for a state over 64 KB, see ``Snapshotter.due``) and on close;
        only the newest ``keep_snapshots`` of the session are kept.
        A store given as a URL is opened for this Context (and its forks) and
        closed with the last of them; a store object stays the caller's.
        ``serialise=True`` makes every commit succeed over concurrent writers:
        its changes are re-based and ordered after theirs in the log, instead
        of raising :class:`~saucer.store.ConflictError` (what the engine's
        steps do: their commands ran, so their record must not be lost).
        ``participants`` declares who may write to a session this call creates (for
        one that exists, a ValueError unless they are those it was made with; see
        :meth:`add_participants`);
        if this Context's first commit to the session it created is refused, the
        empty session is removed again (and made anew by its next commit).
        ``fresh=True``: the caller has just made the session (pass ``create=False``), so it is opened
        empty at version 0 without a read (a writer that came first is met as any concurrent one).
        """
        at = check_open_args(session_id, author, durability, at, snapshot_every, keep_snapshots)
        ctx = cls()
        if isinstance(store, str):
            ctx._handle = StoreHandle.open(store)
            store = ctx._handle.store
        work, committer, snapshots = ctx._work, ctx._committer, ctx._snapshots
        try:
            work.store = store
            committer.creation = attach(store, session_id, at=at, create=create, meta=meta, participants=participants)
            work.session_id, work.read_only, work.durability = session_id, at is not None, durability
            committer.author, committer.fence, committer.serialise = author, fence, bool(serialise)
            snapshots.every, snapshots.keep = snapshot_every, keep_snapshots
            committer.hydrate(0 if fresh else at)
        except BaseException:
            if ctx._handle is not None:
                ctx._handle.release()
            raise
        return ctx

    # ============================================================ properties

    @property
    def session_id(self) -> str | None:
        """The session this Context belongs to (None when detached)."""
        return self._work.session_id

    @property
    def store(self) -> EventStore | None:
        """The event store, or None for a detached Context."""
        return self._work.store

    @property
    def version(self) -> int:
        """The version of the last committed event this Context has seen."""
        return self._work.version

    @property
    def durability(self) -> Durability:
        """``step``, ``strict`` or ``exit``."""
        return self._work.durability

    @property
    def read_only(self) -> bool:
        """True for a Context opened ``at=`` a past version."""
        return self._work.read_only

    @property
    def author(self) -> str:
        """The default author recorded on commits."""
        return self._committer.author

    @author.setter
    def author(self, value: str) -> None:
        self._committer.author = check_text(value, "author")

    @property
    def pending(self) -> list[Op]:
        """The operations made since the last commit (a copy)."""
        pending: list[Op] = copy_json(self._work.pending)
        return pending

    @property
    def serialise(self) -> bool:
        """Whether a commit that meets a concurrent writer is ordered after it instead of failing."""
        return self._committer.serialise

    @serialise.setter
    def serialise(self, value: bool) -> None:
        self._committer.serialise = bool(value)

    @property
    def fence(self) -> int | None:
        """The lease token every commit carries (None when not leased)."""
        return self._committer.fence

    @fence.setter
    def fence(self, token: int | None) -> None:
        self._committer.fence = token

    # ======================================================== typed access

    def get(self, name: ContextNames | str, default: Any = None) -> Any:
        """The value of ``name``; its default when unset (``default`` if that is None).

        Never writes. Containers are returned as copies, so mutating the
        result does not change the Context.
        """
        return self._work.get(name, default)

    def set(self, name: ContextNames | str, value: Any) -> None:
        """Set a typed name; KeyError for an unknown name, TypeError for a wrong type.

        The value is copied and normalised now: changing it afterwards does not
        change the Context, and a value that cannot be stored is refused here
        (:class:`ValueNotStorableError`, naming the key and the path inside it).
        """
        self._access.set(name, value)

    def update_dict(self, name: ContextNames | str | Mapping[Any, Any], value: Mapping[Any, Any] | None = None) -> None:
        """UFO's two forms: ``update_dict(name, {...})`` merges into a dict-valued name;
        ``update_dict({name: value, ...})`` sets several names at once (one change:
        every value is checked before any is written)."""
        self._access.update_dict(name, value)

    @property
    def vars(self) -> Mapping[str, Json]:
        """The free-form context variables (a read-only copy)."""
        return self._access.vars()

    @property
    def retired(self) -> Mapping[str, Json]:
        """Values of names retired since this session stored them (a read-only copy, wire form).

        See :data:`~saucer.context.names.RETIRED`: they stay readable in
        history and time travel, and are no longer part of the typed state.
        """
        return self._access.retired()

    @property
    def encrypted(self) -> frozenset[str]:
        """Targets (``REQUEST``, ``vars.api_key``) encrypted at rest that were read without
        the store key: they read as ``"<encrypted>"`` (see :mod:`saucer.store.crypto`)."""
        return self._access.encrypted()

    def get_var(self, key: str, default: Any = None) -> Any:
        """One context variable, or ``default`` when it is not set (a typed name's string is a
        TypeError: see :func:`~saucer.context.names.typed_name`; read it with :meth:`get`)."""
        return self._access.get_var(key, default)

    def update_vars(self, set: Mapping[str, Any] | None = None, delete: list[str] | tuple[str, ...] = ()) -> None:
        """Delete then set context variables, as one change."""
        self._access.update_vars(set, delete)

    def delete_var(self, key: str) -> None:
        """Delete one context variable (no error if it is not set)."""
        self._access.update_vars(delete=[key])

    def incr(self, key: ContextNames | str, by: int | float = 1) -> int | float:
        """Atomically add ``by`` to a number (a var, or a numeric typed name); return the new value.

        Increments re-base onto concurrent writers at commit, so none is lost.
        """
        return self._access.incr(key, by)

    def append(self, key: ContextNames | str, value: Any) -> None:
        """Atomically append ``value`` to a list (a var, or a list-valued typed name)."""
        self._access.append(key, value)

    def compare_and_set(self, key: ContextNames | str, expected: Any, new: Any) -> bool:
        """Set ``key`` to ``new`` only if it currently equals ``expected``; return whether it did.

        The check is repeated against the newest version if another writer
        committed first; if it no longer holds, :meth:`commit` raises ConflictError.
        """
        return self._access.compare_and_set(key, expected, new)

    @property
    def participants(self) -> frozenset[str] | None:
        """Who may write to this session: those it was made with and those added since;
        None when it declares none (every writer may). The session's runner always may."""
        return self._access.participants()

    def add_participants(self, *names: str) -> None:
        """Let ``names`` write to this session too, from this Context's next commit on (an
        atomic append to the context variable ``saucer.participants``, committed like any
        change, by a participant: the commit of a non-participant is refused).

        A session that declares no participants is open to every writer already:
        adding to it is a ValueError (declare them when it is made).
        """
        self._access.add_participants(*names)

    # ---------------------------------------------- UFO's derived properties

    current_round_step = RoundValue[int](
        ContextNames.CURRENT_ROUND_STEP, "Steps taken in the current round (``ROUND_STEP[CURRENT_ROUND_ID]``)."
    )
    current_round_cost = RoundValue[float](
        ContextNames.CURRENT_ROUND_COST, "Cost of the current round (``ROUND_COST[CURRENT_ROUND_ID]``)."
    )
    current_round_subtask_amount = RoundValue[int](
        ContextNames.CURRENT_ROUND_SUBTASK_AMOUNT,
        "Subtasks finished in the current round (``ROUND_SUBTASK_AMOUNT[CURRENT_ROUND_ID]``).",
    )

    # --------------------------------------------------------- UFO's rest

    def add_to_structural_logs(self, data: Mapping[str, Any]) -> None:
        """Append ``data`` under ``STRUCTURAL_LOGS[data["Round"]][data["SubtaskIndex"]]``.

        Ignored when either key is missing, as in UFO.
        """
        self._compat.add_to_structural_logs(data)

    def filter_structural_logs(self, round_key: int, subtask_key: int, keys: str | list[str]) -> list[Any]:
        """Values of ``keys`` (a str gives a list of values, a list gives a list of dicts)."""
        return self._compat.filter_structural_logs(round_key, subtask_key, keys)

    def charge(self, increments: Mapping[Key, int | float], structural_log: Mapping[str, Any] | None = None) -> None:
        """A step's ledger as ONE change: add each ``by`` of ``increments`` (``{name or var: by}``)
        as :meth:`incr` does, and append ``structural_log`` as :meth:`add_to_structural_logs`
        does; everything is checked before anything is applied (the engine charges each step so)."""
        self._compat.charge(increments, structural_log)

    def attach_command_dispatcher(self, dispatcher: Any) -> None:
        """Make ``dispatcher`` available to agents as ``context.command_dispatcher`` (runtime only)."""
        self.command_dispatcher = dispatcher

    def to_dict(
        self, ensure_serializable: bool = False, *, copy: bool = True, stored_json: bool = False
    ) -> dict[str, Any]:
        """Every name's value (and ``_vars`` when there are context variables).

        With ``ensure_serializable=True`` runtime-only names are None and one warning lists
        those that held an object. With ``copy=False`` the values are the Context's own, not
        copies: for writing them out at once (``saucer export`` of a long session would otherwise
        hold its state twice); changing them would change the Context behind its back. With
        ``stored_json=True`` a large value that the snapshot read stores whole, unchanged since,
        is its compact JSON text (:class:`~saucer.context.events.StoredJson`), never decoded.
        """
        return self._compat.to_dict(ensure_serializable, copy=copy, stored_json=stored_json)

    @ClassOrInstance
    def from_dict(self, data: Mapping[str, Any]) -> Context:
        """Load :meth:`to_dict` output (or its JSON round trip): ``Context.from_dict(d)`` gives
        a new detached Context; ``ctx.from_dict(d)`` (UFO's form) loads into ``ctx`` and returns it.

        The names present are set (a None value is skipped), context variables (``_vars``)
        too, as one change on a Context bound to a store. A key that is neither a
        :class:`ContextNames` name nor ``_vars`` is skipped with one warning naming them all,
        as UFO skips it (not a KeyError).
        """
        self._compat.from_dict(data)
        return self

    def _sync_round_values(self) -> None:
        """UFO's copy of the current round's values into ``CURRENT_ROUND_*``: a documented no-op here,
        as those are derived from the per-round ledgers when read (reads never write), always in sync."""

    # ============================================================== commits

    def commit(
        self,
        *,
        author: str | None = None,
        round: int | None = None,
        step: int | None = None,
        meta: EventMeta | None = None,
        summary: SummaryDelta | None = None,
    ) -> int:
        """Write the pending changes as ONE event; return the new version.

        If another writer committed first, a batch of only atomic operations is re-based onto
        the newest version and retried; any other batch raises :class:`~saucer.store.ConflictError`
        naming the keys the other writers changed (call :meth:`reload`), unless this Context
        serialises its commits (``Context.open(..., serialise=True)``): then the whole batch is
        ordered after theirs, as ``meta["serialised"]`` records (a :class:`~saucer.context.types.SerialisedRecord`).
        Any other store failure leaves the changes pending (the error says so): the Context stays
        usable, and its next commit tries again (after a commit whose outcome is unknown, it first
        checks whether they were written).
        """
        return self._committer.commit(author=author, round=round, step=step, meta=meta, summary=summary)

    async def acommit(
        self,
        *,
        author: str | None = None,
        round: int | None = None,
        step: int | None = None,
        meta: EventMeta | None = None,
        summary: SummaryDelta | None = None,
    ) -> int:
        """:meth:`commit` for coroutines: the same event, durable when it returns.

        The commits of the sessions of one event loop that are made at the same
        time share one transaction and fsync (see ``saucer.store``), without a
        thread per session; the engine commits its steps this way. The Context
        refuses changes while the commit is in flight. If the awaiting task is
        cancelled, the changes are either still pending (nothing was written)
        or committed, as the Context's version then says.
        """
        return await self._committer.acommit(author=author, round=round, step=step, meta=meta, summary=summary)

    def commit_step(
        self,
        *,
        author: str | None = None,
        round: int | None = None,
        step: int | None = None,
        meta: EventMeta | None = None,
        summary: SummaryDelta | None = None,
    ) -> int:
        """Commit at a step boundary unless durability is ``exit`` (then changes wait for close)."""
        return self._committer.commit_step(author=author, round=round, step=step, meta=meta, summary=summary)

    def acommit_step(
        self,
        *,
        author: str | None = None,
        round: int | None = None,
        step: int | None = None,
        meta: EventMeta | None = None,
        summary: SummaryDelta | None = None,
        defer: bool = False,
    ) -> Awaitable[int]:
        """:meth:`commit_step` for coroutines (see :meth:`acommit`): ``await ctx.acommit_step(...)``;
        with ``defer``, written with the next commit, in one transaction (:mod:`saucer.context.staging`)."""
        return self._committer.acommit_step(
            author=author, round=round, step=step, meta=meta, summary=summary, defer=defer
        )

    def catch_up(self) -> int:
        """Bring in what other writers committed since this Context's version; return how many versions.

        For a Context that serialises its commits (the engine's): its pending changes stay on top,
        re-based as a serialised commit re-bases them, so that what it decides next (a transition
        of the graph) sees an out-of-turn write made while its step ran; their commit records it
        (``meta["serialised"]``). A no-op (0) for any other Context, and while a commit of unknown outcome is unsettled.
        """
        return self._committer.catch_up()

    @contextmanager
    def step(
        self,
        *,
        author: str | None = None,
        round: int | None = None,
        step: int | None = None,
        meta: EventMeta | None = None,
        summary: SummaryDelta | None = None,
    ) -> Iterator[Self]:
        """Group changes into one atomic step: committed together on success, discarded on error.

        With durability ``exit`` a successful step stays pending until close;
        ``strict`` commits each change as it is made, so there is nothing left
        to discard when the step fails.
        """
        with self._committer.step(author=author, round=round, step=step, meta=meta, summary=summary):
            yield self

    def rollback(self) -> None:
        """Discard uncommitted changes and return to the last committed state (deferred commits kept)."""
        self._committer.rollback()

    def reload(self) -> None:
        """Discard uncommitted changes and load the newest committed version."""
        work = self._work
        with work.lock:
            self._committer.hydrate(work.version if work.read_only else None)

    def snapshot(self, *, whole: bool = False) -> int:
        """Store a snapshot of the committed state now; return its version.

        ``whole`` writes each packed value whole, without the operations since its base: what
        :meth:`close` stores, so that reading a finished session folds no tails. Only the newest
        ``keep_snapshots`` are kept (see :meth:`~saucer.context.snapshots.Snapshotter.snapshot`).
        """
        return self._snapshots.snapshot(whole=whole)

    # =============================================================== history

    def history(self, key: ContextNames | str | None = None) -> list[Event]:
        """Committed events (of the whole lineage), or those touching ``key``.

        ``key`` is a :class:`ContextNames` member or name, ``vars.NAME`` or a
        context variable's name. Each event names its author, round and step.
        A pruned session's history starts at its first readable version, with
        the *base* event that sets the whole state then (author ``system``,
        ``meta["pruned"]``).
        """
        return self._queries.history(key)

    @staticmethod
    def history_key(key: ContextNames | str) -> str:
        """The key events use for ``key``: a name (a derived name's ledger) or ``vars.NAME``."""
        return history_key(key)

    def state_at(self, version: int) -> Self:
        """A read-only Context of this session as it was at ``version`` (an int).

        :class:`~saucer.store.VersionPrunedError` when that version was pruned
        (it names the first readable one), never an empty or partial state.
        """
        store, sid = self._work.require_store()
        return self.open(store, sid, at=version)

    def diff(self, v1: int, v2: int) -> dict[str, Change]:
        """Keys whose values differ between two versions: ``{key: {"before": a, "after": b}}``.

        Context variables appear as ``vars.NAME``; a missing variable is None, and
        a name not written yet has its default, as ``state`` shows it at that version.
        Both versions must be readable (see :meth:`state_at`).
        """
        return changes(self.state_at(v1)._plain(), self.state_at(v2)._plain())

    def change_at(self, version: int) -> dict[str, Change]:
        """What the event at ``version`` changed: :meth:`diff` of ``version - 1`` and ``version``,
        from one hydrate (the state before, and that event's operations put through the one fold)."""
        return self._queries.change_at(version)

    def fork(self, new_session_id: str, at: int | None = None, *, author: str | None = None) -> Self:
        """A writable Context for a new session starting from this one's state at ``at``.

        The new session references this session's log up to ``at``; nothing is
        copied (until this session is pruned: then the fork gets its own copy
        first). A version that was pruned cannot be forked
        (:class:`~saucer.store.VersionPrunedError`).
        """
        return fork(self, self.open, new_session_id, at, author)

    async def watch(self, *, interval: float = 0.2) -> AsyncIterator[Event]:
        """Yield events committed to this session after this Context's version (by anyone)."""
        async for event in self._queries.watch(interval=interval):
            yield event

    def _plain(self) -> dict[str, Json]:
        """Committed durable values as JSON data (names that were written, vars, and retired names)."""
        return self._work.plain()

    # ================================================================ closing

    def close(self, *, release: Lease | None = None) -> bool:
        """Commit what is pending, snapshot if there is new history (every packed value whole), release the store if
        owned. ``release``: a lease on the session given back with that snapshot, in one round trip; True if it was."""
        work = self._work
        if work.closed:
            return False
        try:
            if work.store is not None and not work.read_only:
                return self._committer.finish(release)
            return False
        finally:
            work.closed = True
            handle, self._handle = self._handle, None
            if handle is not None:
                handle.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    def abort(self) -> None:
        """Discard the unfinished step, then :meth:`close` (with ``exit``, the steps finished before
        it are still committed). What leaving a ``with`` block on an exception does."""
        work = self._work
        if work.store is not None and not work.read_only and not work.closed:
            self._committer.abandon_step()
        self.close()

    def __repr__(self) -> str:
        work = self._work
        where = f"{work.session_id!r}@{work.version}" if work.session_id else "detached"
        return f"<Context {where} pending={len(work.pending)} durability={work.durability}>"
