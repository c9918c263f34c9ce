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
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import replace
from types import MappingProxyType
from typing import Any, AsyncIterator, Iterator, Literal, Mapping

import orjson

from saucer.context.events import (
    ATOMIC_OPS,
    STATE_MAX_DEPTH,
    Event,
    State,
    ValueNotStorableError,
    apply_ops,
    copy_json,
    op_key,
    state_from_wire,
    state_to_wire,
    to_wire,
)
from saucer.context.names import DERIVED_LEDGERS, ContextNames
from saucer.store.base import (
    ConflictError,
    CorruptRecordError,
    EventStore,
    OutcomeUnknownError,
    ReadOnlyError,
    SessionExistsError,
    Snapshot,
    StoreError,
    check_session_id,
    check_version,
)

__all__ = ["Context", "Durability"]

Durability = Literal["step", "strict", "exit"]
_DURABILITIES = ("step", "strict", "exit")
_BY_KEY: dict[str, ContextNames] = {m.value: m for m in ContextNames}
_MISSING: Any = object()
_NUMBER_NAMES = frozenset(m.value for m in ContextNames if m.type in (int, float))
_LIST_NAMES = frozenset(m.value for m in ContextNames if m.type is list)
_DICT_NAMES = frozenset(
    m.value for m in ContextNames if m.type is dict or getattr(m.type, "__origin__", None) is dict
)
_INT_NAMES = frozenset(m.value for m in ContextNames if m.type is int or m.type == dict[int, int])
_FLOAT_NAMES = frozenset(m.value for m in ContextNames if m.type is float or m.type in (dict[int, float], dict[int, float | None]))
#: Snapshots up to this size are taken every ``snapshot_every`` events, whatever the tail.
_SMALL_SNAPSHOT = 64 * 1024
#: Rough stored size of one operation, to weigh a tail against a snapshot.
_OP_BYTES = 64
#: How many times commit() re-bases an atomic-only batch before giving up.
_MAX_REBASES = 200
#: Snapshots kept per session: the newest, and one to fall back on if it is damaged.
_KEEP_SNAPSHOTS = 2

# get() is the hottest call of the runtime: one dict lookup tells it what a
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
del _m


_REFS_LOCK = threading.Lock()


def _retain(store: EventStore) -> None:
    """Count one more Context owning ``store`` (opened from a URL, shared with its forks)."""
    with _REFS_LOCK:
        store.__dict__["_context_refs"] = store.__dict__.get("_context_refs", 0) + 1


def _release(store: EventStore) -> None:
    """One owner fewer; the last one closes the store."""
    with _REFS_LOCK:
        left = store.__dict__.get("_context_refs", 1) - 1
        store.__dict__["_context_refs"] = left
    if left <= 0:
        store.close()


def _member(name: Any) -> ContextNames:
    try:
        return _BY_KEY[name]
    except (KeyError, TypeError):
        raise KeyError(f"unknown context name {name!r}; see ContextNames for the valid names") from None


def _check_text(value: Any, what: str) -> str:
    """A string every store can hold (no NUL, valid Unicode), or TypeError/ValueNotStorableError."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if "\x00" in value:
        raise ValueNotStorableError(what, "", "it contains a NUL character")
    return to_wire(value, what)


def _check_commit_args(author: str, round: Any, step: Any, meta: dict[str, Any] | None) -> None:
    """Refuse, before anything is sent, what a store could not write for a commit."""
    _check_text(author, "author")
    for what, value in (("round", round), ("step", step)):
        if value is not None:
            check_version(value, what)
            to_wire(value, what)  # a 64-bit integer
    if meta:
        try:
            orjson.dumps(meta)  # how the stores encode it
        except orjson.JSONEncodeError as exc:
            raise ValueNotStorableError("meta", "", str(exc)) from None


def _keep_pending(exc: StoreError, count: int) -> None:
    """Say, in the store's error, what happened to the pending changes (they are kept)."""
    if isinstance(exc, OutcomeUnknownError):
        note = f"this Context keeps its {count} changes pending, and its next commit() writes them only if they were not"
    else:
        note = f"this Context keeps its {count} changes pending: commit() again, or rollback() to drop them"
    exc.args = (f"{exc}; {note}",) + exc.args[1:]


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


class Context:
    """Typed, shared state of one session, with UFO's Context API and AG2's context vars.

    Read with :meth:`get`, write with :meth:`set` (both take a
    :class:`ContextNames` member or its name). Free-form variables live in
    :attr:`vars` and change through :meth:`update_vars`, :meth:`incr`,
    :meth:`append` and :meth:`compare_and_set`.
    """

    command_dispatcher: Any

    def __init__(self) -> None:
        self._state = State()
        self._runtime: dict[str, Any] = {}
        self._store: EventStore | None = None
        self._owns_store = False
        self._session_id: str | None = None
        self._version = 0
        self._snapshot_version = 0
        self._snapshot_every = 100
        self._snapshot_bytes = 0
        self._tail_ops = 0
        self._keep_snapshots = _KEEP_SNAPSHOTS
        self._pending: list[dict[str, Any]] = []
        # len(self._pending) at the last step boundary: in ``exit`` mode the
        # pending list spans many steps, and only the unfinished one is discarded.
        self._step_mark = 0
        self._batching = 0
        self._author = "system"
        self._durability: Durability = "step"
        self._read_only = False
        self._fence: int | None = None
        self._lock = threading.RLock()
        self._closed = False
        self._committing = False
        # The event of a commit whose outcome is unknown (the connection broke):
        # the next commit adopts it if the store has it, instead of writing it twice.
        self._unknown: Event | None = None
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
        keep_snapshots: int = _KEEP_SNAPSHOTS,
    ) -> "Context":
        """Open (or create) a session's Context in ``store`` (an :class:`EventStore` or a URL).

        ``at=VERSION`` (an int) gives a read-only Context as it was at that
        version; a version that was pruned raises
        :class:`~saucer.store.VersionPrunedError` naming the first readable one.
        ``create=False`` raises :class:`~saucer.store.SessionNotFoundError`
        for an unknown session; a new session's id must follow
        :func:`~saucer.store.base.check_session_id`. ``fence`` is a lease token every commit carries.
        A snapshot is stored every ``snapshot_every`` events (spaced further
        apart for a state over 64 KB, see :meth:`_snapshot_due`) and on close;
        only the newest ``keep_snapshots`` of the session are kept.
        """
        if durability not in _DURABILITIES:
            raise ValueError(f"durability must be one of {', '.join(_DURABILITIES)}, not {durability!r}")
        if not isinstance(snapshot_every, int) or snapshot_every < 1:
            raise ValueError(f"snapshot_every must be an int >= 1, not {snapshot_every!r}")
        if not isinstance(keep_snapshots, int) or keep_snapshots < 1:
            raise ValueError(f"keep_snapshots must be an int >= 1, not {keep_snapshots!r}")
        if at is not None:
            at = check_version(at, "at")
        if not isinstance(session_id, str):
            check_session_id(session_id)  # raises
        _check_text(author, "author")
        ctx = cls()
        if isinstance(store, str):
            from saucer.store import open_store

            ctx._store = open_store(store)
            ctx._owns_store = True
            _retain(ctx._store)
        else:
            ctx._store = store
        try:
            if not ctx._store.exists(session_id):
                if at is not None or not create:
                    ctx._store.session_info(session_id)  # raises SessionNotFoundError
                try:
                    ctx._store.create_session(session_id, meta=meta)
                except SessionExistsError:
                    pass  # another writer created it just now: open theirs
            ctx._session_id = session_id
            ctx._author = author
            ctx._durability = durability
            ctx._snapshot_every = snapshot_every
            ctx._keep_snapshots = keep_snapshots
            ctx._fence = fence
            if at is not None:
                ctx._store.check_readable(session_id, at)
                ctx._read_only = True
            ctx._hydrate(at)
        except BaseException:
            if ctx._owns_store:
                _release(ctx._store)
            raise
        return ctx

    def _hydrate(self, upto: int | None = None) -> None:
        """Load the committed state at ``upto`` (the head when None): the newest
        usable snapshot, then the events after it, through the one fold."""
        store, sid = self._require_store()
        head = store.head(sid) if upto is None else upto
        snap = store.latest_snapshot(sid, head)
        state: State | None = None
        if snap is not None:
            try:
                state = state_from_wire(snap.state)
            except Exception as exc:  # a snapshot is a cache: fall back to the log
                warnings.warn(
                    f"session {sid!r}: ignoring unusable snapshot at version {snap.version} ({exc!r})",
                    RuntimeWarning,
                    stacklevel=3,
                )
                snap = None
        if state is None:
            state = State()
        base = snap.version if snap else 0
        seen = base
        events = list(store.read(sid, base, head))
        if events and events[0].version != base + 1:
            state = State()  # pruned past the snapshot meanwhile: the log starts with a base event that sets everything
        for event in events:
            try:
                apply_ops(state, event.ops)
            except Exception as exc:
                raise CorruptRecordError(event.session_id, event.version, f"cannot apply its operations: {exc!r}") from None
            seen = event.version
        if seen < head:
            store.check_readable(sid, head)  # pruned meanwhile: VersionPrunedError, never a partial state
        if seen < head and upto is None and not self._read_only:
            # The store skipped a damaged trailing record (with a warning). It
            # keeps its version; have the store mark it as an empty event, so
            # that it stays harmless once newer events follow it.
            store.quarantine_record(sid, head)
        self._state = state
        self._snapshot_version = base
        self._snapshot_bytes = 0
        self._tail_ops = head - base
        self._version = head
        self._pending = []
        self._step_mark = 0
        self._unknown = None

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
        self._author = _check_text(value, "author")

    @property
    def pending(self) -> list[dict[str, Any]]:
        """The operations made since the last commit (a copy)."""
        return copy_json(self._pending)

    @property
    def fence(self) -> int | None:
        """The lease token every commit carries (None when not leased)."""
        return self._fence

    @fence.setter
    def fence(self, token: int | None) -> None:
        self._fence = token

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
            value = self._state.names.get(key, fallback)
            cls = value.__class__
            if cls is dict or cls is list:
                return copy_json(value)
            if value is list or value is dict:
                return value()
            return default if value is None else value
        if kind == _DERIVED:
            names = self._state.names
            entries = names.get(key)
            if entries:
                value = entries.get(names.get("CURRENT_ROUND_ID", 0))
                if value is not None:
                    return value
            return fallback
        value = self._runtime.get(key)
        return default if value is None else value

    @property
    def vars(self) -> Mapping[str, Any]:
        """The free-form context variables (a read-only copy)."""
        return MappingProxyType(copy_json(self._state.vars))

    def get_var(self, key: str, default: Any = None) -> Any:
        """One context variable, or ``default`` when it is not set."""
        value = self._state.vars.get(key, _MISSING)
        if value is _MISSING:
            return default
        return copy_json(value)

    # =============================================================== writes

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

    def _record(self, ops: list[dict[str, Any]]) -> None:
        with self._lock:
            self._check_writable()
            apply_ops(self._state, ops)
            if self._store is not None:
                self._pending.extend(ops)
                if self._durability == "strict" and not self._batching:
                    self.commit()

    def _set_op(self, member: ContextNames, value: Any, round_id: int) -> dict[str, Any]:
        """The operation that sets a durable name (derived names write their ledger entry)."""
        key = member._value_
        if not member.accepts(value):
            raise TypeError(
                f"{key} expects {_type_name(member.type)}, got {type(value).__name__}: {value!r:.80}"
            )
        ledger = DERIVED_LEDGERS.get(key)
        if ledger is not None:
            if key == "CURRENT_ROUND_COST":
                value = float(value)
            return {"op": "set", "name": ledger, "path": [round_id], "value": to_wire(value, key)}
        return {"op": "set", "name": key, "value": to_wire(value, key, int_keys=member.int_key_depth)}

    def set(self, name: ContextNames | str, value: Any) -> None:
        """Set a typed name; KeyError for an unknown name, TypeError for a wrong type.

        The value is copied and normalised now: changing it afterwards does not
        change the Context, and a value that cannot be stored is refused here
        (:class:`ValueNotStorableError`, naming the key and the path inside it).
        """
        member = _member(name)
        if not member.durable:
            if not member.accepts(value):
                raise TypeError(f"{member.value} expects {_type_name(member.type)}, got {type(value).__name__}")
            self._check_writable()
            self._runtime[member.value] = value
            return
        self._record([self._set_op(member, value, self._round_id())])

    def _round_id(self) -> int:
        return self._state.names.get("CURRENT_ROUND_ID", 0)

    def update_dict(self, name: ContextNames | str | Mapping[Any, Any], value: Mapping[Any, Any] | None = None) -> None:
        """UFO's two forms: ``update_dict(name, {...})`` merges into a dict-valued name;
        ``update_dict({name: value, ...})`` sets several names at once (one change:
        every value is checked before any is written)."""
        if value is None and isinstance(name, Mapping):
            members = [(_member(k), v) for k, v in name.items()]
            # Round id first, so derived names land in the right round's ledger.
            members.sort(key=lambda mv: mv[0] is not ContextNames.CURRENT_ROUND_ID)
            round_id = self._round_id()
            ops: list[dict[str, Any]] = []
            runtime: list[tuple[ContextNames, Any]] = []
            for member, v in members:
                if not member.durable:
                    if not member.accepts(v):
                        raise TypeError(f"{member.value} expects {_type_name(member.type)}, got {type(v).__name__}")
                    runtime.append((member, v))
                    continue
                ops.append(self._set_op(member, v, round_id))
                if member is ContextNames.CURRENT_ROUND_ID:
                    round_id = v
            self._check_writable()
            for member, v in runtime:
                self._runtime[member.value] = v
            if ops:
                self._record(ops)
            return
        member = _member(name)
        if member.value not in _DICT_NAMES:
            raise TypeError(f"update_dict({member.value}, ...) needs a dict-valued name; {member.value} is {_type_name(member.type)}")
        if not isinstance(value, Mapping):
            raise TypeError(f"update_dict({member.value}, ...) needs a dict, got {type(value).__name__}")
        merged = self.get(member)
        merged.update(value)
        self.set(member, merged)

    def update_vars(self, set: Mapping[str, Any] | None = None, delete: list[str] | tuple[str, ...] = ()) -> None:
        """Delete then set context variables, as one change."""
        if isinstance(delete, str):
            raise TypeError("update_vars(delete=...) takes a list of variable names, not a str")
        if set is not None and not isinstance(set, Mapping):
            raise TypeError(f"update_vars(set=...) takes a dict of variables, not {type(set).__name__}")
        delete = delete or ()
        ops: list[dict[str, Any]] = []
        for key in delete:
            self._check_var_key(key)
            ops.append({"op": "delete", "var": key})
        for key, value in (set or {}).items():
            self._check_var_key(key)
            ops.append({"op": "set", "var": key, "value": to_wire(value, f"vars.{key}")})
        if ops:
            self._record(ops)

    @staticmethod
    def _check_var_key(key: Any) -> None:
        if not isinstance(key, str) or not key:
            raise TypeError(f"context variable names are non-empty strings, not {key!r}")
        to_wire(key, "vars")  # a name that JSON cannot hold is refused too

    def delete_var(self, key: str) -> None:
        """Delete one context variable (no error if it is not set)."""
        self.update_vars(delete=[key])

    # ---------------------------------------------------------- atomic ops

    def _target(self, key: ContextNames | str) -> tuple[dict[str, Any], str]:
        """The op target for ``key`` and its display label.

        A :class:`ContextNames` member targets the typed name (a derived
        ``CURRENT_ROUND_*`` name its ledger entry for the current round); a
        plain string targets a context variable.
        """
        if isinstance(key, ContextNames):
            if not key.durable:
                raise TypeError(f"{key.value} is runtime-only; atomic operations need a durable name")
            ledger = DERIVED_LEDGERS.get(key.value)
            if ledger is not None:
                return {"name": ledger, "path": [self._round_id()]}, key.value
            return {"name": key.value}, key.value
        self._check_var_key(key)
        return {"var": key}, f"vars.{key}"

    def incr(self, key: ContextNames | str, by: int | float = 1) -> int | float:
        """Atomically add ``by`` to a number (a var, or a numeric typed name); return the new value.

        Increments re-base onto concurrent writers at commit, so none is lost.
        """
        if isinstance(by, bool) or not isinstance(by, (int, float)):
            raise TypeError(f"incr: 'by' must be a number, got {type(by).__name__}")
        target, label = self._target(key)
        name = target.get("name")
        if name is not None:
            if name not in _NUMBER_NAMES and "path" not in target:
                raise TypeError(f"incr needs a numeric name; {name} is {_type_name(_member(name).type)}")
            if name in _INT_NAMES and not isinstance(by, int):
                raise TypeError(f"incr: {label} is an int; 'by' must be an int, not {by!r}")
            if name in _FLOAT_NAMES:
                by = float(by)  # keeps a float ledger float, live and on replay
        with self._lock:
            current = self._current(target)
            if current is not None and (isinstance(current, bool) or not isinstance(current, (int, float))):
                raise TypeError(f"incr: {label} holds {type(current).__name__}, not a number")
            to_wire((current or 0) + by, label)  # refuses a result JSON cannot hold (inf, > 64 bits)
            to_wire(by, label)
            self._record([{"op": "incr", **target, "by": by}])
            return self._current(target)

    def append(self, key: ContextNames | str, value: Any) -> None:
        """Atomically append ``value`` to a list (a var, or a list-valued typed name)."""
        target, label = self._target(key)
        if "name" in target and target["name"] not in _LIST_NAMES:
            raise TypeError(f"append needs a list-valued name; {label} is not a list")
        wire = to_wire(value, label)
        with self._lock:
            current = self._current(target)
            if current is not None and not isinstance(current, list):
                raise TypeError(f"append: {label} holds {type(current).__name__}, not a list")
            self._record([{"op": "append", **target, "value": wire}])

    def compare_and_set(self, key: ContextNames | str, expected: Any, new: Any) -> bool:
        """Set ``key`` to ``new`` only if it currently equals ``expected``; return whether it did.

        The check is repeated against the newest version if another writer
        committed first; if it no longer holds, :meth:`commit` raises ConflictError.
        """
        target, label = self._target(key)
        depth = 0
        if isinstance(key, ContextNames):
            if not key.accepts(new):
                raise TypeError(f"{label} expects {_type_name(key.type)}, got {type(new).__name__}")
            if key.value in _FLOAT_NAMES and new is not None:
                new = float(new)
            depth = key.int_key_depth
        expected_wire = to_wire(expected, label, int_keys=depth)
        new_wire = to_wire(new, label, int_keys=depth)
        with self._lock:
            if to_wire(self._current(target), label, int_keys=depth, max_depth=STATE_MAX_DEPTH) != expected_wire:
                return False
            self._record([{"op": "cas", **target, "expected": expected_wire, "value": new_wire}])
            return True

    def _current(self, target: Mapping[str, Any]) -> Any:
        """The current value an atomic operation's target holds (None for an unset var)."""
        if "var" in target:
            return self._state.vars.get(target["var"])
        name = target["name"]
        value = self._state.names.get(name)
        if "path" in target:
            entry = (value or {}).get(target["path"][0])
            if entry is None and name in DERIVED_LEDGERS.values():
                return 0.0 if name in _FLOAT_NAMES else 0  # what get(CURRENT_ROUND_*) reads
            return entry
        if value is None:
            return _member(name).default_value
        return value

    # ---------------------------------------------- UFO's derived properties

    @property
    def current_round_step(self) -> int:
        """Steps taken in the current round (``ROUND_STEP[CURRENT_ROUND_ID]``)."""
        return self.get(ContextNames.CURRENT_ROUND_STEP)

    @current_round_step.setter
    def current_round_step(self, value: int) -> None:
        self.set(ContextNames.CURRENT_ROUND_STEP, value)

    @property
    def current_round_cost(self) -> float:
        """Cost of the current round (``ROUND_COST[CURRENT_ROUND_ID]``)."""
        return self.get(ContextNames.CURRENT_ROUND_COST)

    @current_round_cost.setter
    def current_round_cost(self, value: float) -> None:
        self.set(ContextNames.CURRENT_ROUND_COST, value)

    @property
    def current_round_subtask_amount(self) -> int:
        """Subtasks finished in the current round (``ROUND_SUBTASK_AMOUNT[CURRENT_ROUND_ID]``)."""
        return self.get(ContextNames.CURRENT_ROUND_SUBTASK_AMOUNT)

    @current_round_subtask_amount.setter
    def current_round_subtask_amount(self, value: int) -> None:
        self.set(ContextNames.CURRENT_ROUND_SUBTASK_AMOUNT, value)

    # --------------------------------------------------------- structural logs

    def add_to_structural_logs(self, data: Mapping[str, Any]) -> None:
        """Append ``data`` under ``STRUCTURAL_LOGS[data["Round"]][data["SubtaskIndex"]]``.

        Ignored when either key is missing, as in UFO.
        """
        round_key = data.get("Round")
        subtask_key = data.get("SubtaskIndex")
        if round_key is None or subtask_key is None:
            return
        try:
            path = [int(round_key), int(subtask_key)]
        except (TypeError, ValueError):
            raise TypeError(f"structural log keys Round/SubtaskIndex must be ints, got {round_key!r}/{subtask_key!r}") from None
        self._record(
            [{"op": "append", "name": "STRUCTURAL_LOGS", "path": path, "value": to_wire(dict(data), "STRUCTURAL_LOGS")}]
        )

    def filter_structural_logs(self, round_key: int, subtask_key: int, keys: str | list[str]) -> list[Any]:
        """Values of ``keys`` (a str gives a list of values, a list gives a list of dicts)."""
        if not isinstance(keys, (str, list)):
            raise TypeError(f"keys must be a str or a list of str, got {type(keys).__name__}")
        logs = self._state.names.get("STRUCTURAL_LOGS") or {}
        entries = (logs.get(int(round_key)) or {}).get(int(subtask_key)) or []
        if isinstance(keys, str):
            return [copy_json(entry.get(keys)) for entry in entries]
        return [{k: copy_json(entry.get(k)) for k in keys} for entry in entries]

    def attach_command_dispatcher(self, dispatcher: Any) -> None:
        """Make ``dispatcher`` available to agents as ``context.command_dispatcher`` (runtime only)."""
        self.command_dispatcher = dispatcher

    # ========================================================= serialisation

    def to_dict(self, ensure_serializable: bool = False) -> dict[str, Any]:
        """Every name's value (and ``_vars`` when there are context variables).

        With ``ensure_serializable=True`` runtime-only names are None and one
        warning lists those that held an object.
        """
        out: dict[str, Any] = {}
        dropped: list[str] = []
        for member in ContextNames:
            if not member.durable:
                value = self._runtime.get(member.value)
                if ensure_serializable:
                    if value is not None:
                        dropped.append(member.value)
                    value = None
                out[member.value] = value
                continue
            out[member.value] = self.get(member)
        if ensure_serializable:
            out = {k: (v.value if k == "WEAVING_MODE" else v) for k, v in out.items()}
        if self._state.vars:
            out["_vars"] = copy_json(self._state.vars)
        if dropped:
            warnings.warn(
                f"to_dict(ensure_serializable=True) left out runtime-only values: {', '.join(dropped)}",
                RuntimeWarning,
                stacklevel=2,
            )
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Context":
        """A new detached Context from :meth:`to_dict` output (or its JSON round trip)."""
        ctx = cls()
        items = dict(data)
        context_vars = items.pop("_vars", None) or {}
        ordered = sorted(items.items(), key=lambda kv: kv[0] != "CURRENT_ROUND_ID")
        for key, value in ordered:
            member = _member(key)
            if value is None:
                continue
            if member.derived and DERIVED_LEDGERS[member.value] in items:
                continue  # the ledger itself carries it
            if member.durable:
                value = member.restore(to_wire(value, member.value, int_keys=member.int_key_depth))
            ctx.set(member, value)
        if context_vars:
            ctx.update_vars(set=context_vars)
        return ctx

    # ============================================================ durability

    def commit(
        self,
        *,
        author: str | None = None,
        round: int | None = None,
        step: int | None = None,
        meta: dict[str, Any] | None = None,
    ) -> int:
        """Write the pending changes as ONE event; return the new version.

        If another writer committed first, a batch of only atomic operations is
        re-based onto the newest version and retried; any other batch raises
        :class:`~saucer.store.ConflictError` naming its keys (call :meth:`reload`).
        Any other store failure leaves the changes pending (the error says so):
        the Context stays usable, and its next commit tries again; after a
        commit whose outcome is unknown it first checks whether they were written.
        """
        with self._lock:
            if not self._commit_needed(meta):
                return self._version
            store, sid = self._require_store()
            author = author or self._author
            round = self._round_id() if round is None else round
            _check_commit_args(author, round, step, meta)
            if not self._settle_unknown(meta):
                return self._version
            for attempt in range(_MAX_REBASES):
                ops = self._pending
                try:
                    event = store.append(
                        sid, self._version, ops, author=author, round=round, step=step, meta=meta, fence=self._fence
                    )
                    break
                except ConflictError as exc:
                    delay = self._before_retry(exc, ops, attempt)
                    if delay:
                        time.sleep(delay)
                    self._rebase(ops)
                except StoreError as exc:
                    self._commit_failed(exc)
                    raise
            else:
                raise ConflictError(sid, self._version, None, ["(too many concurrent writers)"])
            self._written(event)
            self._maybe_snapshot()
            return self._version

    async def acommit(
        self,
        *,
        author: str | None = None,
        round: int | None = None,
        step: int | None = None,
        meta: dict[str, Any] | None = None,
    ) -> int:
        """:meth:`commit` for coroutines: the same event, durable when it returns.

        The commits of the sessions of one event loop that are made at the same
        time share one transaction and fsync (see ``saucer.store``), without a
        thread per session; the engine commits its steps this way. The Context
        refuses changes while the commit is in flight. If the awaiting task is
        cancelled, the changes are either still pending (nothing was written)
        or committed, as the Context's version then says.
        """
        with self._lock:
            if not self._commit_needed(meta):
                return self._version
            store, sid = self._require_store()
            author = author or self._author
            round = self._round_id() if round is None else round
            _check_commit_args(author, round, step, meta)
            if not self._settle_unknown(meta):
                return self._version
            self._committing = True
        try:
            for attempt in range(_MAX_REBASES):
                ops = self._pending
                try:
                    await store.aappend(
                        sid,
                        self._version,
                        ops,
                        author=author,
                        round=round,
                        step=step,
                        meta=meta,
                        fence=self._fence,
                        on_written=self._written,
                    )
                    break
                except ConflictError as exc:
                    delay = self._before_retry(exc, ops, attempt)
                    if delay:
                        await asyncio.sleep(delay)
                    with self._lock:
                        self._rebase(ops)
                except StoreError as exc:
                    self._commit_failed(exc)
                    raise
            else:
                raise ConflictError(sid, self._version, None, ["(too many concurrent writers)"])
        finally:
            self._committing = False
        with self._lock:
            self._maybe_snapshot()
            return self._version

    def _commit_needed(self, meta: dict[str, Any] | None) -> bool:
        if self._store is None:
            return False
        self._check_writable()
        return bool(self._pending or meta)

    def _before_retry(self, exc: ConflictError, ops: list[dict[str, Any]], attempt: int) -> float:
        """After a conflict: raise unless the batch can be re-based; return how long to back off."""
        if exc.__class__ is not ConflictError:
            raise exc  # fenced off: retrying cannot help
        plain = [op_key(op) for op in ops if op["op"] not in ATOMIC_OPS and op["op"] != "cas"]
        if plain:
            raise ConflictError(exc.session_id, self._version, exc.actual, sorted(set(plain))) from None
        # Several writers hammer the same session: back off a little, at
        # random, so that one of them gets through.
        return random.uniform(0, 0.0005 * min(attempt, 20)) if attempt >= 2 else 0.0

    def _written(self, event: Event, count: int | None = None) -> None:
        """The pending changes (the first ``count`` of them) are durable as ``event``
        (called by the store as soon as they are)."""
        with self._lock:
            count = len(self._pending) if count is None else count
            self._tail_ops += count
            self._version = event.version
            self._pending = self._pending[count:]
            self._step_mark = max(0, self._step_mark - count)

    def _commit_failed(self, exc: StoreError) -> None:
        """A commit failed with ``exc`` (not a conflict): keep the changes pending and say so."""
        if isinstance(exc, OutcomeUnknownError) and exc.event is not None:
            self._unknown = replace(exc.event, ops=copy_json(exc.event.ops))
        _keep_pending(exc, len(self._pending))

    def _settle_unknown(self, meta: dict[str, Any] | None) -> bool:
        """After a commit whose outcome was unknown: adopt its event if the store has it.

        Returns whether there is still something to commit.
        """
        unknown = self._unknown
        if unknown is None:
            return True
        store, sid = self._require_store()
        written = next(iter(store.read(sid, unknown.version - 1, unknown.version)), None)  # may raise: try again later
        self._unknown = None
        count = len(unknown.ops)
        if (
            written is not None
            and (written.timestamp, written.author, written.ops) == (unknown.timestamp, unknown.author, unknown.ops)
            and self._pending[:count] == unknown.ops
        ):
            self._written(written, count)
        return bool(self._pending or meta)

    def _maybe_snapshot(self) -> None:
        if self._snapshot_due():
            self._auto_snapshot()

    def _snapshot_due(self) -> bool:
        """Every ``snapshot_every`` events, and, for a large state, not before the tail
        written since the last snapshot is worth half of it.

        A snapshot costs O(state): taken every K events of a state that grows
        with the session, snapshots alone would make a long session quadratic.
        Spacing them by the tail's size keeps their total cost linear, while a
        hydrate still reads one snapshot plus a tail no bigger than about half a
        snapshot (so open time follows the state's size, not the history's length).
        """
        if self._version - self._snapshot_version < self._snapshot_every:
            return False
        if self._snapshot_bytes <= _SMALL_SNAPSHOT:
            return True
        return self._tail_ops * _OP_BYTES * 2 >= self._snapshot_bytes

    def _rebase(self, ops: list[dict[str, Any]]) -> None:
        """Re-hydrate at the newest version and re-apply ``ops`` (atomic/cas only) on top.

        Each compare-and-set is checked again, in order, against the state the
        operations before it produce; if one no longer holds, or an operation no
        longer applies (another writer changed the value's type), the batch is
        dropped and :class:`ConflictError` names the key.
        """
        base = self._version
        self._hydrate()
        sid = self._session_id or ""
        for op in ops:
            key = op_key(op)
            if op["op"] == "cas":
                target = {k: op[k] for k in ("name", "var", "path") if k in op}
                name = op.get("name")
                depth = 0 if name is None or "path" in op else _member(name).int_key_depth
                if to_wire(self._current(target), key, int_keys=depth, max_depth=STATE_MAX_DEPTH) != op["expected"]:
                    self._hydrate()
                    raise ConflictError(sid, base, self._version, [key])
            try:
                apply_ops(self._state, [op])
            except Exception:
                self._hydrate()
                raise ConflictError(sid, base, self._version, [key]) from None
        self._pending = ops

    def _auto_snapshot(self) -> None:
        # The event is committed already: a snapshot that cannot be written
        # costs a longer replay later, it must not make the commit look failed.
        try:
            self.snapshot()
        except Exception as exc:
            warnings.warn(
                f"session {self._session_id!r}: snapshot at version {self._version} failed ({exc!r})",
                RuntimeWarning,
                stacklevel=3,
            )

    def commit_step(
        self,
        *,
        author: str | None = None,
        round: int | None = None,
        step: int | None = None,
        meta: dict[str, Any] | None = None,
    ) -> int:
        """Commit at a step boundary unless durability is ``exit`` (then changes wait for close)."""
        if self._durability == "exit" and self._store is not None:
            self._step_mark = len(self._pending)
            return self._version
        return self.commit(author=author, round=round, step=step, meta=meta)

    async def acommit_step(
        self,
        *,
        author: str | None = None,
        round: int | None = None,
        step: int | None = None,
        meta: dict[str, Any] | None = None,
    ) -> int:
        """:meth:`commit_step` for coroutines (see :meth:`acommit`)."""
        if self._durability == "exit" and self._store is not None:
            self._step_mark = len(self._pending)
            return self._version
        return await self.acommit(author=author, round=round, step=step, meta=meta)

    @contextmanager
    def step(
        self,
        *,
        author: str | None = None,
        round: int | None = None,
        step: int | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Iterator["Context"]:
        """Group changes into one atomic step: committed together on success, discarded on error.

        With durability ``exit`` a successful step stays pending until close;
        ``strict`` commits each change as it is made, so there is nothing left
        to discard when the step fails.
        """
        if self._store is None:
            saved = self._copy_state()
            try:
                yield self
            except BaseException:
                self._state = saved
                raise
            return
        if self._pending and self._durability != "exit":
            raise RuntimeError("uncommitted changes before the step; commit() them first")
        mark = len(self._pending)
        try:
            yield self
        except BaseException:
            self._discard_after(mark)
            raise
        self.commit_step(author=author, round=round, step=step, meta=meta)

    def _copy_state(self) -> State:
        return State(
            names={k: copy_json(v) for k, v in self._state.names.items()},
            vars=copy_json(self._state.vars),
        )

    def _discard_after(self, mark: int) -> None:
        """Drop the pending operations after ``mark``: back to the committed state plus the rest."""
        with self._lock:
            kept = self._pending[:mark]
            self._hydrate(self._version)
            if kept:
                apply_ops(self._state, kept)
                self._pending = kept
                self._step_mark = len(kept)

    def rollback(self) -> None:
        """Discard uncommitted changes and return to the last committed state."""
        with self._lock:
            if self._store is None:
                raise RuntimeError("a detached Context has no committed state to roll back to")
            self._hydrate(self._version if self._read_only else None)

    def reload(self) -> None:
        """Discard uncommitted changes and load the newest committed version."""
        with self._lock:
            self._hydrate(self._version if self._read_only else None)

    def snapshot(self) -> int:
        """Store a snapshot of the committed state now; return its version.

        Older snapshots of the session beyond the newest ``keep_snapshots`` are
        dropped: hydrate only ever needs the newest (the one before it is kept
        in case the newest is damaged). Opening ``at=`` an old version replays
        from the newest snapshot before it, or from the start.
        """
        with self._lock:
            store, sid = self._require_store()
            if self._pending:
                raise RuntimeError("commit() pending changes before taking a snapshot")
            wire = state_to_wire(self._state)
            self._snapshot_bytes = len(orjson.dumps(wire))
            self._tail_ops = 0
            # Prune first, so the file never holds more than ``keep_snapshots``
            # copies of a large state at once; a crash in between only means a
            # longer replay on the next open, never a wrong state.
            store.prune_snapshots(sid, self._keep_snapshots - 1)
            store.save_snapshot(Snapshot(sid, self._version, time.time(), wire))
            self._snapshot_version = self._version
            return self._version

    def close(self) -> None:
        """Commit what is pending, snapshot if there is new history, release the store if owned."""
        if self._closed:
            return
        try:
            if self._store is not None and not self._read_only:
                self.commit()
                if self._version > self._snapshot_version:
                    self._auto_snapshot()
        finally:
            self._closed = True
            if self._owns_store and self._store is not None:
                self._owns_store = False
                _release(self._store)

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None and self._store is not None and not self._read_only and not self._closed:
            # An exception discards the unfinished step (with ``exit``, the
            # steps finished before it are still committed by close()).
            try:
                self._discard_after(self._step_mark)
            except Exception:
                # The committed state could not be reloaded: write nothing
                # (neither the half step nor a snapshot of it).
                self._pending = []
                self._snapshot_version = self._version
        self.close()

    # ================================================================ queries

    def history(self, key: ContextNames | str | None = None) -> list[Event]:
        """Committed events (of the whole lineage), or those touching ``key``.

        ``key`` is a :class:`ContextNames` member or name, ``vars.NAME`` or a
        context variable's name. Each event names its author, round and step.
        A pruned session's history starts at its first readable version, with
        the *base* event that sets the whole state then (author ``system``,
        ``meta["pruned"]``).
        """
        store, sid = self._require_store()
        events = store.read(sid, 0, self._version)
        if key is None:
            return list(events)
        wanted = self.history_key(key)
        return [e for e in events if any(op_key(op) == wanted for op in e.ops)]

    @staticmethod
    def history_key(key: ContextNames | str) -> str:
        """The key events use for ``key``: a name (a derived name's ledger) or ``vars.NAME``."""
        if isinstance(key, str) and key.startswith("vars."):
            return key
        if key in _BY_KEY:
            name = _BY_KEY[key].value  # type: ignore[index]
            return DERIVED_LEDGERS.get(name, name)
        return f"vars.{key}"

    def state_at(self, version: int) -> "Context":
        """A read-only Context of this session as it was at ``version`` (an int).

        :class:`~saucer.store.VersionPrunedError` when that version was pruned
        (it names the first readable one), never an empty or partial state.
        """
        store, sid = self._require_store()
        return Context.open(store, sid, at=version)

    def diff(self, v1: int, v2: int) -> dict[str, dict[str, Any]]:
        """Keys whose values differ between two versions: ``{key: {"before": a, "after": b}}``.

        Context variables appear as ``vars.NAME``; a missing value is None.
        Both versions must be readable (see :meth:`state_at`).
        """
        a = self.state_at(v1)._plain()
        b = self.state_at(v2)._plain()
        return {
            k: {"before": a.get(k), "after": b.get(k)}
            for k in sorted(a.keys() | b.keys())
            if a.get(k) != b.get(k)
        }

    def _plain(self) -> dict[str, Any]:
        """Committed durable values as JSON data (names that were written, and vars)."""
        wire = state_to_wire(self._state)
        out = dict(wire["names"])
        out.update({f"vars.{k}": v for k, v in wire["vars"].items()})
        return out

    def fork(self, new_session_id: str, at: int | None = None, *, author: str | None = None) -> "Context":
        """A writable Context for a new session starting from this one's state at ``at``.

        The new session references this session's log up to ``at``; nothing is
        copied (until this session is pruned: then the fork gets its own copy
        first). A version that was pruned cannot be forked
        (:class:`~saucer.store.VersionPrunedError`).
        """
        store, sid = self._require_store()
        at = self._version if at is None else check_version(at, "at")
        store.create_session(new_session_id, parent_id=sid, parent_version=at, meta={"forked_from": sid, "at": at})
        child = Context.open(
            store, new_session_id, author=author or self._author, durability=self._durability,
            snapshot_every=self._snapshot_every, keep_snapshots=self._keep_snapshots,
        )
        if self._owns_store:
            # The store was opened from a URL for this Context: the child shares
            # it, and it is closed when the last of them closes.
            _retain(store)
            child._owns_store = True
        if at > 0 and child._snapshot_version < at:
            # The child's own snapshot of the fork point (state, not log): its
            # opens stay bounded even after the parent's snapshots are pruned.
            child._auto_snapshot()
        return child

    async def watch(self, *, interval: float = 0.2) -> AsyncIterator[Event]:
        """Yield events committed to this session after this Context's version (by anyone)."""
        store, sid = self._require_store()
        async for event in store.watch(sid, self._version, interval=interval):
            yield event

    def __repr__(self) -> str:
        where = f"{self._session_id!r}@{self._version}" if self._session_id else "detached"
        return f"<Context {where} pending={len(self._pending)} durability={self._durability}>"
