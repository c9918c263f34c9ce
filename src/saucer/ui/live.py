"""The viewer's live pages: a session's new steps as server-sent events, as they commit.

One stream per open session page (``/sessions/{id}/stream?after=V``): each new
event is rendered as its timeline item (and its round, the first time), so the
page appends it as it is. A reconnecting ``EventSource`` continues after the
last step it received (``Last-Event-ID``). Each principal holds at most
``max_streams`` open at once (429 past it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response

from saucer.store import EventStore, SessionNotFoundError, StoreError, VersionNotFoundError
from saucer.ui.render import render
from saucer.ui.steps import item_of, new_round

__all__ = ["DEFAULT_MAX_STREAMS", "Guard", "LiveStreams", "NotFound", "SignIn", "int_param"]

#: Live pages (server-sent event streams) one principal may hold open at once.
DEFAULT_MAX_STREAMS = 16

#: The viewer's access check: (request, session id) -> (principal, the ids it may see); raises
#: :class:`SignIn` or :class:`NotFound`.
Guard = Callable[[Request, str | None], Awaitable[tuple[str | None, set[str] | None]]]


class SignIn(Exception):
    """The request needs a sign-in first."""


class NotFound(Exception):
    """What was asked for is not there for this principal (or at all: the two look the same)."""


def int_param(request: Request, name: str) -> int | None:
    """The query parameter ``name`` as a version number (None when absent); ValueError when it is not one."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a version number") from None


def _round_key(round_id: Any) -> str:
    return "r-" + ("none" if round_id is None else str(round_id))


class LiveStreams:
    """The ``stream`` handler over one store, counting each principal's open streams."""

    def __init__(self, store: EventStore, guard: Guard, max_streams: int = DEFAULT_MAX_STREAMS) -> None:
        self.store = store
        self.guard = guard
        self.max_streams = max_streams
        #: Open live streams per principal (None: the one user of a viewer without tokens).
        self.streams: dict[str | None, int] = {}

    async def stream(self, request: Request) -> Response:
        """Server-sent events: ``step`` (one new timeline item, as HTML) for each new event, until the session ends."""
        sid = request.path_params["session_id"]
        try:
            principal, _ = await self.guard(request, sid)
            after = int_param(request, "after") or 0
            resumed = request.headers.get("last-event-id", "")
            if resumed.isdigit():  # a reconnecting EventSource continues after the last step it received
                after = max(after, int(resumed))
            await asyncio.to_thread(self.store.check_readable, sid, after)
        except SignIn:
            return Response("sign in first", status_code=401, headers={"WWW-Authenticate": "Bearer"})
        except (NotFound, SessionNotFoundError) as exc:
            return Response(str(exc), status_code=404)
        except (VersionNotFoundError, ValueError, TypeError) as exc:
            return Response(str(exc), status_code=400)
        if self.streams.get(principal, 0) >= self.max_streams:
            return Response(
                f"too many live pages open ({self.max_streams}, the viewer's max_streams): close one", status_code=429
            )
        self.streams[principal] = self.streams.get(principal, 0) + 1

        def release() -> None:  # as a background task: it runs even if the client left before the first event
            self.streams[principal] -= 1
            if not self.streams[principal]:
                del self.streams[principal]

        base = request.scope.get("root_path", "").rstrip("/")
        return EventSourceResponse(
            self._events(sid, after, base),
            ping=15,
            headers={"Cache-Control": "no-store"},
            background=BackgroundTask(release),
        )

    async def _events(self, sid: str, after: int, base: str) -> AsyncIterator[ServerSentEvent]:
        """Each new event as a timeline item. An ended session is still watched: another process may
        resume it (a stopped, failed or interrupted session), and its new steps then come in too."""
        seen_rounds: set[Any] = set()
        previous: float | None = None
        try:
            async for event in self.store.watch(sid, after, interval=0.2):
                item = item_of(event, previous)
                previous = event.timestamp
                html = render("timeline_item.html", item=item, sid=sid, base=base)
                payload = {
                    "version": event.version,
                    "round": event.round,
                    "round_key": _round_key(event.round),
                    "round_html": render(
                        "round.html",
                        entry={**new_round(event.round), "request": event.meta.get("request")},
                        sid=sid,
                        base=base,
                        open=True,
                    )
                    if event.round not in seen_rounds
                    else None,
                    "html": html,
                    "status": event.meta.get("session_status"),
                    "failed": item["failed"],
                }
                seen_rounds.add(event.round)
                yield ServerSentEvent(orjson.dumps(payload).decode(), event="step", id=str(event.version))
                if event.meta.get("kind") == "session_end":
                    yield ServerSentEvent(str(event.meta.get("session_status") or "ended"), event="end")
        except StoreError as exc:  # the session was deleted or its store went away: say so, then stop
            yield ServerSentEvent(str(exc), event="problem")
