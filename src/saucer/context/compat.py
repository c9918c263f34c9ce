"""UFO's Context API beyond ``get``/``set``: what UFO's documentation shows.

The writable ``current_round_*`` properties (over the per-round ledgers), the
structural logs (``add_to_structural_logs``/``filter_structural_logs``, keyed
by round and subtask as UFO's writers and readers should have agreed),
``attach_command_dispatcher``, and ``to_dict``/``from_dict``, whose output
keeps int round ids ints and leaves runtime-only objects out when asked to be
serialisable (see ARCHITECTURE.md, "Compatibility with UFO's documented Context").
"""

from __future__ import annotations

import functools
import types
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Self

from saucer.context.access import TypedAccess
from saucer.context.events import StoredJson, copy_json, to_wire
from saucer.context.names import DERIVED_LEDGERS, ContextNames, typed_name

__all__ = ["UfoCompat"]


class _ClassOrInstance:
    """A method that acts on the instance it is called on, or on a new instance when called on the class."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]  # a descriptor object, not a function

    def __get__(self, obj: Any, cls: type) -> Callable[..., Any]:
        return types.MethodType(self.fn, cls() if obj is None else obj)


class UfoCompat(TypedAccess):
    """UFO's derived properties, structural logs, dispatcher and dict round trip."""

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
        op = self._structural_op(data)
        if op is not None:
            self._record([op])

    def charge(
        self, increments: Mapping[ContextNames | str, int | float], structural_log: Mapping[str, Any] | None = None
    ) -> None:
        """A step's ledger as ONE change: add each ``by`` of ``increments`` (``{name or var: by}``)
        as :meth:`incr` does, and append ``structural_log`` as :meth:`add_to_structural_logs`
        does; everything is checked before anything is applied (the engine charges each step so)."""
        entry = None if structural_log is None else self._structural_op(structural_log)
        with self._lock:
            ops = [self._incr_op(key, by)[0] for key, by in increments.items()]
            if entry is not None:
                ops.append(entry)
            if ops:
                self._record(ops)

    @staticmethod
    def _structural_op(data: Mapping[str, Any]) -> dict[str, Any] | None:
        """The operation appending ``data`` to the structural logs (None without Round or SubtaskIndex)."""
        round_key = data.get("Round")
        subtask_key = data.get("SubtaskIndex")
        if round_key is None or subtask_key is None:
            return None
        try:
            path = [int(round_key), int(subtask_key)]
        except (TypeError, ValueError):
            raise TypeError(
                f"structural log keys Round/SubtaskIndex must be ints, got {round_key!r}/{subtask_key!r}"
            ) from None
        return {
            "op": "append",
            "name": "STRUCTURAL_LOGS",
            "path": path,
            "value": to_wire(dict(data), "STRUCTURAL_LOGS"),
        }

    def filter_structural_logs(self, round_key: int, subtask_key: int, keys: str | list[str]) -> list[Any]:
        """Values of ``keys`` (a str gives a list of values, a list gives a list of dicts)."""
        if not isinstance(keys, (str, list)):
            raise TypeError(f"keys must be a str or a list of str, got {type(keys).__name__}")
        if "STRUCTURAL_LOGS" in self._state.packed:
            self._unpack("STRUCTURAL_LOGS")
        logs = self._state.names.get("STRUCTURAL_LOGS") or {}
        entries = (logs.get(int(round_key)) or {}).get(int(subtask_key)) or []
        if isinstance(keys, str):
            return [copy_json(entry.get(keys)) for entry in entries]
        return [{k: copy_json(entry.get(k)) for k in keys} for entry in entries]

    def attach_command_dispatcher(self, dispatcher: Any) -> None:
        """Make ``dispatcher`` available to agents as ``context.command_dispatcher`` (runtime only)."""
        self.command_dispatcher = dispatcher

    # ========================================================= serialisation

    def to_dict(
        self, ensure_serializable: bool = False, *, copy: bool = True, stored_json: bool = False
    ) -> dict[str, Any]:
        """Every name's value (and ``_vars`` when there are context variables).

        With ``ensure_serializable=True`` runtime-only names are None and one
        warning lists those that held an object. With ``copy=False`` the
        values are the Context's own, not copies: for writing them out at
        once (``saucer export`` of a long session would otherwise hold its
        state twice); changing them would change the Context behind its back.
        With ``stored_json=True`` a large value that the snapshot read stores
        whole and nothing changed since is given as its compact JSON text
        (:class:`~saucer.context.events.StoredJson`), never decoded: for
        showing a long session's state without building it.
        """
        out: dict[str, Any] = {}
        dropped: list[str] = []
        for member in ContextNames:
            if stored_json and member.durable:
                with self._lock:
                    packed = self._state.packed.get(member.value)
                    text = packed.whole_json() if packed is not None else None
                if text is not None:
                    out[member.value] = StoredJson(text)
                    continue
            if not member.durable:
                value = self._runtime.get(member.value)
                if ensure_serializable:
                    if value is not None:
                        dropped.append(member.value)
                    value = None
                out[member.value] = value
                continue
            out[member.value] = self.get(member) if copy else self._peek(member)  # type: ignore[attr-defined]
        if ensure_serializable:
            out = {k: (v.value if k == "WEAVING_MODE" else v) for k, v in out.items()}
        if self._state.vars:
            out["_vars"] = copy_json(self._state.vars) if copy else self._state.vars
        if dropped:
            warnings.warn(
                f"to_dict(ensure_serializable=True) left out runtime-only values: {', '.join(dropped)}",
                RuntimeWarning,
                stacklevel=2,
            )
        return out

    @_ClassOrInstance
    def from_dict(self, data: Mapping[str, Any]) -> Self:
        """Load :meth:`to_dict` output (or its JSON round trip): ``Context.from_dict(d)`` gives
        a new detached Context; ``ctx.from_dict(d)`` (UFO's form) loads into ``ctx`` and returns it.

        The names present are set (a None value is skipped), context variables (``_vars``)
        too, as one change on a Context bound to a store. A key that is neither a
        :class:`ContextNames` name nor ``_vars`` is skipped with one warning naming them all,
        as UFO skips it (not a KeyError).
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"from_dict takes a dict (what to_dict gives), not {type(data).__name__}")
        items = dict(data)
        context_vars = items.pop("_vars", None) or {}
        unknown = [k for k in items if typed_name(k) is None]
        if unknown:
            warnings.warn(
                f"from_dict skipped {len(unknown)} key(s) that are not context names: {', '.join(map(repr, unknown))}",
                RuntimeWarning,
                stacklevel=2,
            )
        known = {typed_name(k): v for k, v in items.items() if typed_name(k) is not None}
        values: dict[ContextNames, Any] = {}
        for member, value in known.items():
            assert member is not None
            if value is None:
                continue
            if member.derived and DERIVED_LEDGERS[member.value] in known:
                continue  # the ledger itself carries it
            if member.durable:
                value = member.restore(to_wire(value, member.value, int_keys=member.int_key_depth))
            values[member] = value
        if values:
            self.update_dict(values)  # every value checked, then set as one change (round id first)
        if context_vars:
            self.update_vars(set=context_vars)
        return self

    def _sync_round_values(self) -> None:
        """UFO's way to copy the current round's step, cost and subtask count into their
        ``CURRENT_ROUND_*`` names; a documented no-op here: those values are derived from the
        per-round ledgers when they are read (reads never write), so they are always in sync."""
