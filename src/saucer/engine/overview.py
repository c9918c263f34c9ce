"""What a stored session looks like to readers: its row in a listing, and its timeline as data.

Shared by the terminal (``saucer sessions``, ``saucer show --json``) and the
web viewer (:mod:`saucer.ui`), so both show the same numbers. Nothing here
reads the store more than the caller asked: a listing is built from
:meth:`~saucer.store.EventStore.session_heads` (one query for every session),
a timeline from events already read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from saucer.engine.status import status_of
from saucer.store import Event, SessionHead

__all__ = ["session_row", "timeline_data", "timeline_items", "RoundTally", "EVENT_FIELDS"]


def session_row(head: SessionHead, now: float | None = None) -> dict[str, Any]:
    """A session's columns: id, task, mode, status, rounds, steps, cost, version, times, parent, runner, request, reason.

    ``status`` is ``interrupted`` for a session whose runner vanished (see
    :mod:`saucer.engine.status`); ``cost`` is None when it is unknown;
    ``created_at`` and ``updated_at`` are epoch seconds.
    """
    info = head.info
    meta = info.meta
    state = status_of(head, now)
    summary = state.summary
    cost = summary.get("cost")
    return {
        "id": info.session_id,
        "task": meta.get("task", "-"),
        "mode": meta.get("mode", "-"),
        "status": state.status,
        "rounds": summary.get("rounds"),
        "steps": summary.get("steps"),
        "cost": cost if isinstance(cost, (int, float)) and not isinstance(cost, bool) else None,
        "version": info.version,
        "created_at": info.created_at,
        "updated_at": info.updated_at,
        # A fork that stands alone (its parent was pruned) keeps its origin in its meta.
        "parent": f"{info.parent_id}@{info.parent_version}"
        if info.parent_id
        else f"{meta['forked_from']}@{meta.get('at')}"
        if meta.get("forked_from")
        else None,
        "runner": state.holder,
        "request": meta.get("request") if isinstance(meta.get("request"), str) else None,
        "reason": summary.get("reason") or (head.last.meta.get("reason") if head.last is not None else None) or None,
    }


#: The fields of an event's meta that the timeline carries as they are.
EVENT_FIELDS = (
    "agent",
    "state",
    "status",
    "next_agent",
    "next_state",
    "subtask",
    "plan_index",
    "error",
    "request",
    "round_status",
    "session_status",
    "reason",
    "scope",
    "verdict",
    "summary",
    "continues",
    "artifacts",
    "skipped",
)


def timeline_data(events: list[Event]) -> dict[str, Any]:
    """The timeline as data (``saucer show --json``): every event in order, and a summary per round.

    An event has its version, time, author, round, step and kind, what the
    engine recorded (agent, state, status, subtask, commands each with its
    result, cost — None when unknown —, error...) and its Context operations.
    """
    tally = RoundTally()
    items = [tally.add(item) for item in timeline_items(events)]
    return {"rounds": tally.rounds, "events": items}


def timeline_items(events: Iterable[Event]) -> Iterator[dict[str, Any]]:
    """Each event of :func:`timeline_data` as it comes (a stream: nothing is kept)."""
    for event in events:
        meta = event.meta
        kind = meta.get("kind") or ("step" if event.step is not None else "change")
        item: dict[str, Any] = {
            "version": event.version,
            "time": event.timestamp,
            "author": event.author,
            "round": event.round,
            "step": event.step,
            "kind": kind,
        }
        item.update({name: meta[name] for name in EVENT_FIELDS if name in meta})
        if "cost" in meta:
            item["cost"] = meta["cost"]
        results = meta.get("results") or []
        if meta.get("commands"):
            item["commands"] = [
                {**command, "result": results[i] if i < len(results) else None}
                for i, command in enumerate(meta["commands"])
            ]
        item["ops"] = event.ops
        yield item


class RoundTally:
    """The per-round summary of :func:`timeline_data` (request, status, steps), from its items one by one."""

    def __init__(self) -> None:
        #: One entry per round, in the order the rounds first appear (filled as items are added).
        self.rounds: list[dict[str, Any]] = []
        self._by_round: dict[int, dict[str, Any]] = {}

    def add(self, item: dict[str, Any]) -> dict[str, Any]:
        """Count one item of :func:`timeline_items`; returns it."""
        number = item["round"]
        if number is not None:
            entry = self._by_round.get(number)
            if entry is None:
                entry = self._by_round[number] = {"round": number, "request": None, "status": None, "steps": 0}
                self.rounds.append(entry)
            kind = item["kind"]
            if kind == "round_start":
                entry["request"] = item.get("request")
            elif kind == "step":
                entry["steps"] += 1
            elif kind == "round_end":
                entry["status"] = item.get("round_status")
        return item
