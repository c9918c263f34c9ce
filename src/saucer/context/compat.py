"""UFO's Context API beyond ``get``/``set``: what UFO's documentation shows.

The writable ``current_round_*`` properties (over the per-round ledgers), the
structural logs (``add_to_structural_logs``/``filter_structural_logs``, keyed
by round and subtask as UFO's writers and readers should have agreed),
``attach_command_dispatcher``, and ``to_dict``/``from_dict``, whose output
keeps int round ids ints and leaves runtime-only objects out when asked to be
serialisable (see ARCHITECTURE.md, "Compatibility with UFO's documented Context").
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping, Self

from saucer.context.access import TypedAccess
from saucer.context.events import StoredJson, copy_json, to_wire
from saucer.context.names import DERIVED_LEDGERS, ContextNames, lookup

__all__ = ["UfoCompat"]


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

    def to_dict(self, ensure_serializable: bool = False, *, copy: bool = True, stored_json: bool = False) -> dict[str, Any]:
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

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """A new detached Context from :meth:`to_dict` output (or its JSON round trip)."""
        ctx = cls()
        items = dict(data)
        context_vars = items.pop("_vars", None) or {}
        ordered = sorted(items.items(), key=lambda kv: kv[0] != "CURRENT_ROUND_ID")
        for key, value in ordered:
            member = lookup(key)
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
