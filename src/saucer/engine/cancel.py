"""Cancelling a running session from outside its process: a request in the session's log, honoured by its runner.

::

    request_cancel(store, "s1", author="user:alice", reason="wrong folder")   # saucer cancel, the viewer
    # the runner (another process, another host) sees it and ends the session between two steps:
    #   status "cancelled", reason "cancelled by user:alice: wrong folder"

A cancel is one event of the session (``meta["kind"] == "cancel_request"``,
``meta["cancel"]``: the reason), without operations, written by whoever asks:
attributable like any other write, and refused like any other to a
non-participant of a session that declares its participants. It is only taken
while the session runs (its runner holds a live lease), and appended on the
version that was checked, so it never lands after the session's end.

The runner follows its own log while it runs (:class:`CancelWatch`, over
:meth:`~saucer.store.EventStore.watch`: PostgreSQL's ``LISTEN``, else a read every 0.5 s).
On the first cancel request it stops: the step in flight finishes and commits
(a committed step is never half done), no other step starts, and the session
ends ``cancelled`` (:data:`CANCELLED`, the service's word for its cancel too),
its reason naming who cancelled. A step waiting for a person's approval does not
wait on: the session's pending approvals are refused, by the canceller, so the
step goes on without running its command.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from saucer.engine.approvals import ApprovalError, NotAllowedToDecide, check_decider, decide, read_approvals
from saucer.engine.status import stored_status
from saucer.store import ConflictError, Event, EventStore, SessionNotFoundError, StoreError

__all__ = [
    "CANCEL_KIND",
    "CANCELLED",
    "CancelError",
    "CancelRequest",
    "CancelWatch",
    "NotAllowedToCancel",
    "cancel_of",
    "request_cancel",
]

_log = logging.getLogger("saucer.engine")

CANCEL_KIND = "cancel_request"
"""``meta["kind"]`` of the event that asks a running session to stop."""
CANCELLED = "cancelled"
"""The status a cancelled session ends with (the service's cancel ends with it too)."""
_REASON_CHARS = 500
_MAX_TRIES = 50
_POLL_INTERVAL = 0.5  # as an approval's wait reads the log


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
        return f"cancelled by {self.author}" + (f": {self.reason}" if self.reason else "")


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


def request_cancel(store: EventStore, session_id: str, *, author: str, reason: str = "") -> CancelRequest:
    """Record ``author``'s request that the running session stop; return it.

    :class:`CancelError` (one sentence) when there is no such session or it is
    not running (ended, interrupted, not started); :class:`NotAllowedToCancel`
    when ``author`` may not write to it. The event is appended on the version
    these were checked at (a write meanwhile: checked again), so it is never
    recorded after the session's end.
    """
    if not author.strip():
        raise CancelError("a cancel needs an author (who cancels)")
    reason = reason.strip()[:_REASON_CHARS]
    for _ in range(_MAX_TRIES):
        try:
            head = store.head(session_id)
            status = stored_status(store, session_id)
        except SessionNotFoundError:
            raise CancelError(f"no session {session_id!r} in this store") from None
        if status.status != "running" or status.holder is None:
            raise CancelError(f"session {session_id!r} is not running ({status.status}): there is nothing to cancel")
        try:
            check_decider(store, session_id, author, head)
        except NotAllowedToDecide as exc:
            raise NotAllowedToCancel(str(exc)) from None
        try:
            event = store.append(
                session_id, head, [], author=author, meta={"kind": CANCEL_KIND, "cancel": {"reason": reason}}
            )
        except ConflictError:
            continue  # the runner (or someone) wrote meanwhile: check again
        found = cancel_of(event)
        assert found is not None
        return found
    raise CancelError(f"session {session_id!r}: too many concurrent writers to record a cancel")


class CancelWatch:
    """A running session's watch on its own log for a cancel request (see the module docs).

    :attr:`request` is the first cancel request seen (None until one is);
    ``on_cancel(request)`` is called once when it is seen."""

    def __init__(self) -> None:
        self.request: CancelRequest | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def reason(self) -> str | None:
        """Why the session must stop (``cancelled by ...``), or None while nobody asked."""
        return self.request.text() if self.request is not None else None

    def start(
        self,
        store: EventStore,
        session_id: str,
        after: int,
        on_cancel: Callable[[CancelRequest], None] | None = None,
        *,
        interval: float | None = None,
    ) -> None:
        """Follow the session's log after version ``after`` until a cancel request (or :meth:`stop`);
        a store without notifications is read every ``interval`` seconds (default 0.5)."""
        if self._task is None:
            every = _POLL_INTERVAL if interval is None else interval
            self._task = asyncio.create_task(
                self._follow(store, session_id, after, on_cancel, every), name=f"cancel-watch-{session_id}"
            )

    async def stop(self) -> None:
        """Stop following the log (the session is closing)."""
        task, self._task = self._task, None
        if task is None:
            return
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):  # (an error of the watch is retrieved too)
            await task

    async def _follow(
        self,
        store: EventStore,
        session_id: str,
        after: int,
        on_cancel: Callable[[CancelRequest], None] | None,
        interval: float,
    ) -> None:
        stream = store.watch(session_id, after, interval=interval)
        try:
            async for event in stream:
                found = cancel_of(event)
                if found is None:
                    continue
                self.request = found
                _log.info("session %s: %s (version %d)", session_id, found.text(), found.version)
                if on_cancel is not None:
                    on_cancel(found)
                await asyncio.to_thread(_refuse_pending, store, found)
                return
        except StoreError as exc:  # the store went away: the session cannot be cancelled from outside any more
            _log.warning("session %s: stopped watching for a cancel: %s", session_id, exc)
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]  # an async generator; the type says iterator


def _refuse_pending(store: EventStore, request: CancelRequest) -> None:
    """Refuse the session's pending approvals in the canceller's name: the step waiting on one goes on."""
    try:
        pending = [a for a in read_approvals(store, request.session_id) if a.pending and a.kind == "approval"]
    except ApprovalError:
        return
    for approval in pending:
        try:
            decide(
                store,
                request.session_id,
                approval.number,
                status="refused",
                author=request.author,
                note=f"the session was {request.text()}",
            )
        except (ApprovalError, StoreError) as exc:  # decided meanwhile: what the log says counts
            _log.info("session %s: approval %d not refused on cancel: %s", request.session_id, approval.number, exc)
        except Exception:  # noqa: BLE001 - never let the watch kill the session
            _log.exception("session %s: refusing approval %d on cancel failed", request.session_id, approval.number)
