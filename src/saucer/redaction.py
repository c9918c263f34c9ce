"""Secrets out of everything saucer logs or stores: one function, :func:`redact`.

It replaces, in strings and in nested dicts and lists:

- every *known secret*: the values given to :func:`register_secret` (the LLM
  API key, the service's bearer tokens, a device's token) and those of the
  environment variables in :data:`SECRET_ENV_VARS`;
- credentials by shape, whoever they belong to: the value of an
  ``Authorization``/``Proxy-Authorization`` header (``Bearer``, ``Basic``...),
  ``Bearer <token>``, ``api_key=...``-like assignments and OpenAI-style
  ``sk-...`` keys;
- the string value of a dict key that names a credential (``authorization``,
  ``api_key``, ``x-api-key``, ``access_token``, ``password``...).

It is applied where payloads become durable or are logged: event metadata
when an event is made, the session's log files, ``request.log``, and the
service's session records. What the endpoint echoes back, a tool prints, or
an error message quotes is covered the same way. Secrets shorter than 8
characters are not registered: replacing them would mangle ordinary text.

A Context value is different: it is the user's data, and guessing by shape
would silently change it (a var named ``password``, a string that looks like
a key). So :func:`redact_known` -- only saucer's own known secrets, never
shapes -- is applied to a Context value when it is set (live state and
replayed state stay equal). Values a user means to keep secret belong in
encrypted keys, not in a guess.

This module imports nothing of saucer's, so every layer may use it.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any, TypeVar

import orjson

__all__ = [
    "REDACTED",
    "SECRET_ENV_VARS",
    "RedactingLogFilter",
    "register_secret",
    "redact",
    "redact_text",
    "redact_known",
    "redact_known_text",
]

REDACTED = "***"
"""What a secret is replaced with."""

SECRET_ENV_VARS = (
    "SAUCER_LLM_API_KEY",
    "SAUCER_LLM__API_KEY",
    "OPENAI_API_KEY",
    "SAUCER_SERVICE_TOKEN",
    "SAUCER_SERVICE_TOKENS",
)
"""Environment variables whose values are secrets (``SAUCER_SERVICE_TOKENS`` as ``name=token,...``)."""

_MIN_SECRET = 8
_T = TypeVar("_T")

_SHAPES = [
    # Authorization: Bearer xyz / "authorization": "Basic xyz" / Proxy-Authorization=xyz
    (
        re.compile(
            r"(?i)\b((?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?(?:(?:bearer|basic|token|digest|apikey)\s+)?)"
            r"([^\s\"',;]+)"
        ),
        r"\1" + REDACTED,
    ),
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"), r"\1" + REDACTED),
    (
        re.compile(
            r"(?i)\b((?:x-)?api[_-]?key|access[_-]?token|refresh[_-]?token|client[_-]?secret|secret[_-]?key)"
            r"([\"']?\s*[:=]\s*[\"']?)([^\s\"',;&]{4,})"
        ),
        r"\1\2" + REDACTED,
    ),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"), "sk-" + REDACTED),
]


def _may_hold_credential(lowered: str) -> bool:
    # Cheap substring checks before any pattern runs: most strings hold no credential.
    return (
        "authoriz" in lowered
        or "bearer" in lowered
        or "api" in lowered
        or "token" in lowered
        or "secret" in lowered
        or "sk-" in lowered
    )


_SECRET_KEYS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "api_key",
        "apikey",
        "api-key",
        "x-api-key",
        "access_token",
        "refresh_token",
        "client_secret",
        "secret_key",
        "password",
        "passwd",
    }
)


class _Secrets:
    """The known secret values and one compiled pattern matching any of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._registered: set[str] = set()
        self._env: tuple[str | None, ...] = ()
        self.values: tuple[str, ...] = ()
        self.pattern: re.Pattern[str] | None = None
        #: Whether every secret reads the same inside JSON text (no character JSON escapes):
        #: then a value's JSON text holds a secret whenever one of its strings does.
        self.json_safe = True

    def register(self, values: tuple[str | None, ...]) -> None:
        """Add ``values`` and read the secret environment variables again."""
        with self._lock:
            added = {v for v in values if isinstance(v, str) and len(v) >= _MIN_SECRET} - self._registered
            env = tuple(os.environ.get(name) for name in SECRET_ENV_VARS)
            if added or env != self._env:
                self._registered |= added
                self._env = env
                self._compile()

    def _compile(self) -> None:
        values = set(self._registered)
        for name, value in zip(SECRET_ENV_VARS, self._env, strict=False):
            if not value:
                continue
            if name == "SAUCER_SERVICE_TOKENS":
                values.update(part.partition("=")[2] or part for part in value.split(",") if part.strip())
            else:
                values.add(value)
        values = {v.strip() for v in values if len(v.strip()) >= _MIN_SECRET}
        # Longest first, so a secret that contains another is replaced whole.
        ordered = sorted(values, key=len, reverse=True)
        self.values = tuple(ordered)
        self.json_safe = not any(c in '"\\' or c < " " for v in ordered for c in v)
        # Not inside a longer run of letters and digits: a secret is a whole token, never part of a number.
        alternatives = "|".join(re.escape(v) for v in ordered)
        self.pattern = re.compile(f"(?<![A-Za-z0-9])(?:{alternatives})(?![A-Za-z0-9])") if ordered else None


_secrets = _Secrets()
_secrets.register(())  # the environment as the process starts


def register_secret(*values: str | None) -> None:
    """Treat ``values`` as secrets from now on, in this process (None and short values are ignored).

    The variables of :data:`SECRET_ENV_VARS` are read when this module is
    imported and again on each call (``register_secret()`` with no value
    picks up a change of the environment).
    """
    _secrets.register(values)


def redact_known_text(text: str) -> str:
    """``text`` with every known secret (never a shape) replaced by ``***``."""
    for value in _secrets.values:
        if value in text:
            assert _secrets.pattern is not None
            return _secrets.pattern.sub(REDACTED, text)
    return text


def redact_known(value: _T, *, encoded: bytes | None = None) -> _T:
    """``value`` with every known secret replaced in its strings; shapes and key names are left alone.

    Containers are rebuilt only where something changed; the argument is never modified.
    ``encoded`` is ``orjson.dumps(value)`` when the caller has made it already.
    """
    if not _secrets.values or (value.__class__ in _CONTAINERS and _clean_json(value, False, encoded)):
        return value
    redacted: _T = _walk(value, redact_known_text, False)  # _walk keeps each value's type
    return redacted


def redact_text(text: str) -> str:
    """``text`` with every known secret and every credential-shaped string replaced by ``***``."""
    text = redact_known_text(text)
    if not _may_hold_credential(text.lower()):
        return text
    for pattern, replacement in _SHAPES:
        text = pattern.sub(replacement, text)
    return text


def redact(value: _T, *, encoded: bytes | None = None) -> _T:
    """``value`` with secrets replaced in every string, dict key's value and list item (see the module docs).

    Containers are rebuilt only where something changed; the argument is never modified.
    A dict or list is first scanned once as JSON text: when that text holds no
    known secret and no hint of a credential, none of its strings can, and it is
    returned as it is without a walk (a step's record, on every commit).
    ``encoded`` is that text (``orjson.dumps(value)``) when the caller has made it already.
    """
    if value.__class__ in _CONTAINERS and _clean_json(value, True, encoded):
        return value
    redacted: _T = _walk(value, redact_text, True)  # _walk keeps each value's type
    return redacted


_CONTAINERS = (dict, list)


def _clean_json(value: Any, shapes: bool, encoded: bytes | None = None) -> bool:
    """Whether no string of ``value`` can hold a known secret (nor, with ``shapes``, a credential
    by shape or under a credential's key name), judged on its JSON text in one scan
    (``encoded``, or ``orjson.dumps(value)``).

    Every hint (:func:`_may_hold_credential`, and ``passw``) and every JSON-safe
    secret reads the same in a string and in the JSON text of a value holding
    it, so the text misses none; it may hit more (a key name, a dataclass's
    field), and then the value is walked. A value JSON cannot encode is walked too.
    """
    if not _secrets.json_safe:
        return False
    if encoded is None:
        try:
            encoded = orjson.dumps(value)
        except TypeError:  # orjson.JSONEncodeError included: not plain JSON data
            return False
    secrets = _secrets.values
    if secrets:
        text = encoded.decode()
        for secret in secrets:
            if secret in text:
                return False
    return not shapes or _hintless(encoded)


#: What :func:`_hintless` reads a JSON text as: every digit and dot as ``0`` (no hint holds one).
_NOT_IN_HINTS = b"0123456789."
_NUMBERS_AS_ZEROS = bytes.maketrans(_NOT_IN_HINTS, b"0" * len(_NOT_IN_HINTS))
#: Texts (read so) seen to hold no hint, and how many and how long are kept.
_seen_hintless: set[bytes] = set()
_SEEN_MAX = 256
_SEEN_TEXT_MAX = 4096


def _hintless(encoded: bytes) -> bool:
    """Whether the JSON text ``encoded`` holds no hint of a credential (:func:`_may_hold_credential`,
    ``passw``), judged on it with every digit and dot read as ``0``.

    No hint holds a digit or a dot, so each hint of the text is one of what is read, in the same
    place: none is missed. What is read of a step's meta is the same step after step (only its
    numbers change), so it is scanned once and remembered, not searched seven times on every
    commit. Known secrets are not judged here: they are matched in the whole text on every call.
    """
    rest = encoded.translate(_NUMBERS_AS_ZEROS)  # a digit or dot byte is never part of a longer UTF-8 character
    if rest in _seen_hintless:
        return True
    # Every name of _SECRET_KEYS holds one of these hints (a test checks it).
    lowered = rest.decode().lower()
    if _may_hold_credential(lowered) or "passw" in lowered:
        return False
    if len(rest) <= _SEEN_TEXT_MAX:
        if len(_seen_hintless) >= _SEEN_MAX:
            _seen_hintless.clear()
        _seen_hintless.add(rest)
    return True


def _walk(value: Any, text: Any, by_key: bool) -> Any:
    if isinstance(value, str):
        return text(value)
    if isinstance(value, dict):
        out: dict[Any, Any] | None = None
        for key, item in value.items():
            new = (
                REDACTED
                if by_key and isinstance(item, str) and item and isinstance(key, str) and key.lower() in _SECRET_KEYS
                else _walk(item, text, by_key)
            )
            if new is not item and out is None:
                out = dict(value)
            if out is not None:
                out[key] = new
        return value if out is None else out
    if isinstance(value, (list, tuple)):
        items = [_walk(item, text, by_key) for item in value]
        if all(new is old for new, old in zip(items, value, strict=False)):
            return value
        return items if isinstance(value, list) else tuple(items)
    return value


_QUERY_TOKEN = re.compile(r"(?i)([?&](?:token|api_key|access_token)=)[^&\s\"']+")


class RedactingLogFilter(logging.Filter):
    """A logging filter that rewrites each record's message through :func:`redact_text`.

    Put on a handler (or a logger) it covers every line that goes through it,
    a library's debug lines included: ``websockets`` logs a handshake's URL,
    where an AIP client carries its token as ``?token=``, so a token in a
    URL's query is replaced too, even one nobody registered (a wrong one).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Replace the secrets of ``record``'s message; never drop the record."""
        message = record.getMessage()
        cleaned = _QUERY_TOKEN.sub(r"\1" + REDACTED, redact_text(message))
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True
