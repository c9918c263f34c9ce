"""A fourth store backend, written against the backend contract alone (:class:`saucer.store.Recorder`).

It keeps everything in plain dicts behind one lock and implements the eleven
abstract methods, plus :meth:`kept_counters` so that listings read its kept
summaries; it declares no optional feature. ``test_dict_backend.py`` runs the
whole public contract suite (:mod:`saucer.store.testing`) against it: that the
suite passes is what shows the contract is as narrow as it says.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from saucer.store import (
    ConflictError,
    Event,
    EventStore,
    FencedError,
    Lease,
    LeaseHeldError,
    SessionExistsError,
    SessionInfo,
    SessionNotFoundError,
    Snapshot,
)
from saucer.store.model import copy_json
from saucer.store.recorder import check_fork_point
from saucer.store.summary import Counters, fold


@dataclass
class Tables:
    """What a :class:`DictStore` holds; two stores made on the same tables are two handles on one store."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    rows: dict[str, SessionInfo] = field(default_factory=dict)
    events: dict[str, dict[int, Event]] = field(default_factory=dict)
    snapshots: dict[str, dict[int, Snapshot]] = field(default_factory=dict)
    counters: dict[str, Counters] = field(default_factory=dict)
    leases: dict[str, Lease] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)


def _copy(event: Event) -> Event:
    return replace(event, ops=copy_json(event.ops), meta=copy_json(event.meta))


class DictStore(EventStore):
    """Sessions in dicts (``tables`` shared by every handle on the same store)."""

    def __init__(self, tables: Tables | None = None) -> None:
        self.tables = Tables() if tables is None else tables
        self.url = "dict://"

    def create_row(self, info: SessionInfo, counters: Counters) -> None:
        t = self.tables
        with t.lock:
            if info.session_id in t.rows:
                raise SessionExistsError(f"session {info.session_id!r} already exists")
            if info.parent_id is not None:
                parent = t.rows.get(info.parent_id)
                check_fork_point(info, None if parent is None else (parent.version, parent.meta.get("pruned_to", 0)))
            t.rows[info.session_id] = replace(info, meta=copy_json(info.meta))
            t.events[info.session_id], t.snapshots[info.session_id] = {}, {}
            t.counters[info.session_id] = counters

    def row(self, session_id: str) -> SessionInfo | None:
        with self.tables.lock:
            info = self.tables.rows.get(session_id)
        return None if info is None else replace(info, meta=copy_json(info.meta))

    def kept_counters(self, session_id: str) -> Counters | None:
        with self.tables.lock:
            return self.tables.counters.get(session_id)

    def write_event(self, event: Event, expected_version: int, fence: int | None) -> None:
        t, sid = self.tables, event.session_id
        with t.lock:
            info = t.rows.get(sid)
            if info is None:
                raise SessionNotFoundError(sid)
            if fence is not None and t.tokens.get(sid) != fence:
                lease = t.leases.get(sid)
                raise FencedError(sid, fence, t.tokens.get(sid), None if lease is None else lease.owner)
            if info.version != expected_version:
                raise ConflictError(sid, expected_version, info.version)
            t.events[sid][event.version] = _copy(event)
            t.rows[sid] = replace(info, version=event.version, updated_at=event.timestamp)
            t.counters[sid] = fold(t.counters[sid], event)

    def read_own(self, session_id: str, after: int, upto: int | None) -> Iterator[Event]:
        with self.tables.lock:
            log = self.tables.events.get(session_id, {})
            chosen = [log[v] for v in sorted(log) if after < v and (upto is None or v <= upto)]
        return iter([_copy(e) for e in chosen])

    def own_snapshot(self, session_id: str, upto: int | None) -> Snapshot | None:
        with self.tables.lock:
            snaps = self.tables.snapshots.get(session_id, {})
            versions = [v for v in snaps if upto is None or v <= upto]
            found = snaps[max(versions)] if versions else None
        return None if found is None else replace(found, state=copy_json(found.state))

    def save_snapshot(self, snapshot: Snapshot) -> None:
        with self.tables.lock:
            own = self.tables.snapshots.setdefault(snapshot.session_id, {})
            own[snapshot.version] = replace(snapshot, state=copy_json(snapshot.state))

    def sessions(self) -> list[SessionInfo]:
        with self.tables.lock:
            infos = [replace(i, meta=copy_json(i.meta)) for i in self.tables.rows.values()]
        return sorted(infos, key=lambda i: (-i.updated_at, i.session_id))

    def delete_rows(self, session_id: str) -> None:
        t = self.tables
        with t.lock:
            for table in (t.rows, t.events, t.snapshots, t.counters, t.leases, t.tokens):
                table.pop(session_id, None)

    def lease_of(self, session_id: str) -> Lease | None:
        with self.tables.lock:
            return self.tables.leases.get(session_id)

    def acquire_lease(self, session_id: str, owner: str, ttl: float) -> Lease:
        t, now = self.tables, time.time()
        with t.lock:
            if session_id not in t.rows:
                raise SessionNotFoundError(session_id)
            held = t.leases.get(session_id)
            if held is not None and held.owner != owner and held.expires_at > now:
                raise LeaseHeldError(session_id, held.owner, held.expires_at)
            token = t.tokens.get(session_id, 0)
            if held is None or held.owner != owner or held.expires_at <= now:
                token += 1  # a takeover: the old holder's appends are fenced off
            t.tokens[session_id] = token
            t.leases[session_id] = lease = Lease(session_id, owner, token, now + ttl)
            return lease

    def release_lease(self, lease: Lease) -> None:
        with self.tables.lock:
            held = self.tables.leases.get(lease.session_id)
            if held is not None and (held.owner, held.token) == (lease.owner, lease.token):
                self.tables.leases[lease.session_id] = replace(held, expires_at=0.0)
