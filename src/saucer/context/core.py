"""What every part of a Context shares: its fields, how it opens, and how it loads.

A :class:`~saucer.context.Context` is assembled from a few classes, one
concern each (see :mod:`saucer.context.context`). This one holds the state
they all work on: the materialised :class:`~saucer.context.events.State`, the
runtime-only values, the store and session it is bound to, the version it has
seen, the operations not yet committed, and the snapshot bookkeeping. It opens
a session (:meth:`ContextCore.open`) and loads its committed state
(:meth:`ContextCore._hydrate`, through :func:`~saucer.context.replay.replay`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any, Literal, Self

from saucer.context.events import (
    STATE_MAX_DEPTH,
    Event,
    State,
    ValueNotStorableError,
    copy_json,
    state_to_wire,
    to_wire,
    unpack,
)
from saucer.context.handle import StoreHandle
from saucer.context.names import DERIVED_LEDGERS, FLOAT_NAMES, lookup
from saucer.context.replay import replay
from saucer.store.base import EventStore
from saucer.store.model import ReadOnlyError, SessionExistsError, check_session_id, check_version

__all__ = ["ContextCore", "Durability", "DURABILITIES", "KEEP_SNAPSHOTS", "PARTICIPANTS_VAR", "check_text"]

Durability = Literal["step", "strict", "exit"]
DURABILITIES: tuple[Durability, ...] = ("step", "strict", "exit")
#: Snapshots kept per session: the newest, and one to fall back on if it is damaged.
KEEP_SNAPSHOTS = 2
#: The context variable listing the participants added to a session since it was made
#: (:meth:`~saucer.context.Context.add_participants`); those it was made with are
#: :attr:`saucer.store.SessionInfo.participants`.
PARTICIPANTS_VAR = "saucer.participants"


def check_text(value: Any, what: str) -> str:
    """A string every store can hold (no NUL, valid Unicode), or TypeError/ValueNotStorableError."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if "\x00" in value:
        raise ValueNotStorableError(what, "", "it contains a NUL character")
    return to_wire(value, what)


class ContextCore:
    """The fields of a Context, opening a session and loading its committed state."""

    command_dispatcher: Any

    def __init__(self) -> None:
        self._state = State()
        self._runtime: dict[str, Any] = {}
        self._store: EventStore | None = None
        # Set when this Context opened the store itself (from a URL): it closes it.
        self._handle: StoreHandle | None = None
        self._session_id: str | None = None
        self._version = 0
        self._snapshot_version = 0
        self._snapshot_every = 100
        self._snapshot_bytes = 0
        # Whether the newest snapshot this Context wrote has packed values with tails
        # (close() then writes one whole, see Snapshots.snapshot).
        self._snapshot_tails = False
        self._tail_ops = 0
        self._keep_snapshots = KEEP_SNAPSHOTS
        self._pending: list[dict[str, Any]] = []
        # The version the pending changes were made on, when a catch_up has moved this
        # Context past it (None: its version), and the keys the re-bases left out since.
        self._pending_base: int | None = None
        self._caught_dropped: list[str] = []
        # len(self._pending) at the last step boundary: in ``exit`` mode the
        # pending list spans many steps, and only the unfinished one is discarded.
        self._step_mark = 0
        self._author = "system"
        self._durability: Durability = "step"
        self._read_only = False
        # Conflicts re-base the whole batch after the other writers instead of failing (see commit.py).
        self._serialise = False
        self._fence: int | None = None
        self._lock = threading.RLock()
        self._closed = False
        self._committing = False
        # The event of a commit whose outcome is unknown (the connection broke):
        # the next commit adopts it if the store has it, instead of writing it twice.
        self._unknown: Event | None = None
        # Participants: those the session was made with (read once, on the first commit
        # that needs them; None: it declared none) and, as committed, those added since.
        self._declared: frozenset[str] | None = None
        self._declared_read = False
        self._added: Any = None
        # Set when this Context made its session: how, so that a first commit that is
        # refused leaves no empty session behind (see Durable._drop_if_empty).
        self._creation: dict[str, Any] | None = None
        self.command_dispatcher = None

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
    ) -> Self:
        """Open (or create) a session's Context in ``store`` (an :class:`EventStore` or a URL).

        ``at=VERSION`` (an int) gives a read-only Context as it was at that
        version; a version that was pruned raises
        :class:`~saucer.store.VersionPrunedError` naming the first readable one.
        ``create=False`` raises :class:`~saucer.store.SessionNotFoundError`
        for an unknown session; a new session's id must follow
        :func:`~saucer.store.base.check_session_id`. ``fence`` is a lease token every commit carries.
        A snapshot is stored every ``snapshot_every`` events (spaced further
        apart for a state over 64 KB, see ``_snapshot_due``) and on close;
        only the newest ``keep_snapshots`` of the session are kept.
        A store given as a URL is opened for this Context (and its forks) and
        closed with the last of them; a store object stays the caller's.
        ``serialise=True`` makes every commit succeed over concurrent writers:
        its changes are re-based and ordered after theirs in the log, instead
        of raising :class:`~saucer.store.ConflictError` (what the engine's
        steps do: their commands ran, so their record must not be lost).
        ``participants`` declares who may write to a session this call creates (for
        one that exists, a ValueError unless they are those it was made with; see
        :meth:`~saucer.context.Context.add_participants`);
        if this Context's first commit to the session it created is refused, the
        empty session is removed again (and made anew by its next commit).
        """
        if durability not in DURABILITIES:
            raise ValueError(f"durability must be one of {', '.join(DURABILITIES)}, not {durability!r}")
        if not isinstance(snapshot_every, int) or snapshot_every < 1:
            raise ValueError(f"snapshot_every must be an int >= 1, not {snapshot_every!r}")
        if not isinstance(keep_snapshots, int) or keep_snapshots < 1:
            raise ValueError(f"keep_snapshots must be an int >= 1, not {keep_snapshots!r}")
        if at is not None:
            at = check_version(at, "at")
        if not isinstance(session_id, str):
            check_session_id(session_id)  # raises
        check_text(author, "author")
        ctx = cls()
        if isinstance(store, str):
            ctx._handle = StoreHandle.open(store)
            ctx._store = ctx._handle.store
        else:
            ctx._store = store
        try:
            ctx._attach(ctx._store, session_id, at=at, create=create, meta=meta, participants=participants)
            ctx._author = author
            ctx._durability = durability
            ctx._snapshot_every = snapshot_every
            ctx._keep_snapshots = keep_snapshots
            ctx._fence = fence
            ctx._serialise = bool(serialise)
            ctx._hydrate(at)
        except BaseException:
            if ctx._handle is not None:
                ctx._handle.release()
            raise
        return ctx

    def _attach(
        self,
        store: EventStore,
        session_id: str,
        *,
        at: int | None,
        create: bool,
        meta: dict[str, Any] | None,
        participants: Iterable[str] | None = None,
    ) -> None:
        """Bind to ``session_id`` in ``store``, creating it unless ``create`` is False or ``at`` is given."""
        if not store.exists(session_id):
            if at is not None or not create:
                store.session_info(session_id)  # raises SessionNotFoundError
            creation = {"meta": meta, "participants": None if participants is None else list(participants)}
            try:
                store.create_session(session_id, **creation)
                self._creation = creation
            except SessionExistsError:
                pass  # another writer created it just now: open theirs
        if participants is not None and self._creation is None:
            declared = store.session_info_without_plan(session_id)[0].participants
            if declared != frozenset(participants):
                raise ValueError(
                    f"session {session_id!r} exists, and its participants were declared when it was made; "
                    "a participant adds others with Context.add_participants"
                )
        self._session_id = session_id
        if at is not None:
            store.check_readable(session_id, at)
            self._read_only = True

    def _hydrate(self, upto: int | None = None) -> None:
        """Load the committed state at ``upto`` (the head when None); drop what is pending."""
        store, sid = self._require_store()
        head = store.head(sid) if upto is None else upto
        loaded = replay(store, sid, head)
        if loaded.version < head and upto is None and not self._read_only:
            # The store skipped a damaged trailing record (with a warning). It
            # keeps its version; have the store mark it as an empty event, so
            # that it stays harmless once newer events follow it.
            store.quarantine_record(sid, head)
        self._state = loaded.state
        self._snapshot_version = loaded.snapshot_version
        # Known without decoding anything for a snapshot with packed values: roughly what the
        # next snapshot writes again, which the spacing weighs the tail against.
        self._snapshot_bytes = sum(len(p.data) + sum(map(len, p.tails)) for p in loaded.state.packed.values())
        self._tail_ops = head - loaded.snapshot_version
        self._version = head
        self._pending = []
        self._pending_base, self._caught_dropped = None, []
        self._step_mark = 0
        self._unknown = None
        self._added = copy_json(loaded.state.vars.get(PARTICIPANTS_VAR))

    def _require_store(self) -> tuple[EventStore, str]:
        if self._store is None or self._session_id is None:
            raise RuntimeError("this Context is not attached to a store; use Context.open(store, session_id)")
        return self._store, self._session_id

    # ============================================================ properties

    @property
    def session_id(self) -> str | None:
        """The session this Context belongs to (None when detached)."""
        return self._session_id

    @property
    def store(self) -> EventStore | None:
        """The event store, or None for a detached Context."""
        return self._store

    @property
    def version(self) -> int:
        """The version of the last committed event this Context has seen."""
        return self._version

    @property
    def durability(self) -> Durability:
        """``step``, ``strict`` or ``exit``."""
        return self._durability

    @property
    def read_only(self) -> bool:
        """True for a Context opened ``at=`` a past version."""
        return self._read_only

    @property
    def author(self) -> str:
        """The default author recorded on commits."""
        return self._author

    @author.setter
    def author(self, value: str) -> None:
        self._author = check_text(value, "author")

    @property
    def pending(self) -> list[dict[str, Any]]:
        """The operations made since the last commit (a copy)."""
        return copy_json(self._pending)

    @property
    def serialise(self) -> bool:
        """Whether a commit that meets a concurrent writer is ordered after it instead of failing."""
        return self._serialise

    @serialise.setter
    def serialise(self, value: bool) -> None:
        self._serialise = bool(value)

    @property
    def fence(self) -> int | None:
        """The lease token every commit carries (None when not leased)."""
        return self._fence

    @fence.setter
    def fence(self, token: int | None) -> None:
        self._fence = token

    # ========================================================= shared helpers

    def _check_writable(self) -> None:
        if self._read_only:
            raise ReadOnlyError(
                f"session {self._session_id!r} was opened at version {self._version} for reading; "
                "fork it to write from there"
            )
        if self._closed:
            raise RuntimeError(f"session {self._session_id!r}: this Context is closed")
        if self._committing:
            raise RuntimeError(
                f"session {self._session_id!r}: a commit is in flight (acommit); wait for it before changing the Context"
            )

    def _round_id(self) -> int:
        return self._state.names.get("CURRENT_ROUND_ID", 0)

    def _current(self, target: Mapping[str, Any]) -> Any:
        """The current value an atomic operation's target holds (None for an unset var)."""
        if "var" in target:
            return self._state.vars.get(target["var"])
        name = target["name"]
        if name in self._state.packed:
            self._unpack(name)
        value = self._state.names.get(name)
        if "path" in target:
            entry = (value or {}).get(target["path"][0])
            if entry is None and name in DERIVED_LEDGERS.values():
                return 0.0 if name in FLOAT_NAMES else 0  # what get(CURRENT_ROUND_*) reads
            return entry
        if value is None:
            return lookup(name).default_value
        return value

    def _current_wire(self, target: Mapping[str, Any], label: str, depth: int) -> Any:
        """The current value of ``target`` in wire form, as a compare-and-set compares it."""
        return to_wire(self._current(target), label, int_keys=depth, max_depth=STATE_MAX_DEPTH)

    def _copy_state(self) -> State:
        return State(
            names={k: copy_json(v) for k, v in self._state.names.items()},
            vars=copy_json(self._state.vars),
            retired=copy_json(self._state.retired),
            opaque=set(self._state.opaque),
            packed={k: p.copy() for k, p in self._state.packed.items()},
            bases={k: p.copy() for k, p in self._state.bases.items()},
        )

    def _unpack(self, name: str) -> None:
        """Decode a value a snapshot packed, now that it is read (see :class:`~saucer.context.events.Packed`)."""
        with self._lock:
            unpack(self._state, name)

    def _plain(self) -> dict[str, Any]:
        """Committed durable values as JSON data (names that were written, vars, and retired names)."""
        with self._lock:  # it unpacks packed values
            wire = state_to_wire(self._state)
        out = dict(wire["names"])
        out.update({f"vars.{k}": v for k, v in wire["vars"].items()})
        out.update({f"retired.{k}": v for k, v in wire.get("retired", {}).items()})
        return out
