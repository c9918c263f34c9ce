"""An in-process event store (``memory://`` or ``memory://NAME``).

Nothing survives the process. Stores opened with the same ``NAME`` share
their data, which lets several Contexts in one process act as concurrent
writers of one session.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Iterator

from saucer.context.events import Event
from saucer.store.base import (
    ConflictError,
    EventStore,
    FencedError,
    Lease,
    LeaseHeldError,
    SessionExistsError,
    SessionInfo,
    Snapshot,
)

__all__ = ["MemoryStore"]


class _Data:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.infos: dict[str, SessionInfo] = {}
        self.events: dict[str, list[Event]] = {}
        self.snapshots: dict[str, dict[int, Snapshot]] = {}
        self.leases: dict[str, Lease] = {}
        self.tokens: dict[str, int] = {}


_SHARED: dict[str, _Data] = {}
_SHARED_LOCK = threading.Lock()


class MemoryStore(EventStore):
    """Keeps events and snapshots in memory; ``name`` shares them within the process."""

    def __init__(self, name: str | None = None) -> None:
        self.url = f"memory://{name or ''}"
        if name:
            with _SHARED_LOCK:
                self._d = _SHARED.setdefault(name, _Data())
        else:
            self._d = _Data()

    def _create(self, info: SessionInfo) -> None:
        with self._d.lock:
            if info.session_id in self._d.infos:
                raise SessionExistsError(f"session {info.session_id!r} already exists")
            self._d.infos[info.session_id] = info
            self._d.events[info.session_id] = []
            self._d.snapshots[info.session_id] = {}

    def _info(self, session_id: str) -> SessionInfo | None:
        return self._d.infos.get(session_id)

    def _append(self, event: Event, expected_version: int, fence: int | None) -> None:
        d = self._d
        with d.lock:
            info = d.infos.get(event.session_id)
            if info is None:
                from saucer.store.base import SessionNotFoundError

                raise SessionNotFoundError(event.session_id)
            if fence is not None:
                current = d.tokens.get(event.session_id)
                if current != fence:
                    lease = d.leases.get(event.session_id)
                    raise FencedError(event.session_id, fence, current, lease.owner if lease else None)
            if info.version != expected_version:
                raise ConflictError(event.session_id, expected_version, info.version)
            d.events[event.session_id].append(event)
            d.infos[event.session_id] = replace(info, version=event.version, updated_at=event.timestamp)

    def _read(self, session_id: str, after: int, upto: int | None) -> Iterator[Event]:
        with self._d.lock:
            events = list(self._d.events.get(session_id, ()))
        for event in events:
            if event.version <= after:
                continue
            if upto is not None and event.version > upto:
                break
            yield event

    def _snapshot(self, session_id: str, upto: int | None) -> Snapshot | None:
        with self._d.lock:
            snaps = self._d.snapshots.get(session_id, {})
            versions = [v for v in snaps if upto is None or v <= upto]
            return snaps[max(versions)] if versions else None

    def save_snapshot(self, snapshot: Snapshot) -> None:
        with self._d.lock:
            self._d.snapshots.setdefault(snapshot.session_id, {})[snapshot.version] = snapshot

    def sessions(self) -> list[SessionInfo]:
        with self._d.lock:
            return sorted(self._d.infos.values(), key=lambda i: i.updated_at, reverse=True)

    def delete_session(self, session_id: str) -> None:
        with self._d.lock:
            for table in (self._d.infos, self._d.events, self._d.snapshots, self._d.leases, self._d.tokens):
                table.pop(session_id, None)

    def acquire_lease(self, session_id: str, owner: str, ttl: float) -> Lease:
        d = self._d
        now = time.time()
        with d.lock:
            self.session_info(session_id)
            held = d.leases.get(session_id)
            if held is not None and held.owner != owner and held.expires_at > now:
                raise LeaseHeldError(session_id, held.owner, held.expires_at)
            token = d.tokens.get(session_id, 0)
            if held is None or held.owner != owner or held.expires_at <= now:
                token += 1
            d.tokens[session_id] = token
            lease = Lease(session_id, owner, token, now + ttl)
            d.leases[session_id] = lease
            return lease

    def release_lease(self, lease: Lease) -> None:
        with self._d.lock:
            held = self._d.leases.get(lease.session_id)
            if held is not None and held.token == lease.token and held.owner == lease.owner:
                self._d.leases[lease.session_id] = replace(held, expires_at=0.0)
