"""Durable event stores: ``open_store(url)`` and the shared interface and errors."""

from __future__ import annotations

from saucer.store.base import (
    SESSION_ID_MAX_LENGTH,
    ConflictError,
    CorruptRecordError,
    DamagedStoreError,
    Event,
    EventStore,
    Feature,
    FencedError,
    InvalidSessionIdError,
    Lease,
    LeaseHeldError,
    NotSupportedError,
    OutcomeUnknownError,
    ReadOnlyError,
    SessionExistsError,
    SessionInfo,
    SessionNotFoundError,
    Snapshot,
    StoreError,
    VersionNotFoundError,
    VersionPrunedError,
    check_session_id,
)

__all__ = [
    "open_store",
    "check_session_id",
    "SESSION_ID_MAX_LENGTH",
    "ConflictError",
    "CorruptRecordError",
    "DamagedStoreError",
    "Event",
    "EventStore",
    "Feature",
    "FencedError",
    "InvalidSessionIdError",
    "Lease",
    "LeaseHeldError",
    "NotSupportedError",
    "OutcomeUnknownError",
    "ReadOnlyError",
    "SessionExistsError",
    "SessionInfo",
    "SessionNotFoundError",
    "Snapshot",
    "StoreError",
    "VersionNotFoundError",
    "VersionPrunedError",
]


def open_store(url: str) -> EventStore:
    """Open an event store by URL.

    - ``memory://`` (private) or ``memory://NAME`` (shared within the process)
    - ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``
    - ``postgresql://user@host:port/db`` (optionally ``?schema=NAME``)
    """
    if not isinstance(url, str):
        raise TypeError(f"store URL must be a string, not {type(url).__name__}")
    # Each backend is imported when its URL is opened: psycopg (or sqlite3) costs
    # start-up time that a process using another backend should not pay.
    if url.startswith("memory://"):
        from saucer.store.memory import MemoryStore

        return MemoryStore(url[len("memory://"):] or None)
    if url.startswith("sqlite://"):
        from saucer.store.sqlite import SQLiteStore, path_from_url

        return SQLiteStore(path_from_url(url))
    if url.startswith(("postgresql://", "postgres://")):
        from saucer.store.postgres import PostgresStore

        return PostgresStore(url)
    raise ValueError(
        f"unknown store URL {url!r}: use memory://, sqlite:///path.db or postgresql://user@host/db"
    )
