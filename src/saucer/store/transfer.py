"""Export a session's whole log and final state as JSON data, and import it back.

An export flattens a fork's lineage, so the file stands on its own.
"""

from __future__ import annotations

from typing import Any, Mapping

from saucer.context.events import Event, State, apply_ops
from saucer.store.base import EventStore, SessionInfo, StoreError

__all__ = ["FORMAT", "export_session", "import_session"]

#: Identifies the export format; bumped on incompatible changes.
FORMAT = "saucer.session/1"


def export_session(store: EventStore, session_id: str, state: Mapping[str, Any]) -> dict[str, Any]:
    """The session's info, every event of its lineage, and ``state`` (its final state)."""
    info = store.session_info(session_id)
    return {
        "format": FORMAT,
        "session": {
            "session_id": info.session_id,
            "version": info.version,
            "created_at": info.created_at,
            "updated_at": info.updated_at,
            "parent_id": info.parent_id,
            "parent_version": info.parent_version,
            "meta": info.meta,
        },
        "events": [event.to_dict() for event in store.read(session_id)],
        "state": dict(state),
    }


def import_session(store: EventStore, data: Mapping[str, Any], session_id: str | None = None) -> SessionInfo:
    """Recreate an exported session (as ``session_id`` if given); return its info.

    Events keep their versions, authors, rounds, steps and timestamps.
    Raises ValueError naming the field when ``data`` is not an export.
    """
    if not isinstance(data, Mapping) or data.get("format") != FORMAT:
        raise ValueError(f"not a saucer session export (expected \"format\": \"{FORMAT}\")")
    session = data.get("session")
    events = data.get("events")
    if not isinstance(session, Mapping) or not isinstance(session.get("session_id"), str):
        raise ValueError("export field 'session.session_id' is missing or not a string")
    if not isinstance(events, list):
        raise ValueError("export field 'events' must be a list")
    target = session_id or session["session_id"]
    meta = dict(session.get("meta") or {})
    meta["imported_from"] = session["session_id"]
    parsed: list[Event] = []
    state = State()
    for index, raw in enumerate(events):
        try:
            parsed.append(
                Event(
                    session_id=target,
                    version=int(raw["version"]),
                    timestamp=float(raw["timestamp"]),
                    author=str(raw["author"]),
                    round=raw.get("round"),
                    step=raw.get("step"),
                    ops=list(raw["ops"]),
                    meta=dict(raw.get("meta") or {}),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"export field 'events[{index}]' is malformed: {exc!s}") from None
        try:
            apply_ops(state, parsed[-1].ops)  # refuse what could not be replayed later
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise ValueError(f"export field 'events[{index}].ops' cannot be replayed: {exc!r}") from None
        if parsed[-1].version != index + 1:
            raise ValueError(f"export field 'events[{index}].version' is {parsed[-1].version}, expected {index + 1}")
    store.create_session(target, meta=meta)
    try:
        for event in parsed:
            store._append(event, event.version - 1, None)
    except (StoreError, ValueError):
        store.delete_session(target)
        raise
    return store.session_info(target)
