"""The viewer's Starlette app: pages, the live stream, sign-in, static files.

Read-only unless the host passes ``acting`` (:mod:`saucer.ui.acting`: the session page's forms). Pages (stable URLs, relative to where
the app is mounted)::

    /sessions                          the sessions table: filters, search, sorting, paging
    /sessions/{id}                     timeline: rounds, steps, commands, results, costs, LLM calls, forks
    /sessions/{id}/state?at=V[&key=K]  the Context at version V (one key in full with key=)
    /sessions/{id}/diff?from=A&to=B    what changed between two versions
    /sessions/{id}/history?key=NAME    every change to one key
    /sessions/{id}/events/{V}          one event, nothing cut
    /sessions/{id}/stream?after=V      server-sent events: the session's new steps as they commit
    /devices                           devices, online state, last heartbeat (when the host knows devices)

The live stream is :mod:`saucer.ui.live`; the sign-in and form checks :mod:`saucer.ui.guard`.

With an ``authenticate`` function (token -> principal or None) every page
needs a token: ``Authorization: Bearer`` or the cookie set by ``/login``.
A :class:`Scope` limits each principal to its own sessions (and devices);
anything else is a 404, as for an id that never existed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import parse_qs, quote

import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from saucer.store import EventStore, SessionNotFoundError, StoreError, VersionNotFoundError
from saucer.ui import queries
from saucer.ui.acting import READ_ONLY, RESUMABLE, Acting, ActionRefused, pending_of, perform
from saucer.ui.guard import FormTokens, HostCheck, OriginCheck
from saucer.ui.live import DEFAULT_MAX_STREAMS, LiveStreams, NotFound, SignIn, int_param
from saucer.ui.render import render
from saucer.ui.steps import States, Tallies, artifact_file, step_detail
from saucer.ui.values import value_html

__all__ = ["Scope", "create_app", "COOKIE", "DEFAULT_MAX_STREAMS"]

#: The cookie that carries the token after a sign-in (HttpOnly, SameSite=Strict).
COOKIE = "saucer_ui_token"
_HISTORY_LIMIT = 500
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


class Scope(Protocol):
    """What one principal may see, for a host (``saucer serve``) that knows who owns what."""

    async def session_ids(self, principal: str | None) -> set[str] | None:
        """The ids of the sessions ``principal`` may see; None: every session of the store."""

    async def devices(self, principal: str | None) -> list[dict[str, Any]] | None:
        """The devices ``principal`` may see (id, online, last_heartbeat, ...); None: no devices page."""


class _Everything:
    async def session_ids(self, principal: str | None) -> set[str] | None:
        return None

    async def devices(self, principal: str | None) -> list[dict[str, Any]] | None:
        return None


@dataclass
class _Page:
    """What a handler gives back: a template and its values, or a ready response."""

    template: str
    values: dict[str, Any]


class Viewer:
    """The handlers, over one store."""

    def __init__(
        self,
        store: EventStore,
        authenticate: Callable[[str], str | None] | None,
        scope: Scope | None,
        title: str,
        acting: Acting | None = None,
    ) -> None:
        self.store = store
        self.acting = acting  # None: read-only (no forms, every action refused)
        self.authenticate = authenticate
        self.scope: Scope = scope or _Everything()
        self.title = title
        self.tallies = Tallies()  # each session's page reads only what was committed since its last view
        self.states = States()  # the inspector's next step costs one event
        self.histories = queries.Histories()  # a key's history, read again, reads only what is new
        self.forms = FormTokens()

    # ------------------------------------------------------------ plumbing

    def _principal(self, request: Request) -> tuple[bool, str | None]:
        """(allowed, principal): always allowed without ``authenticate``."""
        if self.authenticate is None:
            return True, None
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        presented = token.strip() if scheme.lower() == "bearer" else request.cookies.get(COOKIE, "")
        principal = self.authenticate(presented) if presented else None
        return principal is not None, principal

    def _page(self, request: Request, template: str, status: int = 200, **values: Any) -> Response:
        base = request.scope.get("root_path", "").rstrip("/")
        csrf, nonce = self.forms.issue(request)  # every page may hold a form (sign out): each carries the token
        html = render(
            template,
            base=base,
            title=self.title,
            signed_in=self.authenticate is not None,
            devices_page=values.pop("devices_page", False),
            csrf=csrf,
            **values,
        )
        response = HTMLResponse(html, status_code=status, headers=_SECURITY_HEADERS)
        self.forms.set_cookie(response, nonce, request)
        return response

    async def _form(self, request: Request) -> dict[str, list[str]] | None:
        """The fields of a posted form whose token this app issued; None when it is too large or its token is wrong."""
        body = await request.body()
        if len(body) > 8192:
            return None
        form = parse_qs(body.decode("utf-8", "replace"))
        return form if self.forms.valid(request, (form.get("csrf") or [""])[0]) else None

    async def guard(self, request: Request, sid: str | None = None) -> tuple[str | None, set[str] | None]:
        """The principal and the sessions it may see; raises for a missing sign-in or a session it may not see."""
        allowed, principal = self._principal(request)
        if not allowed:
            raise SignIn()
        ids = await self.scope.session_ids(principal)
        if sid is not None and ids is not None and sid not in ids:
            raise NotFound(f"no session {sid!r} here")
        return principal, ids

    async def _run(
        self,
        request: Request,
        sid: str | None,
        build: Callable[..., _Page],
        *args: Any,
        acting: dict[str, Any] | None = None,
    ) -> Response:
        """Check access, build the page in a worker thread (store reads block), render it; errors become pages.

        ``acting``: the session page's forms this principal may use (None: none are shown)."""
        try:
            principal, ids = await self.guard(request, sid)
            page = await asyncio.to_thread(build, ids, *args) if sid is None else await asyncio.to_thread(build, *args)
            devices_page = await self.scope.devices(principal) is not None
        except SignIn:
            return self._sign_in(request)
        except (NotFound, SessionNotFoundError) as exc:
            return self._page(request, "error.html", 404, message=str(exc), devices_page=False)
        except (VersionNotFoundError, ValueError, TypeError) as exc:
            return self._page(request, "error.html", 400, message=str(exc), devices_page=False)
        except StoreError as exc:
            return self._page(request, "error.html", 500, message=f"store error: {exc}", devices_page=False)
        return self._page(
            request,
            page.template,
            devices_page=devices_page,
            acting=acting,
            **page.values,
        )

    def _sign_in(self, request: Request) -> Response:
        base = request.scope.get("root_path", "").rstrip("/")
        if request.headers.get("accept", "").startswith("text/event-stream") or request.headers.get("hx-request"):
            return Response("sign in first", status_code=401, headers={"WWW-Authenticate": "Bearer"})
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"{base}/login?{_encode({'next': target})}", status_code=303)

    # --------------------------------------------------------------- pages

    async def index(self, request: Request) -> Response:
        base = request.scope.get("root_path", "").rstrip("/")
        return RedirectResponse(f"{base}/sessions", status_code=303)

    async def sessions(self, request: Request) -> Response:
        # htmx asks for the table only; a history restore asks for the whole page.
        fragment = bool(request.headers.get("hx-request")) and not request.headers.get("hx-history-restore-request")

        def build(ids: set[str] | None) -> _Page:
            query = queries.SessionQuery.from_params(request.query_params)
            page = queries.list_sessions(self.store, query, ids)
            return _Page("sessions_table.html" if fragment else "sessions.html", {"page": page, "query": query})

        return await self._run(request, None, build)

    async def session(self, request: Request) -> Response:
        sid = request.path_params["session_id"]

        def build() -> _Page:
            before = int_param(request, "before")
            step = int_param(request, "step")
            if step is not None and before is None and step <= self.store.head(sid) - 200:
                before = step + 100  # an older step: show the events around it
            view = queries.session_view(self.store, sid, before=before, tallies=self.tallies)
            detail = None
            if step is not None:  # the inspector open on a step: an address to share
                try:
                    detail = step_detail(self.store, sid, step, view.calls, self.states)
                except LookupError as exc:
                    raise NotFound(str(exc)) from None
            pending = pending_of(self.store, sid) if self.acting is not None else []
            return _Page(
                "session.html", {"view": view, "sid": sid, "before": before, "detail": detail, "pending": pending}
            )

        forms = None
        if self.acting is not None:  # the forms, for a principal allowed to act on this session only
            allowed, principal = self._principal(request)
            may = allowed and await self.acting.allowed(principal, sid)
            forms = (
                {
                    "cancel": self.acting.cancel is not None,
                    "resume": self.acting.resume is not None,
                    "resumable": RESUMABLE,
                    "done": request.query_params.get("done"),
                }
                if may
                else None
            )
        return await self._run(request, sid, build, acting=forms)

    async def act(self, request: Request) -> Response:
        """A form of the session's page: set/delete variables, decide, answer, cancel (see :mod:`saucer.ui.acting`)."""
        sid, action = request.path_params["session_id"], request.path_params["action"]
        if self.acting is None:
            return Response(READ_ONLY, status_code=403, headers=_SECURITY_HEADERS)
        try:
            principal, _ = await self.guard(request, sid)
        except SignIn:
            return Response("sign in first", status_code=401, headers={"WWW-Authenticate": "Bearer"})
        except NotFound as exc:
            return Response(str(exc), status_code=404, headers=_SECURITY_HEADERS)
        form = await self._form(request)
        if form is None:
            return Response(_STALE_FORM, status_code=403, headers=_SECURITY_HEADERS)
        try:
            done = await perform(self.acting, self.store, sid, principal, action, form)
        except ActionRefused as exc:
            return Response(str(exc), status_code=exc.status, headers=_SECURITY_HEADERS)
        except SessionNotFoundError as exc:
            return Response(str(exc), status_code=404, headers=_SECURITY_HEADERS)
        base = request.scope.get("root_path", "").rstrip("/")
        return RedirectResponse(f"{base}/sessions/{quote(sid, safe='')}?{_encode({'done': done})}#act", status_code=303)

    async def step(self, request: Request) -> Response:
        """The step inspector of one event, as an HTML fragment (the session's page loads it in place)."""
        sid = request.path_params["session_id"]
        try:
            await self.guard(request, sid)

            def build() -> str:
                version = _int_path(request, "version")
                calls, _, _ = queries.session_logs(self.store, sid)
                detail = step_detail(self.store, sid, version, calls, self.states)
                base = request.scope.get("root_path", "").rstrip("/")
                return render("inspector.html", detail=detail, sid=sid, base=base)

            html = await asyncio.to_thread(build)
        except SignIn:
            return Response("sign in first", status_code=401, headers={"WWW-Authenticate": "Bearer"})
        except (NotFound, SessionNotFoundError, LookupError) as exc:
            return Response(str(exc), status_code=404, headers=_SECURITY_HEADERS)
        except (VersionNotFoundError, ValueError, TypeError) as exc:
            return Response(str(exc), status_code=400, headers=_SECURITY_HEADERS)
        return HTMLResponse(html, headers=_SECURITY_HEADERS)

    async def artifact(self, request: Request) -> Response:
        """A step's screenshot (PNG) or UI tree (JSON; ``?as=html``: as readable HTML), from the session's log folder only."""
        sid = request.path_params["session_id"]
        try:
            await self.guard(request, sid)

            def build() -> Response:
                version = _int_path(request, "version")
                index = _int_path(request, "index")
                self.store.check_readable(sid, version)
                event = next(iter(self.store.read(sid, version - 1, version)), None) if version > 0 else None
                if event is None:
                    raise LookupError(f"no event at v{version}")
                path, kind = artifact_file(event, index, queries.session_log_folder(self.store, sid))
                if kind == "application/json" and request.query_params.get("as") == "html":
                    data = orjson.loads(path.read_bytes()[: 8 * 1024 * 1024])
                    return HTMLResponse(str(value_html(data)), headers=_SECURITY_HEADERS)
                return Response(path.read_bytes(), media_type=kind, headers=_SECURITY_HEADERS)

            return await asyncio.to_thread(build)
        except SignIn:
            return Response("sign in first", status_code=401, headers={"WWW-Authenticate": "Bearer"})
        except (NotFound, SessionNotFoundError, LookupError, OSError) as exc:
            return Response(str(exc), status_code=404, headers=_SECURITY_HEADERS)
        except (VersionNotFoundError, ValueError, TypeError) as exc:
            return Response(str(exc), status_code=400, headers=_SECURITY_HEADERS)

    async def state(self, request: Request) -> Response:
        sid = request.path_params["session_id"]
        key = request.query_params.get("key")

        def build() -> _Page:
            at = int_param(request, "at")
            info = self.store.session_info(sid)
            version, state = queries.state_at(self.store, sid, at)
            if key is not None and key not in state:
                raise ValueError(f"{key!r} has no value at v{version}")
            first = self.store.first_version(sid)
            return _Page(
                "state.html",
                {"sid": sid, "info": info, "version": version, "state": state, "key": key, "first": first},
            )

        return await self._run(request, sid, build)

    async def diff(self, request: Request) -> Response:
        sid = request.path_params["session_id"]

        def build() -> _Page:
            head = self.store.head(sid)
            v1 = int_param(request, "from")
            v2 = int_param(request, "to")
            v2 = head if v2 is None else v2
            v1 = max(self.store.first_version(sid), v2 - 1) if v1 is None else v1
            changes = queries.diff(self.store, sid, v1, v2)
            return _Page("diff.html", {"sid": sid, "v1": v1, "v2": v2, "head": head, "changes": changes})

        return await self._run(request, sid, build)

    async def history(self, request: Request) -> Response:
        sid = request.path_params["session_id"]
        key = request.query_params.get("key", "")

        def build() -> _Page:
            if not key:
                raise ValueError("name a key: history?key=REQUEST (a Context name) or key=vars.NAME")
            before = int_param(request, "before")
            changes = queries.history(self.store, sid, key, self.histories)
            total = len(changes)
            if before is not None:
                changes = [c for c in changes if c["version"] < before]
            shown = changes[-_HISTORY_LIMIT:]  # the newest; ?before=V pages back
            return _Page(
                "history.html",
                {
                    "sid": sid,
                    "key": key,
                    "changes": shown,
                    "total": total,
                    "before": before,
                    "earlier": shown[0]["version"] if len(changes) > len(shown) else None,
                },
            )

        return await self._run(request, sid, build)

    async def event(self, request: Request) -> Response:
        sid = request.path_params["session_id"]

        def build() -> _Page:
            version = _int_path(request, "version")
            self.store.check_readable(sid, version)
            found = next(iter(self.store.read(sid, version - 1, version)), None) if version > 0 else None
            if found is None:
                raise NotFound(f"session {sid!r} has no event at v{version}")
            return _Page("event.html", {"sid": sid, "event": found})

        return await self._run(request, sid, build)

    async def devices(self, request: Request) -> Response:
        allowed, principal = self._principal(request)
        if not allowed:
            return self._sign_in(request)
        devices = await self.scope.devices(principal)
        if devices is None:
            return self._page(
                request, "error.html", 404, message="this viewer knows no devices (saucer serve shows them)"
            )
        return self._page(request, "devices.html", devices=devices, devices_page=True)

    # ------------------------------------------------------------- sign-in

    async def login(self, request: Request) -> Response:
        target = _safe_next(request.query_params.get("next", ""), request)
        if request.method == "GET":
            return self._page(request, "login.html", next=target, problem=None)
        form = await self._form(request)
        if form is None:
            return self._page(request, "login.html", 403, next=target, problem=_STALE_FORM)
        token = (form.get("token") or [""])[0].strip()
        target = _safe_next((form.get("next") or [target])[0], request)
        if self.authenticate is None or self.authenticate(token) is None:
            return self._page(request, "login.html", 401, next=target, problem="that token is not valid here")
        base = request.scope.get("root_path", "").rstrip("/")
        response = RedirectResponse(target or f"{base}/sessions", status_code=303)
        response.set_cookie(
            COOKIE, token, httponly=True, samesite="strict", secure=request.url.scheme == "https", path=f"{base}/"
        )
        return response

    async def logout(self, request: Request) -> Response:
        base = request.scope.get("root_path", "").rstrip("/")
        if await self._form(request) is None:
            return self._page(request, "error.html", 403, message=_STALE_FORM, devices_page=False)
        response = RedirectResponse(f"{base}/login", status_code=303)
        response.delete_cookie(COOKIE, path=f"{base}/")
        return response


_STALE_FORM = (
    "that form is not one of this page's (too large, expired, or sent from another site): reload and try again"
)


def _encode(params: dict[str, str]) -> str:
    from urllib.parse import urlencode

    return urlencode(params)


def _safe_next(target: str, request: Request) -> str:
    """Only a path of this viewer (never another site) to go back to after signing in."""
    base = request.scope.get("root_path", "").rstrip("/")
    if target.startswith(f"{base}/") and not target.startswith("//") and "\\" not in target:
        return target
    return ""


def _int_path(request: Request, name: str) -> int:
    try:
        return int(request.path_params[name])
    except ValueError:
        raise ValueError(f"{request.path_params[name]!r} is not a version number") from None


def create_app(
    store: EventStore,
    *,
    authenticate: Callable[[str], str | None] | None = None,
    scope: Scope | None = None,
    title: str = "saucer",
    on_close: Callable[[], Awaitable[None] | None] | None = None,
    allowed_hosts: Sequence[str] | None = None,
    max_streams: int = DEFAULT_MAX_STREAMS,
    acting: Acting | None = None,
) -> Starlette:
    """The viewer over ``store``.

    ``authenticate`` maps a presented token to its principal (None: refused);
    without it every page is open (``saucer ui`` on loopback). ``scope`` says
    which sessions and devices a principal sees (default: every session, no
    devices page). ``on_close`` runs when the app shuts down.
    ``allowed_hosts`` refuses requests whose ``Host`` is another name (400): on
    loopback without a token, a web page elsewhere cannot then read the viewer
    by pointing a name of its own at 127.0.0.1 or ::1 (DNS rebinding). Every
    POST is refused when another site sent it (Origin) or its form token is
    wrong (:mod:`saucer.ui.guard`). ``max_streams`` caps the live pages one
    principal holds open (429 past it); on PostgreSQL they all share one
    LISTEN connection of the store. ``acting`` turns on the session page's
    forms (:mod:`saucer.ui.acting`); without it the viewer is read-only.
    """
    viewer = Viewer(store, authenticate, scope, title, acting)
    live = LiveStreams(store, viewer.guard, max_streams)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if on_close is not None:
                result = on_close()
                if result is not None:
                    await result

    routes = [
        Route("/", viewer.index),
        Route("/sessions", viewer.sessions),
        Route("/sessions/{session_id}", viewer.session),
        Route("/sessions/{session_id}/state", viewer.state),
        Route("/sessions/{session_id}/diff", viewer.diff),
        Route("/sessions/{session_id}/history", viewer.history),
        Route("/sessions/{session_id}/events/{version}", viewer.event),
        Route("/sessions/{session_id}/steps/{version}", viewer.step),
        Route("/sessions/{session_id}/steps/{version}/artifacts/{index}", viewer.artifact),
        Route("/sessions/{session_id}/stream", live.stream),
        Route("/sessions/{session_id}/act/{action}", viewer.act, methods=["POST"]),
        Route("/devices", viewer.devices),
        Route("/login", viewer.login, methods=["GET", "POST"]),
        Route("/logout", viewer.logout, methods=["POST"]),
        Mount("/static", app=StaticFiles(packages=[("saucer.ui", "static")]), name="static"),
    ]
    middleware = [Middleware(OriginCheck)]
    if allowed_hosts is not None:
        middleware.insert(0, Middleware(HostCheck, allowed=list(allowed_hosts)))
    return Starlette(routes=routes, lifespan=lifespan, middleware=middleware)
