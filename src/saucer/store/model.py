"""What every event store holds and says: its records (events, snapshots,
sessions, leases), the optional features a backend declares, its errors, and
the rules for what it accepts as session ids and versions.

An :class:`Event` is one committed change to a session: a list of operations
(plain JSON dicts, see :mod:`saucer.context.events` for their vocabulary) plus
who made it and when. The store keeps operations and snapshot states as JSON
data it does not interpret; the Context above it gives them their meaning.

Errors follow PEP 249's shape: every error that leaves a store derives from
:class:`StoreError` and says, in one sentence, what happened and what to do.
"""

from __future__ import annotations

import contextlib
import gc
import operator
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import chain
from typing import Any

from saucer.store.summary import SummaryDelta

__all__ = [
    "Event",
    "EventDraft",
    "make_event",
    "Feature",
    "copy_json",
    "creation_meta",
    "paused_gc",
    "op_key",
    "StoreError",
    "ValueNotStorableError",
    "ConflictError",
    "FencedError",
    "NotParticipantError",
    "PARTICIPANTS_KEY",
    "check_participants",
    "SessionNotFoundError",
    "SessionExistsError",
    "CorruptRecordError",
    "DamagedStoreError",
    "FormatTooNewError",
    "StoreKeyError",
    "InvalidSessionIdError",
    "OutcomeUnknownError",
    "ReadOnlyError",
    "LeaseHeldError",
    "NotSupportedError",
    "VersionNotFoundError",
    "VersionPrunedError",
    "SESSION_ID_MAX_LENGTH",
    "MAX_TIMESTAMP",
    "timestamp_problem",
    "check_session_id",
    "check_version",
    "SessionInfo",
    "Snapshot",
    "Lease",
    "SessionHead",
]


class ValueNotStorableError(TypeError):
    """A value cannot be stored durably; the message names the key and the path inside it.

    Raised before anything is written: by a Context when a value is set (see
    :func:`saucer.context.wire.to_wire`), and by a store when an event's
    ``meta`` is not JSON data (``append`` encodes it once, where it becomes durable).
    """

    def __init__(self, key: str, path: str, reason: str) -> None:
        self.key = key
        self.path = path
        self.reason = reason
        where = f"{key}{path}" if path else key
        super().__init__(f"value for {where!s} cannot be stored: {reason}")


class Feature(StrEnum):
    """What a backend may leave out; each backend declares what it has in :attr:`EventStore.features`.

    A method of a feature the backend does not declare raises
    :class:`NotSupportedError` (or, for the caches, says it did nothing); the
    contract suite :mod:`saucer.store.testing` checks each declared feature
    and the refusal of the others.
    """

    #: :meth:`EventStore.replace_history`: prune a session's old history (and give its forks their copies).
    REPLACE_HISTORY = "replace_history"
    #: :meth:`EventStore.import_log`: create a session with a whole log at once.
    IMPORT = "import"
    #: :meth:`EventStore.prune_snapshots` drops old snapshots (without it they are all kept).
    SNAPSHOT_PRUNING = "snapshot_pruning"
    #: :meth:`EventStore.quarantine_record` replaces a damaged record (a store whose
    #: records cannot be damaged, such as memory, needs not).
    QUARANTINE = "quarantine"
    #: Concurrent appends of one process share one transaction (``_group_committer()``).
    GROUP_COMMIT = "group_commit"
    #: :meth:`EventStore.rewrite_events` and :meth:`EventStore.record_formats`: stored records
    #: are rewritten in place (``saucer store migrate --rewrite``, ``saucer store rekey``).
    REWRITE = "rewrite"


class StoreError(Exception):
    """Base class of every store error."""


class ConflictError(StoreError):
    """Another writer committed first: the commit was based on a stale version.

    ``keys`` names the keys the other writers changed since that version (what
    a reload brings in), when the committer could read them.
    """

    def __init__(self, session_id: str, expected: int, actual: int | None, keys: Sequence[str] = ()) -> None:
        self.session_id = session_id
        self.expected = expected
        self.actual = actual
        self.keys = list(keys)
        detail = f" (keys: {', '.join(self.keys)})" if self.keys else ""
        super().__init__(
            f"session {session_id!r}: commit based on version {expected}, but the store is at "
            f"version {actual}; another writer committed first{detail}. Call reload() and retry."
        )


class FencedError(ConflictError):
    """A commit carried a lease token that is no longer current (the lease was taken over)."""

    def __init__(self, session_id: str, token: int, current: int | None, holder: str | None) -> None:
        StoreError.__init__(
            self,
            f"session {session_id!r}: commit with lease token {token} refused; the lease is now "
            f"held by {holder!r} with token {current} (this writer was fenced off)",
        )
        self.session_id = session_id
        self.expected = token
        self.actual = current
        self.keys = []
        self.holder = holder


class NotParticipantError(StoreError):
    """A write by an author who is not a participant of a session that declares its participants."""

    def __init__(self, session_id: str, author: str) -> None:
        self.session_id = session_id
        self.author = author
        super().__init__(
            f"{author!r} is not a participant of session {session_id!r}, so nothing was written "
            "(a participant can add it: Context.add_participants)"
        )


class SessionNotFoundError(StoreError, KeyError):
    """No session with that id."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        StoreError.__init__(self, f"no session {session_id!r} in this store")

    def __str__(self) -> str:
        return str(self.args[0])


class SessionExistsError(StoreError):
    """A session with that id already exists."""


class CorruptRecordError(StoreError):
    """A stored record of one session cannot be read; other sessions are unaffected."""

    def __init__(self, session_id: str, version: int, reason: str) -> None:
        self.session_id = session_id
        self.version = version
        self.reason = reason
        super().__init__(f"session {session_id!r}: record at version {version} is damaged ({reason})")


class DamagedStoreError(StoreError):
    """The store's file or database cannot be read at all: not a saucer store, or damaged."""

    def __init__(self, where: str, reason: str, check: str) -> None:
        self.where = where
        self.reason = reason
        super().__init__(f"{where} is not a readable saucer store ({reason}); check it with: {check}")


class InvalidSessionIdError(StoreError, ValueError):
    """A session id that breaks the rule of :func:`check_session_id`."""


class VersionNotFoundError(StoreError, ValueError):
    """A version a session does not have (beyond its head, or below its first readable version)."""

    def __init__(self, session_id: str, version: int, first: int, head: int, message: str | None = None) -> None:
        self.session_id = session_id
        self.version = version
        self.first = first
        self.head = head
        super().__init__(message or f"session {session_id!r} has versions {first}..{head}, not {version}")


class VersionPrunedError(VersionNotFoundError):
    """A version whose history was pruned; ``first`` is the session's first readable version."""

    def __init__(self, session_id: str, version: int, first: int, head: int) -> None:
        super().__init__(
            session_id,
            version,
            first,
            head,
            f"session {session_id!r}: version {version} was pruned; the first readable version is {first} "
            f"(versions {first}..{head} remain)",
        )


class OutcomeUnknownError(StoreError):
    """The connection broke while a commit was in flight: it may or may not be written.

    Never retried blindly (that could write it twice): a :class:`~saucer.context.Context`
    checks at its next commit whether ``version`` holds its event.
    """

    def __init__(
        self, session_id: str, version: int, cause: str, where: str = "the store", event: Event | None = None
    ) -> None:
        self.session_id = session_id
        self.version = version
        #: The event whose commit had this unknown outcome.
        self.event = event
        super().__init__(
            f"session {session_id!r}: the connection to {where} broke while committing version {version}; "
            f"it may or may not be written (reload to see): {cause}"
        )


class NotSupportedError(StoreError):
    """The backend does not have this optional feature (see ``EventStore.features``)."""


class FormatTooNewError(StoreError):
    """A record or a store written in a newer format than this saucer reads."""

    def __init__(self, what: str, found: int, supported: int) -> None:
        self.what = what
        self.found = found
        self.supported = supported
        super().__init__(
            f"{what} is in record format version {found}, newer than this saucer reads "
            f"(up to version {supported}); upgrade saucer to read it"
        )


class StoreKeyError(StoreError):
    """The store key is missing, malformed, or not the one a value was sealed with
    (values encrypted at rest: :mod:`saucer.store.crypto`)."""


class ReadOnlyError(StoreError):
    """A write was attempted on a read-only Context (one opened ``at=`` a version)."""


class LeaseHeldError(StoreError):
    """Another worker holds the lease on the session."""

    def __init__(self, session_id: str, holder: str, expires_at: float) -> None:
        self.session_id = session_id
        self.holder = holder
        self.expires_at = expires_at
        left = max(0.0, expires_at - time.time())
        super().__init__(
            f"session {session_id!r} is being run by {holder!r} (lease expires in {left:.1f}s unless renewed)"
        )


@dataclass(frozen=True, slots=True)
class Event:
    """One committed, attributable change to a session's Context."""

    session_id: str
    version: int
    timestamp: float
    author: str
    round: int | None
    step: int | None
    ops: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)
    #: What this commit changes in its session's summary, as its writer said (None: nothing
    #: but the step counter); the store keeps the summary from this, never from ``meta``.
    summary: SummaryDelta | None = None

    def keys(self) -> list[str]:
        """The names and vars this event touches (vars prefixed with ``vars.``)."""
        return [op_key(op) for op in self.ops]

    def to_dict(self, *, summary: bool = False) -> dict[str, Any]:
        """A JSON-serialisable dict of this event; with ``summary``, also its summary delta
        (``"summary"``: its stored form, or None), as an export keeps it."""
        return {
            "session_id": self.session_id,
            "version": self.version,
            "timestamp": self.timestamp,
            "author": self.author,
            "round": self.round,
            "step": self.step,
            "ops": self.ops,
            "meta": self.meta,
            **({"summary": None if self.summary is None else self.summary.to_wire()} if summary else {}),
        }


_EVENT_SLOTS = tuple(
    Event.__dict__[name].__set__
    for name in ("session_id", "version", "timestamp", "author", "round", "step", "ops", "meta", "summary")
)
_new_object = object.__new__


def make_event(
    session_id: str,
    version: int,
    timestamp: float,
    author: str,
    round: int | None,
    step: int | None,
    ops: list[dict[str, Any]],
    meta: dict[str, Any],
    summary: SummaryDelta | None,
) -> Event:
    """``Event(...)`` with every field given, made in half the time: a frozen dataclass's ``__init__``
    sets each field through ``object.__setattr__``; this sets the slots directly (one event per commit)."""
    event: Event = _new_object(Event)
    s_id, s_version, s_ts, s_author, s_round, s_step, s_ops, s_meta, s_summary = _EVENT_SLOTS
    s_id(event, session_id)
    s_version(event, version)
    s_ts(event, timestamp)
    s_author(event, author)
    s_round(event, round)
    s_step(event, step)
    s_ops(event, ops)
    s_meta(event, meta)
    s_summary(event, summary)
    return event


@dataclass(slots=True)
class EventDraft:
    """One event of :meth:`~saucer.store.EventStore.append_many`, before it has a version: what
    :meth:`~saucer.store.EventStore.append` takes, and when it happened (None: when it is appended)."""

    ops: list[dict[str, Any]]
    author: str
    round: int | None = None
    step: int | None = None
    meta: dict[str, Any] | None = None
    summary: SummaryDelta | None = None
    timestamp: float | None = None


def op_key(op: Mapping[str, Any]) -> str:
    """The display key of an operation: the typed name, or ``vars.<key>``."""
    name = op.get("name")
    return name if name is not None else f"vars.{op['var']}"


_gc_lock = threading.Lock()
_gc_pauses = 0
_gc_was_enabled = False


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Hold Python's cyclic garbage collector off while building a large, acyclic value.

    Decoding a long session's state makes hundreds of thousands of dicts and
    lists; each batch of new containers would trigger a collection that walks
    all of them again, which costs more than the decoding (a 3.6 MB packed
    ``STRUCTURAL_LOGS``: 25 ms decoded with the collector held off, 45-150 ms
    with it). JSON values hold no reference cycles, so nothing is left for the
    collector to find. Nested and concurrent pauses (threads) count: the
    collector runs again when the last one ends, and only if it was on before.
    """
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


def copy_json(value: Any) -> Any:
    """Deep-copy JSON data (dicts, lists, scalars); much faster than ``copy.deepcopy``."""
    cls = value.__class__
    if cls is dict:
        if _CONTAINERS.isdisjoint(map(type, value.values())):  # flat (a log entry): copied in C
            return value.copy()
        # Scalars (most items) are taken as they are, without a call each.
        return {k: copy_json(v) if v.__class__ in _CONTAINERS else v for k, v in value.items()}
    if cls is list:
        types = set(map(type, value))
        if _CONTAINERS.isdisjoint(types):
            return value.copy()
        if types == _DICT and _CONTAINERS.isdisjoint(map(type, _chain(map(dict.values, value)))):
            return list(map(dict.copy, value))  # flat dicts (a structural log's entries): copied in C
        return [copy_json(v) if v.__class__ in _CONTAINERS else v for v in value]
    return value


_CONTAINERS = frozenset((dict, list))
_DICT = frozenset((dict,))
_chain = chain.from_iterable


#: Where a session's row keeps the participants it was made with (written only by
#: ``EventStore.create_session(participants=...)``, read through :attr:`SessionInfo.participants`).
PARTICIPANTS_KEY = "participants"


def check_participants(names: Any) -> list[str]:
    """``names`` (an iterable of non-empty strings) as a sorted list without duplicates, else TypeError/ValueError."""
    if isinstance(names, str) or not hasattr(names, "__iter__"):
        raise TypeError(f"participants are a list of names, not {type(names).__name__}")
    out = set()
    for name in names:
        if not isinstance(name, str) or not name.strip() or "\x00" in name:
            raise ValueError(f"a participant is a non-empty name, not {name!r}")
        out.add(name)
    return sorted(out)


def creation_meta(session_id: str, meta: dict[str, Any] | None, participants: Sequence[str] | None) -> dict[str, Any]:
    """A new session's meta, its id checked: ``participants`` (checked) are the only ones it declares."""
    check_session_id(session_id)
    meta = dict(meta or {})
    meta.pop(PARTICIPANTS_KEY, None)  # only the typed argument declares them
    if participants is not None:
        meta[PARTICIPANTS_KEY] = check_participants(participants)
    return meta


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session's row: its head version and, for a fork, where it branched off."""

    session_id: str
    version: int
    created_at: float
    updated_at: float
    parent_id: str | None = None
    parent_version: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def participants(self) -> frozenset[str] | None:
        """The authors the session was made with as its participants; None: it declared none
        (every writer may write). Those added since are in its state (see
        :meth:`saucer.context.Context.add_participants`)."""
        names = self.meta.get(PARTICIPANTS_KEY)
        return frozenset(names) if isinstance(names, list) else None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The materialised state of a session at ``version`` (wire form)."""

    session_id: str
    version: int
    timestamp: float
    state: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Lease:
    """The right to write a session, until ``expires_at``; ``token`` fences stale holders."""

    session_id: str
    owner: str
    token: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class SessionHead:
    """A session's row with its newest event and its lease: what a listing of sessions shows.

    ``last`` is None for a session without events, or whose newest record is
    damaged (see :meth:`EventStore.session_heads`).
    """

    info: SessionInfo
    last: Event | None
    lease: Lease | None


#: The longest session id (in characters, all ASCII). It keeps every id well
#: inside PostgreSQL's NOTIFY payload, file names and one terminal line; the
#: engine's ids (``<task>-<YYYYmmdd-HHMMSS>-<hex>``) are at most 67.
SESSION_ID_MAX_LENGTH = 200
_SESSION_ID = re.compile(r"[A-Za-z0-9._:@+-]+")
_SESSION_ID_BAD = re.compile(r"[^A-Za-z0-9._:@+-]")


def check_session_id(session_id: Any) -> str:
    """Return ``session_id`` if it is a valid id for a new session, else raise.

    The rule, the same on every backend: 1 to :data:`SESSION_ID_MAX_LENGTH`
    characters, each an ASCII letter or digit or one of ``. _ - : @ +``,
    and not ``.`` or ``..`` (a path segment that means "here" or "up": a link
    to such a session would lead a browser elsewhere). Raises :class:`InvalidSessionIdError` (a ``StoreError`` and a ``ValueError``).
    """
    if not isinstance(session_id, str):
        raise InvalidSessionIdError(f"a session id is a string, not {type(session_id).__name__}")
    if _SESSION_ID.fullmatch(session_id) and len(session_id) <= SESSION_ID_MAX_LENGTH and session_id not in (".", ".."):
        return session_id
    shown = repr(session_id if len(session_id) <= 60 else session_id[:60] + "...")
    if not session_id:
        problem = "it is empty"
    elif len(session_id) > SESSION_ID_MAX_LENGTH:
        problem = f"it has {len(session_id)} characters"
    elif session_id in (".", ".."):
        problem = "it is a path segment of its own"
    else:
        bad = _SESSION_ID_BAD.search(session_id)
        assert bad is not None
        problem = f"{bad.group()!r} at index {bad.start()} is not allowed"
    raise InvalidSessionIdError(
        f"session id {shown} is not valid ({problem}): use 1 to {SESSION_ID_MAX_LENGTH} "
        "ASCII letters, digits and . _ - : @ +"
    )


#: The latest time a stored record may carry (9999-12-31T23:59:59 UTC): every surface can show it.
MAX_TIMESTAMP = 253402300799.0


def timestamp_problem(value: Any) -> str | None:
    """Why ``value`` cannot be a stored time (seconds since the epoch, as ``time.time()`` gives), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number of seconds, not {type(value).__name__}"
    if not 0 <= value <= MAX_TIMESTAMP:  # also refuses NaN
        return f"must be a time between 1970 and 9999 (0 to {MAX_TIMESTAMP:.0f} seconds), not {value!r}"
    return None


def check_version(value: Any, what: str = "version") -> int:
    """``value`` as an int version; TypeError for anything else (a float, a bool, a string)."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, not {value!r}") from None
