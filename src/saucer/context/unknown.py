"""A commit whose outcome is unknown (the connection broke in flight): settled before the next one.

The Context keeps its changes pending; before its next commit it reads the
version the lost commit would have written, and adopts the event if the store
has it (same time, author and operations) rather than write it twice. A commit
that wrote deferred events with its own (:mod:`saucer.context.staging`) was one
transaction: if its first event is there, all of it is.
"""

from __future__ import annotations

from dataclasses import replace

from saucer.context.events import Event, copy_json
from saucer.context.working import WorkingCopy
from saucer.store.model import OutcomeUnknownError

__all__ = ["UnknownOutcome"]


class UnknownOutcome:
    """The event of the last commit whose outcome is unknown, until it is settled."""

    def __init__(self) -> None:
        #: The event the lost commit wrote first (None: nothing to settle).
        self.event: Event | None = None
        # For a batch: how many events and pending operations it wrote.
        self._span: tuple[int, int] | None = None

    def forget(self) -> None:
        """The pending changes were dropped: nothing is left to settle."""
        self.event = self._span = None

    def remember(self, exc: OutcomeUnknownError, version: int, batch: tuple[int, int] | None) -> None:
        """``exc`` ended a commit based on ``version``; ``batch`` is its (events, operations) if it wrote several."""
        event = exc.event
        if event is None:
            return
        self.event = replace(event, ops=copy_json(event.ops))
        self._span = batch if batch is not None and event.version == version + 1 else None

    def settled(self, work: WorkingCopy) -> tuple[Event, int] | None:
        """Read whether the lost commit was written (may raise: try again later); if so, the event to
        adopt as written and how many pending operations it holds."""
        unknown = self.event
        if unknown is None:
            return None
        store, sid = work.require_store()
        written = next(iter(store.read(sid, unknown.version - 1, unknown.version)), None)
        span = self._span
        self.forget()
        count = len(unknown.ops)
        if (
            written is None
            or (written.timestamp, written.author, written.ops) != (unknown.timestamp, unknown.author, unknown.ops)
            or work.pending[:count] != unknown.ops
        ):
            return None
        if span is not None:  # the first event of a batch is there: so is the rest of it (one transaction)
            return replace(written, version=written.version + span[0] - 1), span[1]
        return written, count
