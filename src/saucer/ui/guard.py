"""What keeps other web pages out of the viewer: the Host check, the Origin check and form tokens.

* **Host**: without a token (``saucer ui`` on loopback), a page elsewhere
  could point a name of its own at 127.0.0.1 or ::1 and read the viewer (DNS
  rebinding); :class:`HostCheck` answers 400 to any ``Host`` that is not one
  of this machine's names. It parses IPv6 literals (``[::1]:8000``), which
  Starlette's ``TrustedHostMiddleware`` does not.
* **Origin**: a state-changing request (any method but GET, HEAD, OPTIONS)
  whose ``Origin`` (or, without one, ``Referer``) is another origin, that a
  browser marks ``Sec-Fetch-Site: cross-site``/``same-site``, or whose
  origin is opaque (``null``) without ``Sec-Fetch-Site: same-origin``, is
  refused (403) before any handler runs.
* **Form tokens**: each form carries a token, the HMAC of a random per-browser
  nonce (an HttpOnly, SameSite=Strict cookie) under a per-app secret; a POST
  whose token does not match is refused (:meth:`FormTokens.valid`). The
  cookies are SameSite=Strict as well: three walls, any one enough today.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["FORM_COOKIE", "FormTokens", "HostCheck", "OriginCheck", "host_name"]

#: The cookie holding the browser's nonce for form tokens (HttpOnly, SameSite=Strict).
FORM_COOKIE = "saucer_ui_form"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def host_name(authority: str) -> str:
    """The host of a ``Host`` header or an origin's authority, lower case, without port or brackets:
    ``[::1]:8000`` -> ``::1``, ``Localhost:80`` -> ``localhost``."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        end = authority.find("]")
        return authority[1:end] if end > 0 else ""
    return authority.rpartition(":")[0] if authority.count(":") == 1 else authority


class HostCheck:
    """ASGI middleware: 400 for a request whose ``Host`` is not one of ``allowed`` (names or IP literals)."""

    def __init__(self, app: ASGIApp, allowed: Iterable[str]) -> None:
        self.app = app
        self.allowed = frozenset(host_name(f"[{h}]" if ":" in h and not h.startswith("[") else h) for h in allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] in ("http", "websocket")
            and host_name(Headers(scope=scope).get("host", "")) not in self.allowed
        ):
            await PlainTextResponse("Invalid host header", status_code=400)(scope, receive, send)
            return
        await self.app(scope, receive, send)


class OriginCheck:
    """ASGI middleware: 403 for a state-changing request that another site's page sent."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in _SAFE_METHODS:
            problem = _cross_site(Headers(scope=scope))
            if problem is not None:
                await PlainTextResponse(f"refused: {problem}", status_code=403)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _cross_site(headers: Headers) -> str | None:
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return "the request came from another site"
    origin = headers.get("origin")
    if origin == "null":
        # A browser sends "null" for its own form under Referrer-Policy: no-referrer (the viewer's), and
        # for a sandboxed frame anywhere: only its fetch metadata tells them apart.
        return None if site == "same-origin" else "the request came from an opaque origin"
    source = origin or headers.get("referer")
    if source is None:
        return None  # not a browser's form (a browser sends Origin with every POST); the form token still applies
    netloc = urlsplit(source).netloc
    if not netloc or netloc.lower() != headers.get("host", "").strip().lower():
        return (
            "the request came from another site"
            if host_name(netloc) != host_name(headers.get("host", ""))
            else ("the request came from another origin")
        )
    return None


class FormTokens:
    """Per-app form tokens: the HMAC of the browser's nonce cookie under a secret only this app holds."""

    def __init__(self) -> None:
        self._secret = secrets.token_bytes(32)

    def _mac(self, nonce: str) -> str:
        return hmac.new(self._secret, nonce.encode("utf-8", "replace"), hashlib.sha256).hexdigest()

    def issue(self, request: Request) -> tuple[str, str | None]:
        """The token for the forms of a page, and a new nonce to set as :data:`FORM_COOKIE` (None: keep the browser's)."""
        nonce = request.cookies.get(FORM_COOKIE, "")
        fresh = None
        if len(nonce) < 32:
            nonce = fresh = secrets.token_urlsafe(32)
        return self._mac(nonce), fresh

    def valid(self, request: Request, token: str) -> bool:
        """Whether ``token`` (a form's ``csrf`` field) was issued by this app for this browser's nonce."""
        nonce = request.cookies.get(FORM_COOKIE, "")
        return len(nonce) >= 32 and bool(token) and hmac.compare_digest(token, self._mac(nonce))

    @staticmethod
    def set_cookie(response: Response, nonce: str | None, request: Request) -> None:
        """Set the browser's nonce on ``response`` when :meth:`issue` made a new one."""
        if nonce is not None:
            base = request.scope.get("root_path", "").rstrip("/")
            response.set_cookie(
                FORM_COOKIE,
                nonce,
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
                path=f"{base}/",
            )
