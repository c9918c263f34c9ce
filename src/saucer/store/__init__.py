"""Durable event stores: ``open_store(url)`` and the shared interface and errors."""

from __future__ import annotations

import os
from collections.abc import Sequence

from saucer.store.base import (
    SESSION_ID_MAX_LENGTH,
    ConflictError,
    CorruptRecordError,
    DamagedStoreError,
    Event,
    EventDraft,
    EventStore,
    Feature,
    FencedError,
    FormatTooNewError,
    InvalidSessionIdError,
    Lease,
    LeaseHeldError,
    NotParticipantError,
    NotSupportedError,
    OutcomeUnknownError,
    ReadOnlyError,
    Recorder,
    SessionExistsError,
    SessionInfo,
    SessionNotFoundError,
    Snapshot,
    StoreError,
    StoreKeyError,
    SummaryDelta,
    VersionNotFoundError,
    VersionPrunedError,
    check_session_id,
)
from saucer.store.model import SessionHead

__all__ = [
    "open_store",
    "check_session_id",
    "SESSION_ID_MAX_LENGTH",
    "ConflictError",
    "CorruptRecordError",
    "DamagedStoreError",
    "Event",
    "EventDraft",
    "EventStore",
    "Feature",
    "FencedError",
    "NotParticipantError",
    "FormatTooNewError",
    "StoreKeyError",
    "InvalidSessionIdError",
    "Lease",
    "LeaseHeldError",
    "NotSupportedError",
    "OutcomeUnknownError",
    "ReadOnlyError",
    "Recorder",
    "SessionExistsError",
    "SessionHead",
    "SessionInfo",
    "SessionNotFoundError",
    "Snapshot",
    "StoreError",
    "SummaryDelta",
    "VersionNotFoundError",
    "VersionPrunedError",
]


def open_store(url: str, *, encrypt: Sequence[str] = (), key_file: str | os.PathLike[str] | None = None) -> EventStore:
    """Open an event store by URL.

    - ``memory://`` (private) or ``memory://NAME`` (shared within the process)
    - ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``
    - ``postgresql://user@host:port/db`` (optionally ``?schema=NAME``)

    ``encrypt`` (``store.encrypt``) lists the names and ``vars.*`` keys whose
    values are encrypted at rest; the key comes from ``SAUCER_STORE_KEY`` or
    ``key_file`` (:mod:`saucer.store.crypto`). With a key or patterns, the
    store is a :class:`~saucer.store.sealed.SealedStore` over the backend.
    """
    backend = _open_backend(url)
    if not encrypt and key_file is None and not os.environ.get("SAUCER_STORE_KEY"):
        return backend
    try:
        from saucer.store.crypto import Sealer, load_key
        from saucer.store.sealed import SealedStore

        return SealedStore(backend, Sealer(list(encrypt), load_key(key_file)))
    except BaseException:
        backend.close()
        raise


def _open_backend(url: str) -> EventStore:
    if not isinstance(url, str):
        raise TypeError(f"store URL must be a string, not {type(url).__name__}")
    # Each backend is imported when its URL is opened: psycopg (or sqlite3) costs
    # start-up time that a process using another backend should not pay.
    if url.startswith("memory://"):
        from saucer.store.memory import MemoryStore

        return MemoryStore(url[len("memory://") :] or None)
    if url.startswith("sqlite://"):
        from saucer.store.sqlite import SQLiteStore, path_from_url

        return SQLiteStore(path_from_url(url))
    if url.startswith(("postgresql://", "postgres://")):
        from saucer.store.postgres import PostgresStore

        return PostgresStore(url)
    raise ValueError(f"unknown store URL {url!r}: use memory://, sqlite:///path.db or postgresql://user@host/db")
