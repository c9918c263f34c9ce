"""Where a stored session continues: the engine cursors in its log.

Every commit the engine makes carries a *cursor* in its event ``meta``
(phase, round, plan step, the agent and state that act next, and the
session's counters). A resume continues after the newest one. Two kinds of
resume start from an older cursor instead, without rewriting anything:

- continuing a session that a limit **stopped** (``max_step``, ``max_round``)
  starts from the cursor before its end, and re-enters the round the limit
  cut short;
- retrying a **failed** session (``resume --retry-failed``) starts from the
  cursor before its failed step, so that step runs again; the failed attempt
  stays in the log.
"""

from __future__ import annotations

from typing import Any, Iterator

from saucer.context.events import Event
from saucer.engine.errors import EngineError
from saucer.store import EventStore

__all__ = ["Cursor", "last_cursor", "continue_cursor", "retry_cursor"]

Cursor = tuple[dict[str, Any] | None, dict[str, Any]]
"""A cursor and the meta of the event that carries it (``(None, {})``: none)."""

_FAILED_STATES = frozenset({"FAIL", "ERROR"})


def _backwards(store: EventStore, session_id: str, chunk: int = 16) -> Iterator[Event]:
    """The session's events (its lineage, for forks), newest first, read a few at a time."""
    version = store.head(session_id)
    while version > 0:
        low = max(0, version - chunk)
        yield from reversed(list(store.read(session_id, low, version)))
        version = low


def _cursor_of(event: Event) -> dict[str, Any] | None:
    cursor = event.meta.get("cursor")
    return cursor if isinstance(cursor, dict) else None


def last_cursor(store: EventStore, session_id: str) -> Cursor:
    """The newest engine cursor of the session and its event's meta."""
    for event in _backwards(store, session_id):
        cursor = _cursor_of(event)
        if cursor is not None:
            return cursor, event.meta
    return None, {}


def continue_cursor(store: EventStore, session_id: str) -> Cursor:
    """Where a stopped session continues: the cursor before its end.

    The end, session evaluations and the end of a round that the limit cut
    short (with that round's evaluation) are passed over, so the cut round
    resumes at its next step.
    """
    cut_round: Any = object()
    for event in _backwards(store, session_id):
        cursor = _cursor_of(event)
        if cursor is None:
            continue
        kind = event.meta.get("kind")
        if kind == "session_end" or (kind == "evaluation" and event.meta.get("scope") == "session"):
            continue
        if kind == "round_end" and event.meta.get("round_status") == "stopped":
            cut_round = event.round
            continue
        if kind == "evaluation" and event.round == cut_round:
            continue
        return cursor, event.meta
    return None, {}


def _failed_step(event: Event) -> bool:
    meta = event.meta
    if meta.get("kind") != "step":
        return False
    if meta.get("error") or meta.get("status") in _FAILED_STATES:
        return True
    return any(r.get("status") not in ("success", None) for r in meta.get("results") or [])


def retry_cursor(store: EventStore, session_id: str) -> Cursor:
    """Where a failed session retries: the cursor just before its last failed step.

    :class:`EngineError` when the session has no failed step (it failed
    before running one, e.g. with no request to work on).
    """
    found = False
    for event in _backwards(store, session_id):
        if not found:
            found = _failed_step(event)
            continue
        cursor = _cursor_of(event)
        if cursor is not None:
            return cursor, event.meta
    raise EngineError(f"session {session_id!r} has no failed step to run again")
