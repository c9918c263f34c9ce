"""UFO's Context API beyond ``get``/``set``: what UFO's documentation shows.

The structural logs (``add_to_structural_logs``/``filter_structural_logs``, keyed
by round and subtask as UFO's writers and readers should have agreed), the
engine's one-change step ledger (``charge``), and ``to_dict``/``from_dict``,
whose output keeps int round ids ints and leaves runtime-only objects out when
asked to be serialisable (see ARCHITECTURE.md, "Compatibility with UFO's
documented Context"). The writable ``current_round_*`` properties are the
Context's own (:mod:`saucer.context.context`), over the per-round ledgers.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, Generic, Protocol, TypeVar, overload

from saucer.context.access import TypedAccess
from saucer.context.events import StoredJson, copy_json, to_wire
from saucer.context.names import DERIVED_LEDGERS, ContextNames, typed_name
from saucer.context.types import AppendOp, Key, Recorder
from saucer.context.working import WorkingCopy

__all__ = ["UfoCompat", "ClassOrInstance", "RoundValue", "structural_op"]

_T = TypeVar("_T")
_R = TypeVar("_R")
_V = TypeVar("_V", int, float)


class ClassOrInstance(Generic[_T, _R]):
    """A method that acts on the instance it is called on, or on a new instance when called on the class."""

    def __init__(self, fn: Callable[[_T, Mapping[str, Any]], _R]) -> None:
        self.fn = fn
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__
        self.__wrapped__ = fn

    def __get__(self, obj: _T | None, cls: Callable[[], _T]) -> Callable[[Mapping[str, Any]], _R]:
        return types.MethodType(self.fn, cls() if obj is None else obj)


class _Typed(Protocol):
    def get(self, name: ContextNames | str, default: Any = None) -> Any: ...
    def set(self, name: ContextNames | str, value: Any) -> None: ...


class RoundValue(Generic[_V]):
    """UFO's writable ``current_round_*`` property: reads and writes the entry of ``CURRENT_ROUND_ID``
    in a per-round ledger, through the Context's ``get`` and ``set`` (so reads never write)."""

    def __init__(self, name: ContextNames, doc: str) -> None:
        self.name = name
        self.__doc__ = doc

    @overload
    def __get__(self, obj: None, cls: type) -> RoundValue[_V]: ...
    @overload
    def __get__(self, obj: _Typed, cls: type | None = None) -> _V: ...
    def __get__(self, obj: _Typed | None, cls: type | None = None) -> _V | RoundValue[_V]:
        if obj is None:
            return self  # on the class: the property itself, as a property reads
        value: _V = obj.get(self.name)
        return value

    def __set__(self, obj: _Typed, value: _V) -> None:
        obj.set(self.name, value)


def structural_op(data: Mapping[str, Any]) -> AppendOp | None:
    """The operation appending ``data`` to the structural logs (None without Round or SubtaskIndex)."""
    round_key = data.get("Round")
    subtask_key = data.get("SubtaskIndex")
    if round_key is None or subtask_key is None:
        return None
    try:
        path: list[int | str] = [int(round_key), int(subtask_key)]
    except (TypeError, ValueError):
        raise TypeError(
            f"structural log keys Round/SubtaskIndex must be ints, got {round_key!r}/{subtask_key!r}"
        ) from None
    entry = to_wire(data if data.__class__ is dict else dict(data), "STRUCTURAL_LOGS")  # a copy either way
    return {"op": "append", "name": "STRUCTURAL_LOGS", "path": path, "value": entry}


class UfoCompat:
    """UFO's structural logs, the step ledger and the dict round trip, on a working copy."""

    def __init__(self, work: WorkingCopy, access: TypedAccess, record: Recorder) -> None:
        self._work = work
        self._access = access
        self._record = record

    def add_to_structural_logs(self, data: Mapping[str, Any]) -> None:
        """Append ``data`` under ``STRUCTURAL_LOGS[data["Round"]][data["SubtaskIndex"]]``.

        Ignored when either key is missing, as in UFO.
        """
        op = structural_op(data)
        if op is not None:
            self._record([op])

    def charge(self, increments: Mapping[Key, int | float], structural_log: Mapping[str, Any] | None = None) -> None:
        """A step's ledger as ONE change (see ``Context.charge``)."""
        entry = None if structural_log is None else structural_op(structural_log)
        with self._work.lock:
            ops = self._access.incr_ops(increments)
            if entry is not None:
                ops.append(entry)
            if ops:
                self._record(ops)

    def filter_structural_logs(self, round_key: int, subtask_key: int, keys: str | list[str]) -> list[Any]:
        """Values of ``keys`` (a str gives a list of values, a list gives a list of dicts)."""
        if not isinstance(keys, (str, list)):
            raise TypeError(f"keys must be a str or a list of str, got {type(keys).__name__}")
        work = self._work
        if "STRUCTURAL_LOGS" in work.state.packed:
            work.unpack("STRUCTURAL_LOGS")
        logs = work.state.names.get("STRUCTURAL_LOGS") or {}
        entries = (logs.get(int(round_key)) or {}).get(int(subtask_key)) or []
        if isinstance(keys, str):
            return [copy_json(entry.get(keys)) for entry in entries]
        return [{k: copy_json(entry.get(k)) for k in keys} for entry in entries]

    def to_dict(
        self, ensure_serializable: bool = False, *, copy: bool = True, stored_json: bool = False
    ) -> dict[str, Any]:
        """Every name's value (and ``_vars`` when there are context variables); see ``Context.to_dict``."""
        work = self._work
        out: dict[str, Any] = {}
        dropped: list[str] = []
        for member in ContextNames:
            if stored_json and member.durable:
                with work.lock:
                    packed = work.state.packed.get(member.value)
                    text = packed.whole_json() if packed is not None else None
                if text is not None:
                    out[member.value] = StoredJson(text)
                    continue
            if not member.durable:
                value = work.runtime.get(member.value)
                if ensure_serializable:
                    if value is not None:
                        dropped.append(member.value)
                    value = None
                out[member.value] = value
                continue
            out[member.value] = work.get(member) if copy else work.peek(member)
        if ensure_serializable:
            out = {k: (v.value if k == "WEAVING_MODE" and isinstance(v, Enum) else v) for k, v in out.items()}
        if work.state.vars:
            out["_vars"] = copy_json(work.state.vars) if copy else work.state.vars
        if dropped:
            warnings.warn(
                f"to_dict(ensure_serializable=True) left out runtime-only values: {', '.join(dropped)}",
                RuntimeWarning,
                stacklevel=3,
            )
        return out

    def from_dict(self, data: Mapping[str, Any]) -> None:
        """Load :meth:`to_dict` output (or its JSON round trip) as one change (see ``Context.from_dict``)."""
        if not isinstance(data, Mapping):
            raise TypeError(f"from_dict takes a dict (what to_dict gives), not {type(data).__name__}")
        items = dict(data)
        context_vars = items.pop("_vars", None) or {}
        unknown = [k for k in items if typed_name(k) is None]
        if unknown:
            warnings.warn(
                f"from_dict skipped {len(unknown)} key(s) that are not context names: {', '.join(map(repr, unknown))}",
                RuntimeWarning,
                stacklevel=3,
            )
        known: dict[ContextNames, Any] = {}
        for k, v in items.items():
            member = typed_name(k)
            if member is not None:
                known[member] = v
        values: dict[ContextNames, Any] = {}
        for member, value in known.items():
            if value is None:
                continue
            if member.derived and DERIVED_LEDGERS[member.value] in known:
                continue  # the ledger itself carries it
            if member.durable:
                value = member.restore(to_wire(value, member.value, int_keys=member.int_key_depth))
            values[member] = value
        if values:
            self._access.update_dict(values)  # every value checked, then set as one change (round id first)
        if context_vars:
            self._access.update_vars(set=context_vars)
