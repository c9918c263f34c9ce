"""Writing a Context (typed names, context variables, atomic operations) and reading its variables.

Reading a typed name is the working copy's (:meth:`~saucer.context.working.WorkingCopy.get`).

Every write becomes an operation (see :mod:`saucer.context.events`), applied
at once through the one fold and, on a Context bound to a store, kept pending
until the next commit. Values are checked and normalised when they are
written: a wrong type is a ``TypeError``, a value that cannot be stored is a
:class:`~saucer.context.events.ValueNotStorableError` naming the key and the
path inside it, so a commit never meets either.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, cast

from saucer.context.events import copy_json, to_wire
from saucer.context.names import (
    DERIVED_LEDGERS,
    DICT_NAMES,
    FLOAT_NAMES,
    INT_NAMES,
    LIST_NAMES,
    NUMBER_NAMES,
    ContextNames,
    lookup,
    typed_name,
)
from saucer.context.participants import PARTICIPANTS_VAR
from saucer.context.types import AppendOp, CasOp, DeleteOp, IncrOp, Json, Key, Op, Recorder, SetOp, Target
from saucer.context.working import WorkingCopy
from saucer.store.model import check_participants

__all__ = ["TypedAccess", "check_var_key", "type_name"]

_MISSING: Any = object()
#: The least 64-bit integer: an int increment and its result within range need no further check.
_I64 = -(2**63)


#: Each durable typed name (a member hashes as its name): the name an atomic operation on it
#: targets (a derived name's ledger), whether it is derived, and its label.
_OP_TARGETS: dict[str, tuple[str, bool, str]] = {
    m.value: (DERIVED_LEDGERS.get(m.value, m.value), m.value in DERIVED_LEDGERS, m.value)
    for m in ContextNames
    if m.durable
}


#: Each typed name an atomic increment may target (a number, or a derived name's per-round ledger):
#: the name it targets, whether that is the current round's ledger entry, its label, and
#: whether ``by`` must be an int or becomes a float.
_INCR_SPECS: dict[str, tuple[str, bool, str, bool, bool]] = {
    label: (name, derived, label, name in INT_NAMES, name in FLOAT_NAMES)
    for label, (name, derived, _) in _OP_TARGETS.items()
    if name in NUMBER_NAMES or derived
}


#: The increments :meth:`TypedAccess.incr_ops` checks inline: each int or float name or ledger (as in
#: ``_INCR_SPECS``) with the class ``by`` must have to be taken as it is.
_FAST_INCRS: dict[str, tuple[str, bool, type]] = {
    label: (name, derived, int if is_int else float)
    for label, (name, derived, _, is_int, is_float) in _INCR_SPECS.items()
    if is_int or is_float
}


def type_name(tp: object) -> str:
    """How an error message names a declared type (``int``, ``dict[int, float]``)."""
    name: str = getattr(tp, "__name__", "")  # a generic alias (dict[int, float]) answers its origin's name
    return name or str(tp).replace("typing.", "")


def _wrong_type(member: ContextNames, value: object) -> TypeError:
    return TypeError(f"{member.value} expects {type_name(member.type)}, got {type(value).__name__}")


def check_var_key(key: object) -> None:
    """Refuse what cannot name a context variable (TypeError): not a non-empty str, or a typed name's string."""
    if key.__class__ is str and key in _GOOD_KEYS:  # a session reads the same few variables step after step
        return
    if not isinstance(key, str) or not key:
        raise TypeError(f"context variable names are non-empty strings, not {key!r}")
    if typed_name(key) is not None:
        raise TypeError(
            f"{key!r} names the typed ContextNames.{key}, not a context variable: "
            "read and write it with get/set (incr/append/compare_and_set take it too)"
        )
    to_wire(key, "vars")  # a name that JSON cannot hold is refused too
    if key.__class__ is str and len(_GOOD_KEYS) < 1024:
        _GOOD_KEYS.add(key)


#: Variable names :func:`check_var_key` accepted (the check is the same every time; a few kept).
_GOOD_KEYS: set[str] = set()


def set_op(member: ContextNames, value: object, round_id: int) -> SetOp:
    """The operation that sets a durable name (derived names write their ledger entry)."""
    key: str = member._value_  # not .value, an Enum property: set is a hot call
    if not member.accepts(value):
        raise TypeError(f"{key} expects {type_name(member.type)}, got {type(value).__name__}: {value!r:.80}")
    ledger = DERIVED_LEDGERS.get(key)
    if ledger is not None:
        if key == "CURRENT_ROUND_COST":
            value = float(cast("float", value))
        return {"op": "set", "name": ledger, "path": [round_id], "value": to_wire(value, key)}
    return {"op": "set", "name": key, "value": to_wire(value, key, int_keys=member.int_key_depth)}


class TypedAccess:
    """``set`` of typed names, context variables, and the atomic operations, on a working copy."""

    def __init__(self, work: WorkingCopy, record: Recorder) -> None:
        self._work = work
        self._record = record

    # ================================================================= reads

    def vars(self) -> Mapping[str, Json]:
        """The free-form context variables (a read-only copy)."""
        return MappingProxyType(copy_json(self._work.state.vars))

    def retired(self) -> Mapping[str, Json]:
        """Values of names retired since this session stored them (a read-only copy, wire form)."""
        return MappingProxyType(copy_json(self._work.state.retired))

    def encrypted(self) -> frozenset[str]:
        """Targets encrypted at rest that were read without the store key."""
        return frozenset(self._work.state.opaque)

    def get_var(self, key: str, default: Any = None) -> Any:
        """One context variable, or ``default`` when it is not set (a typed name's string is a
        TypeError: see :func:`~saucer.context.names.typed_name`; read it with :meth:`get`)."""
        check_var_key(key)
        value = self._work.state.vars.get(key, _MISSING)
        if value is _MISSING:
            return default
        return copy_json(value)

    # ================================================================ writes

    def set(self, name: ContextNames | str, value: Any) -> None:
        """Set a typed name; KeyError for an unknown name, TypeError for a wrong type (see ``Context.set``)."""
        member = lookup(name)
        work = self._work
        if not member.durable:
            if not member.accepts(value):
                raise _wrong_type(member, value)
            work.check_writable()
            work.runtime[member.value] = value
            return
        self._record([set_op(member, value, work.round_id())])

    def update_dict(self, name: ContextNames | str | Mapping[Any, Any], value: Mapping[Any, Any] | None = None) -> None:
        """UFO's two forms: ``update_dict(name, {...})`` merges into a dict-valued name;
        ``update_dict({name: value, ...})`` sets several names at once (one change:
        every value is checked before any is written)."""
        if value is None and isinstance(name, Mapping):
            self._set_many(name)
            return
        member = lookup(name)
        if member.value not in DICT_NAMES:
            raise TypeError(
                f"update_dict({member.value}, ...) needs a dict-valued name; {member.value} is {type_name(member.type)}"
            )
        if not isinstance(value, Mapping):
            raise TypeError(f"update_dict({member.value}, ...) needs a dict, got {type(value).__name__}")
        merged = self._work.get(member)
        merged.update(value)
        self.set(member, merged)

    def _set_many(self, values: Mapping[Any, Any]) -> None:
        """``update_dict({name: value, ...})``: every value checked, then all set as one change."""
        members = [(lookup(k), v) for k, v in values.items()]
        # Round id first, so derived names land in the right round's ledger.
        members.sort(key=lambda mv: mv[0] is not ContextNames.CURRENT_ROUND_ID)
        work = self._work
        round_id = work.round_id()
        ops: list[Op] = []
        runtime: list[tuple[ContextNames, Any]] = []
        for member, v in members:
            if not member.durable:
                if not member.accepts(v):
                    raise _wrong_type(member, v)
                runtime.append((member, v))
                continue
            ops.append(set_op(member, v, round_id))
            if member is ContextNames.CURRENT_ROUND_ID:
                round_id = v
        work.check_writable()
        for member, v in runtime:
            work.runtime[member.value] = v
        if ops:
            self._record(ops)

    def update_vars(self, set: Mapping[str, Any] | None = None, delete: list[str] | tuple[str, ...] = ()) -> None:
        """Delete then set context variables, as one change."""
        if isinstance(delete, str):  # type: ignore[unreachable]  # a caller without types may pass one str
            raise TypeError("update_vars(delete=...) takes a list of variable names, not a str")
        if set is not None and not isinstance(set, Mapping):
            raise TypeError(f"update_vars(set=...) takes a dict of variables, not {type(set).__name__}")
        ops: list[Op] = []
        for key in delete or ():
            check_var_key(key)
            deletion: DeleteOp = {"op": "delete", "var": key}
            ops.append(deletion)
        for key, value in (set or {}).items():
            check_var_key(key)
            setting: SetOp = {"op": "set", "var": key, "value": to_wire(value, f"vars.{key}")}
            ops.append(setting)
        if ops:
            self._record(ops)

    # ========================================================= participants

    def participants(self) -> frozenset[str] | None:
        """Who may write to this session: those it was made with and those added since;
        None when it declares none (every writer may). The session's runner always may."""
        store, sid = self._work.require_store()
        info, _ = store.session_info_without_plan(sid)
        if info.participants is None:
            return None
        added = self._work.state.vars.get(PARTICIPANTS_VAR)
        return info.participants | frozenset(
            a for a in (added if isinstance(added, list) else []) if isinstance(a, str)
        )

    def add_participants(self, *names: str) -> None:
        """Let ``names`` write to this session too (see ``Context.add_participants``)."""
        known = self.participants()
        if known is None:
            raise ValueError(
                f"session {self._work.session_id!r} declares no participants, so every writer may write already; "
                "name them when it is made (participants=...)"
            )
        for name in check_participants(names):
            if name not in known:
                self.append(PARTICIPANTS_VAR, name)

    # ========================================================== atomic ops

    def _target(self, key: ContextNames | str) -> tuple[Target, str]:
        """The op target for ``key`` and its display label.

        By the one rule (:func:`~saucer.context.names.typed_name`): a
        :class:`ContextNames` member or its name targets the typed name (a
        derived ``CURRENT_ROUND_*`` name its ledger entry for the current
        round); any other string targets a context variable.
        """
        spec = _OP_TARGETS.get(key) if isinstance(key, str) else None
        if spec is not None:
            name, derived, label = spec
            if derived:
                return {"name": name, "path": [self._work.round_id()]}, label
            return {"name": name}, label
        member = typed_name(key)
        if member is not None:
            raise TypeError(f"{member.value} is runtime-only; atomic operations need a durable name")
        check_var_key(key)
        return {"var": key}, f"vars.{key}"

    def incr(self, key: ContextNames | str, by: int | float = 1) -> int | float:
        """Atomically add ``by`` to a number (a var, or a numeric typed name); return the new value."""
        work = self._work
        with work.lock:
            op, target = self.incr_op(key, by)
            self._record([op])
            result: int | float = work.current(target)
            return result

    def incr_op(self, key: ContextNames | str, by: int | float) -> tuple[IncrOp, Target]:
        """The operation adding ``by`` to ``key`` and its target, checked against the current value
        (under the lock): TypeError for what is not a number, ValueNotStorableError for a result JSON cannot hold."""
        cls = by.__class__
        if cls is not int and cls is not float and (isinstance(by, bool) or not isinstance(by, (int, float))):
            raise TypeError(f"incr: 'by' must be a number, got {type(by).__name__}")
        spec = _INCR_SPECS.get(key) if isinstance(key, str) else None
        if spec is None:  # a context variable (or a name atomic operations refuse: _target says why)
            target, label = self._target(key)
            if "name" in target:  # not numeric
                raise TypeError(f"incr needs a numeric name; {label} is {type_name(lookup(label).type)}")
            current = self._work.current(target)
        else:
            name, derived, label, is_int, is_float = spec
            if is_int and cls is not int and not isinstance(by, int):
                raise TypeError(f"incr: {label} is an int; 'by' must be an int, not {by!r}")
            if is_float and cls is not float:
                by = float(by)  # keeps a float ledger float, live and on replay
            state = self._work.state
            if name in state.packed:
                target = {"name": name, "path": [self._work.round_id()]} if derived else {"name": name}
                current = self._work.current(target)
            elif derived:  # the current round's ledger entry (the engine's, every step): WorkingCopy.current, inline
                names = state.names
                round_id = names.get("CURRENT_ROUND_ID", 0)
                target = {"name": name, "path": [round_id]}
                current = (names.get(name) or {}).get(round_id)
                if current is None:
                    current = 0.0 if is_float else 0  # what get(CURRENT_ROUND_*) reads
            else:
                target = {"name": name}
                current = state.names.get(name)
                if current is None:
                    current = lookup(name).default_value
        if current is not None and (isinstance(current, bool) or not isinstance(current, (int, float))):
            raise TypeError(f"incr: {label} holds {type(current).__name__}, not a number")
        result = (current or 0) + by
        if not (result.__class__ is int and by.__class__ is int and _I64 <= result < -_I64 and _I64 <= by < -_I64):
            to_wire(result, label)  # refuses a result JSON cannot hold (inf, > 64 bits)
            to_wire(by, label)
        op: IncrOp = {"op": "incr", **target, "by": by}
        return op, target

    def incr_ops(self, increments: Mapping[Key, int | float]) -> list[Op]:
        """The operations of several increments at once (the engine's step ledger), under the lock: what
        :meth:`incr_op` makes of each. A counter or current-round ledger entry that holds a number of its
        own type, and a result in range, are read and checked inline; anything else is :meth:`incr_op`'s."""
        state = self._work.state
        names, packed = state.names, state.packed
        round_id = names.get("CURRENT_ROUND_ID", 0)
        ops: list[Op] = []
        for key, by in increments.items():
            fast = _FAST_INCRS.get(key) if isinstance(key, str) else None
            cls = by.__class__
            if fast is not None and cls is fast[2] and fast[0] not in packed:
                name, derived, _ = fast
                if derived:
                    current = (names.get(name) or {}).get(round_id)
                    if current is None:
                        current = by - by  # an entry not made yet reads as 0 (0.0 for a float ledger)
                else:
                    current = names.get(name)
                if current.__class__ is cls:
                    result = current + by
                    if (_I64 <= result < -_I64 and _I64 <= by < -_I64) if cls is int else result - result == 0.0:
                        op: IncrOp = (
                            {"op": "incr", "name": name, "path": [round_id], "by": by}
                            if derived
                            else {"op": "incr", "name": name, "by": by}
                        )
                        ops.append(op)
                        continue
            ops.append(self.incr_op(key, by)[0])  # checked in full (and refused, saying why)
        return ops

    def append(self, key: ContextNames | str, value: Any) -> None:
        """Atomically append ``value`` to a list (a var, or a list-valued typed name)."""
        target, label = self._target(key)
        if "name" in target and target["name"] not in LIST_NAMES:
            raise TypeError(f"append needs a list-valued name; {label} is not a list")
        wire = to_wire(value, label)
        work = self._work
        with work.lock:
            current = work.current(target)
            if current is not None and not isinstance(current, list):
                raise TypeError(f"append: {label} holds {type(current).__name__}, not a list")
            op: AppendOp = {"op": "append", **target, "value": wire}
            self._record([op])

    def compare_and_set(self, key: ContextNames | str, expected: Any, new: Any) -> bool:
        """Set ``key`` to ``new`` only if it currently equals ``expected``; return whether it did."""
        target, label = self._target(key)
        depth = 0
        member = typed_name(key)
        if member is not None:
            if not member.accepts(new):
                raise TypeError(f"{label} expects {type_name(member.type)}, got {type(new).__name__}")
            if member.value in FLOAT_NAMES and new is not None:
                new = float(new)
            depth = member.int_key_depth
        expected_wire = to_wire(expected, label, int_keys=depth)
        new_wire = to_wire(new, label, int_keys=depth)
        work = self._work
        with work.lock:
            if work.current_wire(target, label, depth) != expected_wire:
                return False
            op: CasOp = {"op": "cas", **target, "expected": expected_wire, "value": new_wire}
            self._record([op])
            return True
