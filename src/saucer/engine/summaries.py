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
    cost_add, unknown = 0.0, False
    if kind in ("step", "evaluation") and "cost" in meta:
        if _number(meta["cost"]):
            cost_add = float(meta["cost"])
        elif meta["cost"] is None:
            unknown = True
    reason = meta.get("reason")
    final_rounds = final_steps = None
    final_cost: float | None = None
    final = meta.get("summary")
    if kind == "session_end" and isinstance(final, Mapping):
        final_rounds = int(final["rounds"]) if _number(final.get("rounds")) else None
        final_steps = int(final["steps"]) if _number(final.get("steps")) else None
        if "cost" in final:
            if _number(final["cost"]):
                final_cost = float(final["cost"])
            elif final["cost"] is None:
                unknown = True
        if isinstance(final.get("reason"), str) and final["reason"]:
            reason = final["reason"]
    costs = meta.get("cost_summary")
    if isinstance(costs, Mapping) and costs.get("unknown"):
        unknown = True
    return SummaryDelta(
        status=status if isinstance(status, str) else None,
        rounds_add=1 if kind == "round_end" else 0,
        cost_add=cost_add,
        unknown=unknown,
        reason=reason if isinstance(reason, str) and reason else None,
        final_rounds=final_rounds,
        final_steps=final_steps,
        final_cost=final_cost,
    )
