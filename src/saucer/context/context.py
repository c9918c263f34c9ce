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

import threading
import warnings
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any, AsyncIterator, Iterator, Literal, Mapping

from saucer.context.events import (
    ATOMIC_OPS,
    Event,
    State,
    apply_ops,
    copy_json,
    op_key,
    state_from_wire,
    state_to_wire,
    to_wire,
)
from saucer.context.names import DERIVED_LEDGERS, ContextNames
from saucer.store.base import ConflictError, EventStore, ReadOnlyError, Snapshot

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
#: How many times commit() re-bases an atomic-only batch before giving up.
_MAX_REBASES = 50


def _member(name: Any) -> ContextNames:
    try:
        return _BY_KEY[name]
    except (KeyError, TypeError):
        raise KeyError(f"unknown context name {name!r}; see ContextNames for the valid names") from None


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
        self._pending: list[dict[str, Any]] = []
        self._author = "system"
        self._durability: Durability = "step"
        self._read_only = False
        self._fence: int | None = None
        self._lock = threading.RLock()
        self._closed = False
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
    ) -> "Context":
        """Open (or create) a session's Context in ``store`` (an :class:`EventStore` or a URL).

        ``at=VERSION`` gives a read-only Context as it was at that version.
        ``create=False`` raises :class:`~saucer.store.SessionNotFoundError`
        for an unknown session. ``fence`` is a lease token every commit carries.
        """
        if durability not in _DURABILITIES:
            raise ValueError(f"durability must be one of {', '.join(_DURABILITIES)}, not {durability!r}")
        if snapshot_every < 1:
            raise ValueError("snapshot_every must be at least 1")
        ctx = cls()
        if isinstance(store, str):
            from saucer.store import open_store

            ctx._store = open_store(store)
            ctx._owns_store = True
        else:
            ctx._store = store
        try:
            if not ctx._store.exists(session_id):
                if at is not None or not create:
                    ctx._store.session_info(session_id)  # raises SessionNotFoundError
                ctx._store.create_session(session_id, meta=meta)
            ctx._session_id = session_id
            ctx._author = author
            ctx._durability = durability
            ctx._snapshot_every = snapshot_every
            ctx._fence = fence
            if at is not None:
                head = ctx._store.head(session_id)
                if not 0 <= at <= head:
                    raise ValueError(f"session {session_id!r} has versions 0..{head}, not {at}")
                ctx._read_only = True
            ctx._hydrate(at)
        except BaseException:
            if ctx._owns_store:
                ctx._store.close()
            raise
        return ctx

    def _hydrate(self, upto: int | None = None) -> None:
        store, sid = self._require_store()
        snap = store.latest_snapshot(sid, upto)
        state = state_from_wire(snap.state) if snap else State()
        base = snap.version if snap else 0
        for event in store.read(sid, base, upto):
            apply_ops(state, event.ops)
        self._state = state
        self._snapshot_version = base
        # A skipped damaged trailing record still occupies its version.
        self._version = upto if upto is not None else store.head(sid)
        self._pending = []

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
        self._author = value

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
        member = _member(name)
        key = member.value
        ledger = DERIVED_LEDGERS.get(key)
        if ledger is not None:
            entries = self._state.names.get(ledger)
            round_id = self._state.names.get("CURRENT_ROUND_ID", 0)
            value = entries.get(round_id) if entries else None
            if value is None:
                return member.default_value
            return value
        if not member.durable:
            value = self._runtime.get(key)
            return default if value is None else value
        value = self._state.names.get(key, _MISSING)
        if value is _MISSING:
            value = member.default_value
        if value is None:
            return default
        cls = value.__class__
        if cls is dict or cls is list:
            return copy_json(value)
        return value

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

    def _record(self, ops: list[dict[str, Any]]) -> None:
        with self._lock:
            self._check_writable()
            apply_ops(self._state, ops)
            if self._store is not None:
                self._pending.extend(ops)
                if self._durability == "strict":
                    self.commit()

    def set(self, name: ContextNames | str, value: Any) -> None:
        """Set a typed name; KeyError for an unknown name, TypeError for a wrong type."""
        member = _member(name)
        key = member.value
        if not member.accepts(value):
            raise TypeError(
                f"{key} expects {_type_name(member.type)}, got {type(value).__name__}: {value!r:.80}"
            )
        ledger = DERIVED_LEDGERS.get(key)
        if ledger is not None:
            if key == "CURRENT_ROUND_COST":
                value = float(value)
            self._record([{"op": "set", "name": ledger, "path": [self._round_id()], "value": to_wire(value, key)}])
            return
        if not member.durable:
            self._check_writable()
            self._runtime[key] = value
            return
        self._record([{"op": "set", "name": key, "value": to_wire(value, key, int_keys=True)}])

    def _round_id(self) -> int:
        return self._state.names.get("CURRENT_ROUND_ID", 0)

    def update_dict(self, name: ContextNames | str | Mapping[Any, Any], value: Mapping[Any, Any] | None = None) -> None:
        """UFO's two forms: ``update_dict(name, {...})`` merges into a dict-valued name;
        ``update_dict({name: value, ...})`` sets several names at once."""
        if value is None and isinstance(name, Mapping):
            members = [(_member(k), v) for k, v in name.items()]
            for member, v in members:
                if not member.accepts(v):
                    raise TypeError(f"{member.value} expects {_type_name(member.type)}, got {type(v).__name__}")
            # Round id first, so derived names land in the right round's ledger.
            members.sort(key=lambda mv: mv[0] is not ContextNames.CURRENT_ROUND_ID)
            for member, v in members:
                self.set(member, v)
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

    def delete_var(self, key: str) -> None:
        """Delete one context variable (no error if it is not set)."""
        self.update_vars(delete=[key])

    # ---------------------------------------------------------- atomic ops

    def _target(self, key: ContextNames | str) -> tuple[dict[str, Any], Any]:
        """The op target for ``key``: a typed name (members only) or a var."""
        if isinstance(key, ContextNames):
            ledger = DERIVED_LEDGERS.get(key.value)
            if ledger is not None:
                return {"name": ledger, "path": [self._round_id()]}, key
            return {"name": key.value}, key
        self._check_var_key(key)
        return {"var": key}, key

    def incr(self, key: ContextNames | str, by: int | float = 1) -> int | float:
        """Atomically add ``by`` to a number (a var, or a numeric typed name); return the new value.

        Increments re-base onto concurrent writers at commit, so none is lost.
        """
        if isinstance(by, bool) or not isinstance(by, (int, float)):
            raise TypeError(f"incr: 'by' must be a number, got {type(by).__name__}")
        to_wire(by, "by")
        target, _ = self._target(key)
        current = self._current(target)
        if "name" in target and target["name"] not in _NUMBER_NAMES and "path" not in target:
            raise TypeError(f"incr needs a numeric name; {target['name']} is not a number")
        if current is not None and (isinstance(current, bool) or not isinstance(current, (int, float))):
            raise TypeError(f"incr: {key!s} holds {type(current).__name__}, not a number")
        if "name" in target and target["name"] in ("ID", "CURRENT_ROUND_ID", "SESSION_STEP") and isinstance(by, float):
            raise TypeError(f"incr: {target['name']} is an int; 'by' must be an int")
        self._record([{"op": "incr", **target, "by": by}])
        return self._current(target)

    def append(self, key: ContextNames | str, value: Any) -> None:
        """Atomically append ``value`` to a list (a var, or a list-valued typed name)."""
        target, _ = self._target(key)
        if "name" in target and target["name"] not in _LIST_NAMES:
            raise TypeError(f"append needs a list-valued name; {target['name']} is not a list")
        current = self._current(target)
        if current is not None and not isinstance(current, list):
            raise TypeError(f"append: {key!s} holds {type(current).__name__}, not a list")
        label = target.get("name") or f"vars.{target['var']}"
        self._record([{"op": "append", **target, "value": to_wire(value, label)}])

    def compare_and_set(self, key: ContextNames | str, expected: Any, new: Any) -> bool:
        """Set ``key`` to ``new`` only if it currently equals ``expected``; return whether it did.

        The check is repeated against the newest version if another writer
        committed first; if it no longer holds, :meth:`commit` raises ConflictError.
        """
        target, _ = self._target(key)
        label = target.get("name") or f"vars.{target['var']}"
        if "name" in target and "path" not in target:
            member = _member(target["name"])
            if not member.accepts(new):
                raise TypeError(f"{label} expects {_type_name(member.type)}, got {type(new).__name__}")
        with self._lock:
            if self._current(target) != expected:
                return False
            op = {"op": "cas", **target, "expected": to_wire(expected, label, int_keys=True), "value": to_wire(new, label, int_keys=True)}
            self._record([op])
            return True

    def _current(self, target: Mapping[str, Any]) -> Any:
        if "var" in target:
            return self._state.vars.get(target["var"])
        name = target["name"]
        value = self._state.names.get(name)
        if "path" in target:
            return (value or {}).get(target["path"][0])
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
                value = member.restore(to_wire(value, member.value, int_keys=True))
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
        """
        with self._lock:
            if self._store is None:
                return self._version
            self._check_writable()
            if not self._pending and not meta:
                return self._version
            store, sid = self._require_store()
            ops = self._pending
            author = author or self._author
            round = self._round_id() if round is None else round
            for _ in range(_MAX_REBASES):
                try:
                    event = store.append(
                        sid, self._version, ops, author=author, round=round, step=step, meta=meta, fence=self._fence
                    )
                    break
                except ConflictError as exc:
                    if exc.__class__ is not ConflictError:
                        raise  # fenced off: retrying cannot help
                    plain = [op_key(op) for op in ops if op["op"] not in ATOMIC_OPS and op["op"] != "cas"]
                    if plain:
                        raise ConflictError(sid, self._version, exc.actual, sorted(set(plain))) from None
                    self._rebase(ops)
            else:
                raise ConflictError(sid, self._version, None, ["(too many concurrent writers)"])
            self._version = event.version
            self._pending = []
            if self._version - self._snapshot_version >= self._snapshot_every:
                self.snapshot()
            return self._version

    def _rebase(self, ops: list[dict[str, Any]]) -> None:
        """Re-hydrate at the newest version and re-apply ``ops`` (atomic/cas only) on top."""
        self._hydrate()
        for op in ops:
            if op["op"] == "cas":
                target = {k: op[k] for k in ("name", "var", "path") if k in op}
                if to_wire(self._current(target), op_key(op), int_keys=True) != op["expected"]:
                    raise ConflictError(self._session_id or "", self._version, self._version, [op_key(op)])
        apply_ops(self._state, ops)
        self._pending = ops

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
            return self._version
        return self.commit(author=author, round=round, step=step, meta=meta)

    @contextmanager
    def step(
        self,
        *,
        author: str | None = None,
        round: int | None = None,
        step: int | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Iterator["Context"]:
        """Group changes into one atomic step: committed together on success, discarded on error."""
        if self._pending:
            raise RuntimeError("uncommitted changes before the step; commit() them first")
        try:
            yield self
        except BaseException:
            self.rollback()
            raise
        self.commit_step(author=author, round=round, step=step, meta=meta)

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
        """Store a snapshot of the committed state now; return its version."""
        with self._lock:
            store, sid = self._require_store()
            if self._pending:
                raise RuntimeError("commit() pending changes before taking a snapshot")
            import time

            store.save_snapshot(Snapshot(sid, self._version, time.time(), state_to_wire(self._state)))
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
                    self.snapshot()
        finally:
            self._closed = True
            if self._owns_store and self._store is not None:
                self._store.close()

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None and self._store is not None and not self._read_only and not self._closed:
            self._pending = []  # an exception discards the unfinished step
        self.close()

    # ================================================================ queries

    def history(self, key: ContextNames | str | None = None) -> list[Event]:
        """Committed events (of the whole lineage), or those touching ``key``.

        ``key`` is a :class:`ContextNames` member or name, ``vars.NAME`` or a
        context variable's name. Each event names its author, round and step.
        """
        store, sid = self._require_store()
        events = store.read(sid, 0, self._version)
        if key is None:
            return list(events)
        wanted = self._history_key(key)
        return [e for e in events if any(op_key(op) == wanted for op in e.ops)]

    @staticmethod
    def _history_key(key: ContextNames | str) -> str:
        if isinstance(key, str) and key.startswith("vars."):
            return key
        if key in _BY_KEY:
            name = _BY_KEY[key].value  # type: ignore[index]
            return DERIVED_LEDGERS.get(name, name)
        return f"vars.{key}"

    def state_at(self, version: int) -> "Context":
        """A read-only Context of this session as it was at ``version``."""
        store, sid = self._require_store()
        return Context.open(store, sid, at=version)

    def diff(self, v1: int, v2: int) -> dict[str, dict[str, Any]]:
        """Keys whose values differ between two versions: ``{key: {"before": a, "after": b}}``.

        Context variables appear as ``vars.NAME``; a missing value is None.
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

        The new session references this session's log up to ``at``; nothing is copied.
        """
        store, sid = self._require_store()
        at = self._version if at is None else at
        store.create_session(new_session_id, parent_id=sid, parent_version=at, meta={"forked_from": sid, "at": at})
        return Context.open(
            store, new_session_id, author=author or self._author, durability=self._durability,
            snapshot_every=self._snapshot_every,
        )

    async def watch(self, *, interval: float = 0.2) -> AsyncIterator[Event]:
        """Yield events committed to this session after this Context's version (by anyone)."""
        store, sid = self._require_store()
        async for event in store.watch(sid, self._version, interval=interval):
            yield event

    def __repr__(self) -> str:
        where = f"{self._session_id!r}@{self._version}" if self._session_id else "detached"
        return f"<Context {where} pending={len(self._pending)} durability={self._durability}>"
