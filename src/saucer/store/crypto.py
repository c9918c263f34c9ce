"""Encryption at rest of chosen values: keys, patterns, and sealing with AES-GCM.

``store.encrypt`` lists patterns over what operations target (``fnmatch``
style, case-sensitive): a typed name such as ``REQUEST``, or a context
variable as ``vars.KEY`` (``vars.api_*``). A value whose target matches is
*sealed* before it reaches any backend, in events and in snapshots alike:

- an operation becomes ``{"op": "sealed", <its target and path>, "sealed": TOKEN}``,
  the token holding the original operation (its kind and values);
- a snapshot keeps such values under ``"sealed"`` (``{"names": {...}, "vars": {...},
  "packed": {...}}``) instead of ``"names"`` / ``"vars"`` / ``"packed"``.

A token is ``base64(key id (8 bytes) | nonce (12) | AES-256-GCM ciphertext and tag)``,
the plaintext being the value's JSON, never compressed (tokens sealed by record
formats 4 and 5 compressed it when over 512 bytes, and still open): a compressed
plaintext's length would tell something about a secret sealed beside text an
attacker chose;
the *associated data* is the session id and the target (``vars.api_key``), so a
token copied to another session or key does not open. The key id tells a
wrong key from a damaged token.

The key (32 random bytes, base64) comes from ``SAUCER_STORE_KEY`` or a key
file (``store.key_file``) -- never from the store. Without it, sealed values
read as :data:`ENCRYPTED` (the fold of :mod:`saucer.context.events` shows
them so) and nothing else changes; writing a value the patterns cover is
refused with :class:`StoreKeyError`.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import hashlib
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from saucer.store.inflate import InflateError, inflate
from saucer.store.model import StoreKeyError

__all__ = [
    "ENCRYPTED",
    "KEY_ENV",
    "KeyRing",
    "Sealer",
    "StoreKeyError",
    "load_key",
    "new_key",
    "target_of",
]

#: What a sealed value reads as without the key.
ENCRYPTED = "<encrypted>"
#: The environment variable holding the store key (base64 of 32 bytes).
KEY_ENV = "SAUCER_STORE_KEY"

_KEY_ID = 8
_NONCE = 12
_VALUE_FIELDS = ("value", "expected", "by")

#: The keys of a session's meta that stay plain when the meta is sealed: what the listings show without
#: the key (task and mode) and what the store itself reads (a fork's origin, a prune's first version).
PLAIN_SESSION_META = frozenset({"task", "mode", "status", "forked_from", "at", "pruned_to", "imported_from"})
#: The keys of an event's meta that stay plain: what a reader without the key shows of a session (kind,
#: status and its reason, cost), what the summaries of records older than format 6 are upcast from
#: (:mod:`saucer.store.upcast`), and a prune's marker. The rest (the round's request, the step's
#: commands, results and cursor, LLM calls...) is sealed. A commit's SummaryDelta is never sealed.
PLAIN_EVENT_META = frozenset(
    {"kind", "session_status", "reason", "cost", "cost_summary", "summary", "pruned", "damaged"}
)
#: Meta is sealed when the patterns cover this name: the meta holds the request (and all the session did).
META_GUARD = "REQUEST"


def new_key() -> str:
    """A fresh store key, as the text ``SAUCER_STORE_KEY`` or a key file holds."""
    return base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def _parse_key(text: str, where: str) -> bytes:
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != 32:
        raise StoreKeyError(
            f"the store key in {where} is not 32 bytes in base64; make one with: "
            'python -c "import base64, os; print(base64.b64encode(os.urandom(32)).decode())"'
        )
    return key


def load_key(key_file: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> bytes | None:
    """The store key from ``SAUCER_STORE_KEY``, else from ``key_file``; None when neither is given."""
    env = os.environ if env is None else env
    text = env.get(KEY_ENV)
    if text:
        return _parse_key(text, KEY_ENV)
    if key_file is None:
        return None
    path = Path(key_file).expanduser()
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise StoreKeyError(
            f"cannot read the store key file {str(path)!r}: {(exc.strerror if isinstance(exc, OSError) else None) or exc}"
        ) from None
    return _parse_key(text, f"the key file {str(path)!r}")


def key_id(key: bytes) -> bytes:
    """A short public fingerprint of a key (stored with each token)."""
    return hashlib.sha256(b"saucer.store.key\x00" + key).digest()[:_KEY_ID]


class KeyRing:
    """One AES-256-GCM key and its id."""

    __slots__ = ("key", "id", "_aead")

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.id = key_id(key)
        self._aead = AESGCM(key)

    def seal(self, session_id: str, target: str, data: Any) -> str:
        nonce = secrets.token_bytes(_NONCE)
        ct = self._aead.encrypt(nonce, orjson.dumps(data), _aad(session_id, target))
        return base64.b64encode(self.id + nonce + ct).decode("ascii")

    def open(self, session_id: str, target: str, token: str) -> Any:
        try:
            raw = base64.b64decode(token, validate=True)
        except (binascii.Error, ValueError, TypeError):
            raise StoreKeyError(
                f"session {session_id!r}: the sealed value of {target} is damaged (not base64)"
            ) from None
        if raw[:_KEY_ID] != self.id:
            raise StoreKeyError(
                f"session {session_id!r}: {target} was sealed with another store key than the one given "
                f"(key id {raw[:_KEY_ID].hex()}, given {self.id.hex()}); set {KEY_ENV} or store.key_file to that key"
            )
        try:
            plain = self._aead.decrypt(
                raw[_KEY_ID : _KEY_ID + _NONCE], raw[_KEY_ID + _NONCE :], _aad(session_id, target)
            )
        except InvalidTag:
            raise StoreKeyError(
                f"session {session_id!r}: the sealed value of {target} does not open with its key "
                "(damaged, or moved from another session or key)"
            ) from None
        if plain[:1] == b"x":  # sealed compressed (formats 4, 5): zlib's first byte; no JSON text starts with "x"
            try:
                plain = inflate(plain)
            except InflateError as exc:
                raise StoreKeyError(
                    f"session {session_id!r}: the sealed value of {target} does not inflate ({exc})"
                ) from None
        return orjson.loads(plain)


def _aad(session_id: str, target: str) -> bytes:
    return (
        b"saucer.sealed/1\x00"
        + session_id.encode("utf-8", "surrogatepass")
        + b"\x00"
        + target.encode("utf-8", "surrogatepass")
    )


def target_of(op: Mapping[str, Any]) -> str:
    name = op.get("name")
    return name if name is not None else f"vars.{op['var']}"


#: The parts of a snapshot's state that hold values, and the prefix of their targets
#: (a name's value packed on its own, see :class:`saucer.context.events.Packed`, is still that name's).
SNAPSHOT_SECTIONS = (("names", ""), ("vars", "vars."), ("packed", ""))


class Sealer:
    """Seals and opens the values that ``patterns`` cover, with ``key`` (None: read-only, sealed values stay shut)."""

    def __init__(self, patterns: Sequence[str], key: bytes | None) -> None:
        for pattern in patterns:
            if not isinstance(pattern, str) or not pattern:
                raise ValueError(f"store.encrypt: each pattern is a non-empty string, not {pattern!r}")
        self.patterns = tuple(patterns)
        self.ring = KeyRing(key) if key is not None else None
        self._covers: dict[str, bool] = {}

    def covers(self, target: str) -> bool:
        """Whether values of ``target`` (``REQUEST``, ``vars.api_key``) are sealed."""
        hit = self._covers.get(target)
        if hit is None:
            hit = any(fnmatch.fnmatchcase(target, p) for p in self.patterns)
            if len(self._covers) < 10_000:
                self._covers[target] = hit
        return hit

    def _require(self, session_id: str, target: str) -> KeyRing:
        if self.ring is None:
            raise StoreKeyError(
                f"session {session_id!r}: store.encrypt covers {target}, but no store key is given; "
                f"set {KEY_ENV} or store.key_file (nothing was written)"
            )
        return self.ring

    # ------------------------------------------------------------ events

    def seal_ops(self, session_id: str, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``ops`` with the values of covered targets sealed (the same list when none is)."""
        out: list[dict[str, Any]] | None = None
        for index, op in enumerate(ops):
            if op.get("op") == "delete" or op.get("op") == "sealed" or not self.covers(target := target_of(op)):
                continue
            if out is None:
                out = list(ops)
            inner = {k: v for k, v in op.items() if k in _VALUE_FIELDS or k == "op"}
            sealed = {k: v for k, v in op.items() if k not in _VALUE_FIELDS}
            sealed["op"] = "sealed"
            sealed["sealed"] = self._require(session_id, target).seal(session_id, target, inner)
            out[index] = sealed
        return ops if out is None else out

    def open_ops(self, session_id: str, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``ops`` with sealed operations opened; without a key they stay sealed (and read as :data:`ENCRYPTED`)."""
        if self.ring is None:
            return ops
        out: list[dict[str, Any]] | None = None
        for index, op in enumerate(ops):
            if op.get("op") != "sealed":
                continue
            if out is None:
                out = list(ops)
            target = target_of(op)
            inner = self.ring.open(session_id, target, op["sealed"])
            opened = {k: v for k, v in op.items() if k not in ("op", "sealed")}
            opened.update(inner)
            out[index] = opened
        return ops if out is None else out

    # -------------------------------------------------------------- meta

    @property
    def seals_meta(self) -> bool:
        """Whether session and event meta are sealed (the patterns cover :data:`META_GUARD`)."""
        return self.covers(META_GUARD)

    def seal_meta(self, session_id: str, target: str, meta: dict[str, Any], plain: frozenset[str]) -> dict[str, Any]:
        """``meta`` with every key but ``plain`` sealed under ``"sealed"`` (a plan on its own, under
        ``"plan"``: a store keeps it apart); the same dict when nothing is to be sealed."""
        hidden = {k: v for k, v in meta.items() if k not in plain}
        if not self.seals_meta or not hidden or _is_token(meta.get("sealed")):
            return meta
        ring = self._require(session_id, META_GUARD)
        out = {k: v for k, v in meta.items() if k in plain}
        if "plan" in hidden and isinstance(hidden["plan"], dict) and set(hidden["plan"]) == {"sealed"}:
            out["plan"] = hidden.pop("plan")  # sealed already
        if "plan" in hidden:
            out["plan"] = {"sealed": ring.seal(session_id, f"{target}.plan", hidden.pop("plan"))}
        if hidden:
            out["sealed"] = ring.seal(session_id, target, hidden)
        if isinstance(hidden.get("request"), str):  # what a listing shows of it, sealed on its own: see open_brief
            out["request"] = ring.seal(session_id, f"{target}.request", _brief(hidden["request"]))
        return out

    def open_brief(self, session_id: str, text: str | None) -> str | None:
        """A listing's request as the store kept it: opened when sealed by :meth:`seal_meta`
        (:data:`ENCRYPTED` without the key), as it is otherwise."""
        if text is None or not _looks_sealed(text):
            return text
        if self.ring is None:
            return ENCRYPTED
        try:
            opened = self.ring.open(session_id, "meta.request", text)
        except StoreKeyError:
            return text  # not a token after all: a request written before meta was sealed
        return opened if isinstance(opened, str) else text

    def open_meta(self, session_id: str, target: str, meta: dict[str, Any]) -> dict[str, Any]:
        """``meta`` opened; without the key its sealed part is :data:`ENCRYPTED` and its plan left out."""
        token = meta.get("sealed")
        plan = meta.get("plan")
        plan_token = (
            plan["sealed"] if isinstance(plan, dict) and set(plan) == {"sealed"} and _is_token(plan["sealed"]) else None
        )
        if not _is_token(token) and plan_token is None:
            return meta
        out = {k: v for k, v in meta.items() if k != "sealed" and not (k == "plan" and plan_token is not None)}
        if self.ring is None:
            if _is_token(token):
                out["sealed"] = ENCRYPTED
                if "request" in out:
                    out["request"] = ENCRYPTED
            return out
        if _is_token(token):
            out.update(self.ring.open(session_id, target, token))
        if plan_token is not None:
            out["plan"] = self.ring.open(session_id, f"{target}.plan", plan_token)
        return out

    # --------------------------------------------------------- snapshots

    def seal_state(self, session_id: str, state: dict[str, Any]) -> dict[str, Any]:
        """A snapshot's state with covered values moved, sealed, under ``"sealed"``."""
        sealed: dict[str, dict[str, str]] = {}
        out = dict(state)
        for section, prefix in SNAPSHOT_SECTIONS:
            values = state.get(section) or {}
            hits = [k for k in values if self.covers(prefix + k)]
            if not hits:
                continue
            out[section] = {k: v for k, v in values.items() if k not in hits}
            sealed[section] = {
                k: self._require(session_id, prefix + k).seal(session_id, prefix + k, values[k]) for k in hits
            }
        if sealed:
            out["sealed"] = sealed
        return out

    def open_state(self, session_id: str, state: dict[str, Any]) -> dict[str, Any]:
        """A snapshot's state with its sealed values back in place (without a key: as stored)."""
        sealed = state.get("sealed")
        if not sealed or self.ring is None:
            return state
        out = {k: v for k, v in state.items() if k != "sealed"}
        for section, prefix in SNAPSHOT_SECTIONS:
            tokens = sealed.get(section) or {}
            if tokens:
                values = out[section] = dict(out.get(section) or {})
                for k, token in tokens.items():
                    values[k] = self.ring.open(session_id, prefix + k, token)
        return out


def _is_token(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and value != ENCRYPTED


def _brief(request: str) -> str:
    # Short enough that its token stays under the listing's cut (summary.REQUEST_CHARS, 500): 280 bytes of
    # JSON give a token of 4/3 * (8 + 12 + 280 + 16) < 430 characters.
    brief = request[:200]
    while len(orjson.dumps(brief)) > 280:
        brief = brief[: len(brief) * 3 // 4]
    return brief


def _looks_sealed(text: str) -> bool:
    if len(text) < 48 or len(text) % 4 or " " in text:  # a token is at least 36 bytes (key id, nonce, tag)
        return False
    try:
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True
