"""Cancelling a running session from outside its process: an out-of-turn write in its log, honoured by its runner.

::

    request_cancel(store, "s1", author="user:alice", reason="wrong folder")   # saucer cancel, the viewer
    # the runner (another process, another host) sees it and ends the session between two steps:
    #   status "cancelled", reason "cancelled by user:alice: wrong folder"

A cancel is one event of the session, written by whoever asks, through the
same shared-state path as any participant's write: it sets the context
variable :data:`CANCEL_VAR` (who, why, when) and says ``meta["kind"] ==
"cancel_request"``. It is attributable like any other write, and refused like
any other to a non-participant of a session that declares its participants.
It is only taken while the session runs (its runner holds a live lease), and
appended on the version that was checked, so it never lands after the
session's end.

The runner reads nothing more for it: its Context takes in out-of-turn writes
as it commits (a serialised commit is ordered after them, and the next step
sees them), so before each step it looks at the variable (:func:`cancel_reason`).
Once it is set, the step in flight has finished and committed (a committed
step is never half done), no other step starts, and the session ends
``cancelled`` (:data:`CANCELLED`, the service's word for its cancel too), its
reason naming who cancelled. A step waiting for a person's approval does not
wait on: the waiter, which follows the log, sees the cancel and the approval is
refused in the canceller's name (:func:`saucer.engine.approvals.wait_for_decision`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from saucer.context import Context
from saucer.engine.status import stored_status
from saucer.store import ConflictError, Event, EventStore, NotParticipantError, SessionNotFoundError

__all__ = [
    "CANCEL_KIND",
    "CANCEL_VAR",
    "CANCELLED",
    "CancelError",
    "CancelRequest",
    "NotAllowedToCancel",
    "cancel_of",
    "cancel_reason",
    "cancelled_by",
    "request_cancel",
]

CANCEL_KIND = "cancel_request"
"""``meta["kind"]`` of the event that asks a running session to stop."""
CANCEL_VAR = "saucer.cancel"
"""The context variable a cancel sets: ``{"by": author, "reason": text, "at": epoch seconds}``."""
CANCELLED = "cancelled"
"""The status a cancelled session ends with (the service's cancel ends with it too)."""
_REASON_CHARS = 500
_MAX_TRIES = 50


class CancelError(Exception):
    """A cancel that was not recorded: one sentence saying why (no such session, not running)."""


class NotAllowedToCancel(CancelError):
    """The author is not a participant of a session that declares its participants."""


@dataclass(frozen=True)
class CancelRequest:
    """One cancel request, as its event says."""

    session_id: str
    version: int
    author: str
    reason: str
    requested_at: float

    def text(self) -> str:
        """What the session's end says: ``cancelled by AUTHOR`` and the reason when one was given."""
        return _text(self.author, self.reason)


def _text(author: str, reason: str) -> str:
    return f"cancelled by {author}" + (f": {reason}" if reason else "")


def cancel_of(event: Event) -> CancelRequest | None:
    """The cancel request ``event`` records (None for any other event)."""
    if event.meta.get("kind") != CANCEL_KIND:
        return None
    data = event.meta.get("cancel")
    reason = data.get("reason") if isinstance(data, dict) else None
    return CancelRequest(
        session_id=event.session_id,
        version=event.version,
        author=event.author,
        reason=reason if isinstance(reason, str) else "",
        requested_at=event.timestamp,
    )


def cancelled_by(context: Context, before: Any = None) -> tuple[str, str] | None:
    """``(who cancelled, what the end says)`` from the cancel variable of ``context``'s session, or None: not
    set, or still holding ``before`` (what it held when this run opened the session: a fork copies its parent's)."""
    value = context.get_var(CANCEL_VAR)
    if not isinstance(value, dict) or value == before:
        return None
    author = str(value.get("by") or "someone")
    reason = value.get("reason")
    return author, _text(author, reason if isinstance(reason, str) else "")


class CancelWatch:
    """A run's view of its session's cancel variable: what it held when the run opened the session
    (a fork copies its parent's: not a cancel of this run), and who has cancelled the run since."""

    def __init__(self) -> None:
        self.before: Any = None

    def opened(self, context: Context) -> None:
        """The run opened its session's Context: what the variable holds now is not a cancel of it."""
        self.before = context.get_var(CANCEL_VAR)

    def by(self, context: Context | None) -> tuple[str, str] | None:
        """``(who cancelled, what the end says)``, or None (also before the run opens its Context)."""
        if context is None or context.get_var(CANCEL_VAR) is None:  # not cancelled (asked before every step)
            return None
        return cancelled_by(context, self.before)


def cancel_reason(context: Context, before: Any = None) -> str | None:
    """Why the session of ``context`` must stop (``cancelled by ...``), or None (see :func:`cancelled_by`)."""
    found = cancelled_by(context, before)
    return found[1] if found is not None else None


def request_cancel(store: EventStore, session_id: str, *, author: str, reason: str = "") -> CancelRequest:
    """Record ``author``'s request that the running session stop; return it.

    :class:`CancelError` (one sentence) when there is no such session or it is
    not running (ended, interrupted, not started); :class:`NotAllowedToCancel`
    when ``author`` may not write to it. The write is committed on the version
    these were checked at (a write meanwhile: checked again), so it is never
    recorded after the session's end.
    """
    if not author.strip():
        raise CancelError("a cancel needs an author (who cancels)")
    reason = reason.strip()[:_REASON_CHARS]
    for _ in range(_MAX_TRIES):
        _check_running(store, session_id)  # (a refusal opens no Context)
        ctx = Context.open(store, session_id, author=author, create=False)
        try:
            _check_running(store, session_id)  # at ctx's version or newer (then the commit conflicts)
            ctx.update_vars(set={CANCEL_VAR: {"by": author, "reason": reason, "at": time.time()}})
            try:
                version = int(ctx.commit(author=author, meta={"kind": CANCEL_KIND, "cancel": {"reason": reason}}))
            except ConflictError:
                continue  # the runner (or someone) wrote meanwhile: check again
            except NotParticipantError as exc:
                raise NotAllowedToCancel(str(exc)) from None
        finally:
            ctx.abort()  # nothing pending after a commit; after a refusal or a conflict, what was not written
        [event] = list(store.read(session_id, version - 1, version))
        found = cancel_of(event)
        assert found is not None
        return found
    raise CancelError(f"session {session_id!r}: too many concurrent writers to record a cancel")


def _check_running(store: EventStore, session_id: str) -> None:
    try:
        status = stored_status(store, session_id)
    except SessionNotFoundError:
        raise CancelError(f"no session {session_id!r} in this store") from None
    if status.status != "running" or status.holder is None:
        raise CancelError(f"session {session_id!r} is not running ({status.status}): there is nothing to cancel")
