"""Helpers for the Context tests: a store that counts what it reads, and ways to damage records."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from saucer.context.events import Event
from saucer.store.base import EventStore, Lease, SessionInfo, Snapshot
from saucer.store.summary import Counters


class CountingStore(EventStore):
    """Delegates to another store and counts the events and snapshots it reads."""

    def __init__(self, inner: EventStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.events_read = 0
        self.snapshots_read = 0
        self.appends = 0

    def reset(self) -> None:
        self.events_read = self.snapshots_read = self.appends = 0

    def create_row(self, info: SessionInfo, counters: Counters) -> None:
        self.inner.create_row(info, counters)

    def row(self, session_id: str) -> SessionInfo | None:
        return self.inner.row(session_id)

    def write_event(self, event: Event, expected_version: int, fence: int | None) -> None:
        self.appends += 1
        self.inner.write_event(event, expected_version, fence)

    def read_own(self, session_id: str, after: int, upto: int | None) -> Iterator[Event]:
        for event in self.inner.read_own(session_id, after, upto):
            self.events_read += 1
            yield event

    def own_snapshot(self, session_id: str, upto: int | None) -> Snapshot | None:
        snap = self.inner.own_snapshot(session_id, upto)
        if snap is not None:
            self.snapshots_read += 1
        return snap

    def save_snapshot(self, snapshot: Snapshot) -> None:
        self.inner.save_snapshot(snapshot)

    def prune_snapshots(self, session_id: str, keep: int) -> None:
        self.inner.prune_snapshots(session_id, keep)

    def quarantine_record(self, session_id: str, version: int) -> bool:
        return self.inner.quarantine_record(session_id, version)

    def sessions(self) -> list[SessionInfo]:
        return self.inner.sessions()

    def delete_rows(self, session_id: str) -> None:
        self.inner.delete_rows(session_id)

    def acquire_lease(self, session_id: str, owner: str, ttl: float) -> Lease:
        return self.inner.acquire_lease(session_id, owner, ttl)

    def release_lease(self, lease: Lease) -> None:
        self.inner.release_lease(lease)

    def lease_of(self, session_id: str) -> Lease | None:
        return self.inner.lease_of(session_id)

    def close(self) -> None:
        self.inner.close()


def damage_event(path: Path, session_id: str, version: int, payload: bytes = b'{"ops": [tor') -> None:
    """Overwrite one stored event's payload, as a torn write or a bad disk would."""
    with sqlite3.connect(path) as conn:
        n = sum(
            conn.execute(
                f"UPDATE {table} SET payload = ? WHERE session_id = ? AND version = ?", (payload, session_id, version)
            ).rowcount
            for table in ("events", "events_recent")
        )
    conn.close()
    assert n == 1


def damage_snapshot(path: Path, session_id: str, version: int) -> None:
    with sqlite3.connect(path) as conn:
        n = conn.execute(
            "UPDATE snapshots SET state = ? WHERE session_id = ? AND version = ?", (b"\x00garbage", session_id, version)
        ).rowcount
    conn.close()
    assert n == 1


def rows(path: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()
