"""A stored session's status, as readers see it.

An engine session records ``running`` while it runs and its final status in
its last event (``session_end``). A session whose runner vanished (a crash, a
kill, Ctrl-C) has no end event; it is *interrupted* once its runner's lease
has expired. That is derived here, when the session is read, and never
written: the log only ever says what a runner actually did.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from saucer.store import EventStore, SessionHead, SessionInfo
from saucer.store.summary import ENDED, INTERRUPTED, NOT_STARTED, listed_status  # one rule: the store's listing

__all__ = ["StoredStatus", "stored_status", "status_of", "INTERRUPTED", "ENDED", "NOT_STARTED"]


@dataclass(frozen=True)
class StoredStatus:
    """What a stored session's last event and lease say about it."""

    status: str
    summary: dict[str, Any] = field(default_factory=dict)
    holder: str | None = None  # the runner holding a live lease, while running

    @property
    def ended(self) -> bool:
        return self.status in ENDED


def stored_status(store: EventStore, info: SessionInfo | str) -> StoredStatus:
    """The status of a session (``-`` for a session the engine did not create)."""
    if isinstance(info, str):
        info = store.session_info(info)
    last = next(iter(store.read(info.session_id, info.version - 1, info.version)), None) if info.version else None
    status = info.meta.get("status")
    if last is not None and last.version > _fork_point(info):
        status = last.meta.get("session_status", status)
    lease = None if status is None or status in ENDED else store.lease_of(info.session_id)
    return status_of(SessionHead(info, last, lease))


def status_of(head: SessionHead, now: float | None = None) -> StoredStatus:
    """The status of a session from its row, its newest event and its lease (no reads):
    what :func:`stored_status` says, for a listing made by :meth:`EventStore.session_heads`."""
    info, last = head.info, head.last
    summary: dict[str, Any] = dict(info.meta.get("summary") or {})
    status = info.meta.get("status")
    if last is not None and last.version <= _fork_point(info):
        # A fork that has not run: its newest event is its parent's, whose status is not the fork's.
        summary.update(last.meta.get("summary") or {})
        return StoredStatus("-" if status is None else str(status), summary)
    if last is not None:
        summary.update(last.meta.get("summary") or {})
        status = last.meta.get("session_status", status)
        if (last.meta.get("cost_summary") or {}).get("unknown") and "cost" in summary:
            summary["cost"] = None  # older ends stored the known part as the total
    lease = head.lease
    listed, runner = listed_status(  # the store's listing rule, the one place "interrupted" is decided
        None if status is None else str(status),
        None if lease is None else lease.owner,
        None if lease is None else lease.expires_at,
        time.time() if now is None else now,
    )
    return StoredStatus(listed, summary, runner)


def _fork_point(info: SessionInfo) -> int:
    """The version a fork branched at (its parent's newest it reads); -1 for a session that is no fork."""
    at = (
        info.parent_version
        if info.parent_id is not None
        else info.meta.get("at")
        if info.meta.get("forked_from")
        else None
    )
    return at if isinstance(at, int) and not isinstance(at, bool) else -1
