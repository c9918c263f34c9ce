"""A Context's working copy: the committed state it has seen, its changes not committed yet, and where it is bound.

Every collaborator of a :class:`~saucer.context.Context` (the committer, the
snapshotter, the typed access, the queries) works on this one record; each of
its fields is declared here, once. It loads a session's committed state
(:meth:`WorkingCopy.load`, through :func:`~saucer.context.replay.replay`) and
answers the questions they all ask: what a typed name reads as (:meth:`WorkingCopy.get`,
the runtime's hottest call, which ``Context.get`` is bound to), whether it is
writable, what an atomic operation's target holds.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Literal

from saucer.context.events import (
    STATE_MAX_DEPTH,
    State,
    ValueNotStorableError,
    copy_json,
    state_to_wire,
    to_wire,
    unpack,
)
from saucer.context.names import DERIVED_LEDGERS, FLOAT_NAMES, ContextNames, lookup
from saucer.context.replay import Replayed, replay
from saucer.context.staging import Deferred
from saucer.context.types import Json, Op, Target
from saucer.store.base import EventStore
from saucer.store.model import ReadOnlyError

__all__ = ["WorkingCopy", "Durability", "DURABILITIES", "check_text"]

Durability = Literal["step", "strict", "exit"]
DURABILITIES: tuple[Durability, ...] = ("step", "strict", "exit")


# get() (WorkingCopy.get) is the hottest call of the runtime: one dict lookup tells it what a
# name is. kind 0: durable, stored as is; 1: derived from a per-round ledger;
# 2: runtime-only. Works for members and plain strings (a str-valued Enum
# hashes and compares as its value).
_DURABLE, _DERIVED, _RUNTIME = 0, 1, 2
_GET_SPEC: dict[str, tuple[int, str, Any]] = {}
for _m in ContextNames:
    if _m.derived:
        _GET_SPEC[_m.value] = (_DERIVED, DERIVED_LEDGERS[_m.value], _m.default_value)
    elif not _m.durable:
        _GET_SPEC[_m.value] = (_RUNTIME, _m.value, None)
    else:
        _d = _m.default_value
        # Mutable defaults are produced fresh on each read (their type is the factory).
        _GET_SPEC[_m.value] = (_DURABLE, _m.value, _d.__class__ if _d.__class__ in (list, dict) else _d)
del _m, _d


def check_text(value: object, what: str) -> str:
    """A string every store can hold (no NUL, valid Unicode), or TypeError/ValueNotStorableError."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if "\x00" in value:
        raise ValueNotStorableError(what, "", "it contains a NUL character")
    text: str = to_wire(value, what)
    return text


class WorkingCopy:
    """The state a Context works on and the session it is bound to (see the module's docstring)."""

    def __init__(self) -> None:
        #: The materialised durable state: committed, plus the pending operations applied.
        self.state = State()
        #: Runtime-only values (loggers, window handles): never stored.
        self.runtime: dict[str, Any] = {}
        self.store: EventStore | None = None
        self.session_id: str | None = None
        #: The version of the last committed event this Context has seen.
        self.version = 0
        #: The operations made since the last commit.
        self.pending: list[Op] = []
        # The version the pending changes were made on, when a catch_up has moved this
        # Context past it (None: its version), and the keys the re-bases left out since.
        self.pending_base: int | None = None
        self.caught_dropped: list[str] = []
        # len(pending) at the last step boundary: in ``exit`` mode the pending list
        # spans many steps, and only the unfinished one is discarded.
        self.step_mark = 0
        #: Commits made with ``defer=True``, written with the next commit (see :mod:`saucer.context.staging`).
        self.deferred: list[Deferred] = []
        self.durability: Durability = "step"
        #: True for a Context opened ``at=`` a past version.
        self.read_only = False
        self.closed = False
        #: An asynchronous commit is in flight: changes are refused until it ends.
        self.committing = False
        self.lock = threading.RLock()

    # ================================================================= reads

    def get(self, name: ContextNames | str, default: Any = None) -> Any:
        """The value of ``name``; its default when unset (``default`` if that is None).

        Never writes. Containers are returned as copies, so mutating the
        result does not change the Context.
        """
        try:
            kind, key, fallback = _GET_SPEC[name]
        except (KeyError, TypeError):
            raise KeyError(f"unknown context name {name!r}; see ContextNames for the valid names") from None
        if kind == _DURABLE:
            state = self.state
            if key in state.packed:
                self.unpack(key)
            value = state.names.get(key, fallback)
            cls = value.__class__
            if cls is dict or cls is list:
                return copy_json(value)
            if value is list or value is dict:
                return value()
            return default if value is None else value
        if kind == _DERIVED:
            state = self.state
            if key in state.packed:
                self.unpack(key)
            names = state.names
            entries = names.get(key)
            if entries and isinstance(entries, dict):  # not a ledger sealed at rest and read without the key
                value = entries.get(names.get("CURRENT_ROUND_ID", 0))
                if value is not None:
                    return value
            return fallback
        value = self.runtime.get(key)
        return default if value is None else value

    def peek(self, name: ContextNames | str) -> Any:
        """:meth:`get` without the copy: the stored value itself, which the caller must not change
        (for writing a large state out without holding it twice)."""
        kind, key, fallback = _GET_SPEC[name]
        if kind != _DURABLE:
            return self.get(name)
        if key in self.state.packed:
            self.unpack(key)
        value = self.state.names.get(key, fallback)
        if value is list or value is dict:
            return value()
        return value

    # ============================================================ the rest

    def require_store(self) -> tuple[EventStore, str]:
        """The store and session this copy is bound to; RuntimeError for a detached Context."""
        if self.store is None or self.session_id is None:
            raise RuntimeError("this Context is not attached to a store; use Context.open(store, session_id)")
        return self.store, self.session_id

    def load(self, upto: int | None = None) -> Replayed:
        """Load the committed state at ``upto`` (the head when None); drop what is pending. Returns what was loaded."""
        store, sid = self.require_store()
        head = store.head(sid) if upto is None else upto
        loaded = replay(store, sid, head)
        if loaded.version < head and upto is None and not self.read_only:
            # The store skipped a damaged trailing record (with a warning). It
            # keeps its version; have the store mark it as an empty event, so
            # that it stays harmless once newer events follow it.
            store.quarantine_record(sid, head)
        self.state = loaded.state
        self.version = head
        self.pending = []
        self.pending_base, self.caught_dropped = None, []
        self.step_mark = 0
        self.deferred = []
        return loaded

    def check_writable(self) -> None:
        """Raise unless changes may be made now (not read-only, not closed, no commit in flight)."""
        if self.read_only:
            raise ReadOnlyError(
                f"session {self.session_id!r} was opened at version {self.version} for reading; "
                "fork it to write from there"
            )
        if self.closed:
            raise RuntimeError(f"session {self.session_id!r}: this Context is closed")
        if self.committing:
            raise RuntimeError(
                f"session {self.session_id!r}: a commit is in flight (acommit); wait for it before changing the Context"
            )

    def round_id(self) -> int:
        """The current round's id (``CURRENT_ROUND_ID``)."""
        round_id: int = self.state.names.get("CURRENT_ROUND_ID", 0)
        return round_id

    def current(self, target: Target) -> Any:
        """The current value an atomic operation's target holds (None for an unset var)."""
        if "var" in target:
            return self.state.vars.get(target["var"])
        name = target["name"]
        if name in self.state.packed:
            self.unpack(name)
        value = self.state.names.get(name)
        if "path" in target:
            entry = (value or {}).get(target["path"][0])
            if entry is None and name in DERIVED_LEDGERS.values():
                return 0.0 if name in FLOAT_NAMES else 0  # what get(CURRENT_ROUND_*) reads
            return entry
        if value is None:
            return lookup(name).default_value
        return value

    def current_wire(self, target: Target, label: str, depth: int) -> Json:
        """The current value of ``target`` in wire form, as a compare-and-set compares it."""
        return to_wire(self.current(target), label, int_keys=depth, max_depth=STATE_MAX_DEPTH)

    def copy_state(self) -> State:
        """An independent copy of the state (a detached Context's step restores it on error)."""
        state = self.state
        return State(
            names={k: copy_json(v) for k, v in state.names.items()},
            vars=copy_json(state.vars),
            retired=copy_json(state.retired),
            opaque=set(state.opaque),
            packed={k: p.copy() for k, p in state.packed.items()},
            bases={k: p.copy() for k, p in state.bases.items()},
        )

    def unpack(self, name: str) -> None:
        """Decode a value a snapshot packed, now that it is read (see :class:`~saucer.context.events.Packed`)."""
        with self.lock:
            unpack(self.state, name)

    def plain(self) -> dict[str, Json]:
        """Committed durable values as JSON data (names that were written, vars, and retired names)."""
        with self.lock:  # it unpacks packed values
            wire = state_to_wire(self.state)
        return flat_wire(wire)


def flat_wire(wire: Mapping[str, Any]) -> dict[str, Json]:
    """A state's wire form as one flat mapping: names, ``vars.NAME`` and ``retired.NAME``."""
    out = dict(wire["names"])
    out.update({f"vars.{k}": v for k, v in wire["vars"].items()})
    out.update({f"retired.{k}": v for k, v in wire.get("retired", {}).items()})
    return out
