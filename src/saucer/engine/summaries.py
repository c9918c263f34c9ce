"""What each engine commit changes in its session's kept summary.

The store keeps, per session, the counters a listing shows (status, rounds,
steps, cost, reason: :mod:`saucer.store.summary`), but it never reads an
event's meta: each commit tells it, with a
:class:`~saucer.store.summary.SummaryDelta`. :func:`summary_of` makes that
delta from the meta the engine writes, so the engine's meta and the listings
agree by construction:

- ``session_status`` becomes the session's status;
- a ``round_end`` ends a round;
- the ``cost`` of a ``step`` or an ``evaluation`` adds to the total (a round's
  end repeats its steps' cost and adds nothing); a None cost makes the total
  unknown for good, as does ``cost_summary["unknown"]``;
- a ``session_end``'s ``summary`` (the engine's own final figures) replaces the
  rounds, steps and cost, and its reason wins;
- ``reason`` is the reason after the commit (none when absent).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from saucer.store.summary import SummaryDelta

__all__ = ["summary_of"]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def summary_of(meta: Mapping[str, Any]) -> SummaryDelta:
    """The summary delta of an engine commit whose meta is ``meta`` (see the module docs)."""
    kind = meta.get("kind")
    status = meta.get("session_status")
    status = status if isinstance(status, str) else None
    if kind == "step" and "cost" not in meta and "reason" not in meta and "cost_summary" not in meta:
        shared = _STATUS_ONLY.get(status)  # a step that cost nothing: its status alone (see below)
        if shared is not None:
            return shared
    cost_add, unknown = 0.0, False
    if kind in ("step", "evaluation") and "cost" in meta:
        if _number(meta["cost"]):
            cost_add = float(meta["cost"])
        elif meta["cost"] is None:
            unknown = True
    reason = meta.get("reason")
    reason = reason if isinstance(reason, str) and reason else None
    costs = meta.get("cost_summary")
    if costs is not None and isinstance(costs, Mapping) and costs.get("unknown"):
        unknown = True
    final = meta.get("summary")
    if kind == "session_end" and final is not None and isinstance(final, Mapping):
        return _final(final, status, cost_add, unknown, reason)
    if not (cost_add or unknown or reason or kind == "round_end"):
        # Most commits (every step of a session that costs nothing) change the status alone:
        # one delta each, shared (it is frozen), rather than a new one per commit.
        shared = _STATUS_ONLY.get(status)
        if shared is None:
            shared = _STATUS_ONLY.setdefault(status, SummaryDelta(status=status)) if len(_STATUS_ONLY) < 64 else None
        if shared is not None:
            return shared
    return SummaryDelta(
        status=status,
        rounds_add=1 if kind == "round_end" else 0,
        cost_add=cost_add,
        unknown=unknown,
        reason=reason,
    )


def _final(
    final: Mapping[str, Any], status: str | None, cost_add: float, unknown: bool, reason: str | None
) -> SummaryDelta:
    """The delta of a ``session_end`` whose ``summary`` (the engine's own final figures) is ``final``."""
    final_cost: float | None = None
    if "cost" in final:
        if _number(final["cost"]):
            final_cost = float(final["cost"])
        elif final["cost"] is None:
            unknown = True
    if isinstance(final.get("reason"), str) and final["reason"]:
        reason = final["reason"]
    return SummaryDelta(
        status=status,
        cost_add=cost_add,
        unknown=unknown,
        reason=reason,
        final_rounds=int(final["rounds"]) if _number(final.get("rounds")) else None,
        final_steps=int(final["steps"]) if _number(final.get("steps")) else None,
        final_cost=final_cost,
    )


#: The shared deltas that change the status alone, by status (a handful: running, finished...;
#: capped, should a caller make up statuses).
_STATUS_ONLY: dict[str | None, SummaryDelta] = {}
