"""Bearer tokens for service mode.

Each token has a name, the *principal*: sessions belong to the principal that
submitted them, device ids to the principal that first registered them. Tokens
come from configuration or from ``SAUCER_SERVICE_TOKENS``, written as
``name=token`` pairs separated by commas (a bare ``token`` is named
``token-<first 12 hex digits of its SHA-256>``, stable across restarts so that
ownership survives them).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode

from saucer.redaction import register_secret

TOKENS_ENV = "SAUCER_SERVICE_TOKENS"
"""Environment variable holding the server's tokens (``name=token,name2=token2``)."""

MIN_TOKEN_LENGTH = 16
"""Shorter tokens are refused: they can be guessed."""


class TokenConfigError(ValueError):
    """The configured tokens are unusable (none, too short, duplicated names)."""


def parse_tokens(spec: str) -> dict[str, str]:
    """Parse ``name=token,token2`` into ``{principal: token}``; raise :class:`TokenConfigError` on bad input."""
    tokens: dict[str, str] = {}
    for position, item in enumerate(spec.split(","), start=1):
        item = item.strip()
        if not item:
            continue
        name, sep, token = item.partition("=")
        if not sep:
            name, token = default_principal(item), item
        name, token = name.strip(), token.strip()
        if not name or not token:
            raise TokenConfigError(f"{TOKENS_ENV} entry {position} is empty on one side of '='")
        if name in tokens:
            raise TokenConfigError(f"{TOKENS_ENV} names principal {name!r} twice")
        tokens[name] = token
    return tokens


def default_principal(token: str) -> str:
    """The principal name of a token given without a name."""
    return "token-" + hashlib.sha256(token.encode()).hexdigest()[:12]


_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9._@-]{0,63}$")


def split_token_entry(entry: str) -> tuple[str, str]:
    """``name=token`` -> ``(name, token)``; a bare token (even one ending in ``=`` padding) gets :func:`default_principal`."""
    entry = entry.strip()
    name, sep, token = entry.partition("=")
    if sep and _NAME.match(name.strip()) and token.strip() and not token.startswith("="):
        return name.strip(), token.strip()
    return default_principal(entry), entry


def service_tokens(configured: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's tokens: ``configured`` entries (``name=token`` or bare), then ``SAUCER_SERVICE_TOKENS``.

    A principal named in both takes the environment's token.
    """
    tokens: dict[str, str] = {}
    for position, entry in enumerate(configured, start=1):
        if not entry.strip():
            raise TokenConfigError(f"service.tokens entry {position} is empty")
        name, token = split_token_entry(entry)
        if name in tokens:
            raise TokenConfigError(f"service.tokens names principal {name!r} twice")
        tokens[name] = token
    tokens.update(tokens_from_env(environ))
    return tokens


def tokens_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Tokens from ``SAUCER_SERVICE_TOKENS`` (empty if unset)."""
    return parse_tokens((environ if environ is not None else os.environ).get(TOKENS_ENV, ""))


class TokenAuthenticator:
    """Maps a presented bearer token to its principal in constant time per configured token."""

    def __init__(self, tokens: Mapping[str, str]) -> None:
        if not tokens:
            raise TokenConfigError(
                f"service mode needs at least one token: set {TOKENS_ENV}=name=token or pass tokens in the config"
            )
        short = [name for name, token in tokens.items() if len(token) < MIN_TOKEN_LENGTH]
        if short:
            raise TokenConfigError(
                f"tokens of {', '.join(sorted(short))} are shorter than {MIN_TOKEN_LENGTH} characters"
            )
        register_secret(*tokens.values())  # never logged or stored, whatever a device or an endpoint echoes
        # Compare digests so every comparison has the same length.
        self._digests = [(name, hashlib.sha256(token.encode()).digest()) for name, token in tokens.items()]

    def principal(self, presented: str | None) -> str | None:
        """The principal whose token is ``presented``, or None."""
        if not presented:
            return None
        digest = hashlib.sha256(presented.encode()).digest()
        found: str | None = None
        for name, expected in self._digests:
            # No early exit: the time taken does not depend on which token matched.
            if hmac.compare_digest(digest, expected):
                found = name
        return found

    def from_header(self, authorization: str | None) -> str | None:
        """The principal for an ``Authorization: Bearer <token>`` header value, or None."""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self.principal(token.strip())


QUERY_TOKEN_PARAMS = ("token", "api_key", "access_token")
"""Query parameters that carry a token (UFO's clients send ``?token=``); never left in a logged URL."""

_SCOPE_TOKEN = "saucer.query_token"


class QueryTokenMiddleware:
    """ASGI middleware: takes a token out of the query string before anything can log it.

    The token moves from ``scope["query_string"]`` (rewritten in place, with
    ``***`` as the value, so the access log line of uvicorn, which reads the
    same scope, shows no secret) to ``scope["saucer.query_token"]``, where
    :func:`query_token` finds it.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Redact, then hand the request to the app."""
        if scope.get("type") in ("http", "websocket"):
            redact_query(scope)
        await self.app(scope, receive, send)


def redact_query(scope: dict[str, Any]) -> None:
    """Move a token found in ``scope``'s query string to ``scope["saucer.query_token"]`` (in place)."""
    raw = scope.get("query_string") or b""
    if not raw or not any(name.encode() + b"=" in raw for name in QUERY_TOKEN_PARAMS):
        return
    pairs = parse_qsl(raw.decode("latin-1"), keep_blank_values=True)
    for name, value in pairs:
        if name in QUERY_TOKEN_PARAMS and value and _SCOPE_TOKEN not in scope:
            scope[_SCOPE_TOKEN] = value
    kept = [(name, "***" if name in QUERY_TOKEN_PARAMS else value) for name, value in pairs]
    scope["query_string"] = urlencode(kept, safe="*").encode("latin-1")


def query_token(scope: Mapping[str, Any]) -> str | None:
    """The token a request carried in its query string (see :class:`QueryTokenMiddleware`), or None."""
    value = scope.get(_SCOPE_TOKEN)
    return value if isinstance(value, str) else None
