"""Out-of-turn writes of context variables by a person (``saucer set``, the viewer's forms).

One function, :func:`write_vars`, so that the CLI and the viewer record a
write the same way: one event of kind ``vars`` with its author, carrying an
ended session's end (status, summary, reason) so that the newest event still
says how the session ended.
"""

from __future__ import annotations

from typing import Any

from saucer.context import Context
from saucer.engine.summaries import summary_of
from saucer.store import ConflictError, EventStore

__all__ = ["standing_end", "write_vars"]


def standing_end(store: EventStore, session_id: str) -> dict[str, Any]:
    """For a write after a session's end: its end's status, summary and reason, carried by the
    write's event so that the newest event still says how the session ended."""
    from saucer.engine.status import stored_status

    status = stored_status(store, session_id)
    if not status.ended:
        return {}
    carried: dict[str, Any] = {"session_status": status.status}
    if status.summary:
        carried["summary"] = dict(status.summary)
        if isinstance(status.summary.get("reason"), str):
            carried["reason"] = status.summary["reason"]
    return carried


def write_vars(store: EventStore, session_id: str, values: dict[str, Any], deleted: list[str], author: str) -> int:
    """Commit the sets and deletes as one event by ``author``; return its version.

    Blind writes: after another writer's commit they are simply written again
    on top of it (concurrent writes serialise in log order). Raises
    :class:`~saucer.context.commit.NotParticipantError` for an author a
    session declaring participants does not name, and ValueError/TypeError
    for a value the Context refuses.
    """
    carried = standing_end(store, session_id)
    with Context.open(store, session_id, author=author, create=False) as ctx:
        for attempt in range(20):
            ctx.update_vars(set=values, delete=deleted)
            try:
                return int(
                    ctx.commit(author=author, meta=(meta := {"kind": "vars", **carried}), summary=summary_of(meta))
                )
            except ConflictError:
                if attempt == 19:
                    raise
                ctx.reload()
    raise AssertionError("unreachable")
