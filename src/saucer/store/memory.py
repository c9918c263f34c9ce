"""An in-process event store (``memory://`` or ``memory://NAME``).

Nothing survives the process. Stores opened with the same ``NAME`` share
their data, which lets several Contexts in one process act as concurrent
writers of one session.

An event is kept as a durable backend keeps it: its operations and its meta
as JSON text (:class:`_Kept`), which is the store's own copy (nothing a
caller holds aliases it), costs one encoding per commit instead of a deep
copy, and leaves the garbage collector nothing to walk; a read decodes it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Generator, Iterator, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import orjson

from saucer.store.base import (
    ConflictError,
    EventStore,
    Feature,
    FencedError,
    Lease,
    LeaseHeldError,
    SessionExistsError,
    SessionInfo,
    SessionNotFoundError,
    Snapshot,
    StoreError,
)
from saucer.store.model import Event, copy_json
from saucer.store.recorder import check_fork_point
from saucer.store.summary import Counters, SummaryDelta, fold_events
from saucer.store.upcast import FORMAT_VERSION

__all__ = ["MemoryStore"]


class _Kept(NamedTuple):
    """An event as the store keeps it: its operations and meta as JSON text (see the module docs)."""

    session_id: str
    version: int
    timestamp: float
    author: str
    round: int | None
    step: int | None
    ops: bytes
    meta: bytes  # b"" for an empty meta
    summary: SummaryDelta | None

    def event(self) -> Event:
        """The event, decoded: a copy of the caller's own."""
        return Event(
            self.session_id,
            self.version,
            self.timestamp,
            self.author,
            self.round,
            self.step,
            orjson.loads(self.ops),
            orjson.loads(self.meta) if self.meta else {},
            self.summary,
        )


_dumps = orjson.dumps
_new_kept = tuple.__new__  # a NamedTuple's own __new__ is a Python function: one call more per commit


def _keep(event: Event, meta_json: bytes | None = None) -> _Kept:
    """``event`` as the store keeps it (``meta_json``: its meta's, when made already); TypeError
    (as a durable backend's) for what JSON cannot hold."""
    if meta_json is None:
        meta_json = _dumps(event.meta) if event.meta else b""
    return _new_kept(
        _Kept,
        (
            event.session_id,
            event.version,
            event.timestamp,
            event.author,
            event.round,
            event.step,
            _dumps(event.ops),
            meta_json,
            event.summary,
        ),
    )


class _Done:
    """An awaitable that is done at once (what :meth:`MemoryStore.awrite_event` returns)."""

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        return iter(())  # type: ignore[return-value]  # an iterator that ends at once is all await needs


_DONE = _Done()


class _Data:
    """The tables of one store (shared by the stores opened with the same name)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.rows: dict[str, SessionInfo] = {}  # read through ``infos``
        self.events: dict[str, list[_Kept]] = {}
        self.snapshots: dict[str, dict[int, Snapshot]] = {}
        self.leases: dict[str, Lease] = {}
        self.tokens: dict[str, int] = {}
        self.counters: dict[str, Counters] = {}  # the summary of each session (saucer.store.summary)
        # What a commit changes besides the log -- the session's head (version, time) and its
        # summary -- is kept aside and applied when read: the row made anew (``infos``), the
        # newest events folded into the counters (``counters_of``), not once per commit.
        self.heads: dict[str, tuple[int, float]] = {}
        self.unfolded: dict[str, int] = {}  # how many of the newest events the counters miss

    @property
    def infos(self) -> dict[str, SessionInfo]:
        """The session rows, each at its head."""
        heads = self.heads
        if heads:
            with self.lock:
                rows = self.rows
                for sid, (version, at) in heads.items():
                    info = rows[sid]
                    rows[sid] = SessionInfo(
                        sid, version, info.created_at, at, info.parent_id, info.parent_version, info.meta
                    )
                heads.clear()
        return self.rows

    def counters_of(self, session_id: str) -> Counters | None:
        """The session's summary counters, its newest events folded in (with the lock held)."""
        counters = self.counters.get(session_id)
        unfolded = self.unfolded.pop(session_id, 0)
        if unfolded:
            counters = fold_events(counters or Counters(), self.events[session_id][-unfolded:])
            self.counters[session_id] = counters
        return counters

    def forget(self, session_id: str) -> None:
        """Drop what is kept aside for the session (with the lock held; its row is read first if kept)."""
        self.heads.pop(session_id, None)
        self.unfolded.pop(session_id, None)

    # Held with ``with``: the lock, without a generator-based context manager
    # on every call (the memory store is what the benchmarks of the engine use).
    def __enter__(self) -> _Data:
        self.lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


_SHARED: dict[str, _Data] = {}
_SHARED_LOCK = threading.Lock()


class MemoryStore(EventStore):
    """Keeps events and snapshots in memory; ``name`` shares them within the process."""

    # No QUARANTINE (its records cannot be damaged) and no GROUP_COMMIT (nothing to flush).
    features = frozenset({Feature.REPLACE_HISTORY, Feature.IMPORT, Feature.SNAPSHOT_PRUNING, Feature.REWRITE})

    def __init__(self, name: str | None = None) -> None:
        self.url = f"memory://{name or ''}"
        if name:
            with _SHARED_LOCK:
                self._d = _SHARED.setdefault(name, _Data())
        else:
            self._d = _Data()
        self._meta_json: tuple[Event, bytes] | None = None  # see note_meta_json

    def _transaction(self) -> _Data:
        """The tables, to hold alone with ``with``: what a block changes is seen whole or not at all.

        Every method checks all it needs before it changes anything, so a
        block that raises has changed nothing (no rollback is needed).
        """
        return self._d

    def create_row(self, info: SessionInfo, counters: Counters) -> None:
        with self._transaction() as d:
            if info.session_id in d.infos:
                raise SessionExistsError(f"session {info.session_id!r} already exists")
            if info.parent_id is not None:
                parent = d.infos.get(info.parent_id)
                check_fork_point(
                    info, None if parent is None else (parent.version, int(parent.meta.get("pruned_to", 0)))
                )
            d.infos[info.session_id] = info
            d.events[info.session_id] = []
            d.snapshots[info.session_id] = {}
            d.counters[info.session_id] = counters

    def kept_counters(self, session_id: str) -> Counters | None:
        with self._transaction() as d:
            return d.counters_of(session_id)

    def row(self, session_id: str) -> SessionInfo | None:
        return self._d.infos.get(session_id)

    def note_meta_json(self, event: Event, meta_json: bytes) -> None:
        self._meta_json = (event, meta_json)  # for write_event, next

    def write_event(self, event: Event, expected_version: int, fence: int | None) -> None:
        # The meta's JSON the append made (noted just before), if it is this event's: checked by
        # identity, so that a race between threads costs an encoding, never a wrong meta.
        noted = self._meta_json
        self._meta_json = None
        kept = _keep(event, noted[1] if noted is not None and noted[0] is event else None)
        sid = event.session_id
        d = self._d
        with d.lock:
            _check_head(d, sid, expected_version, fence)
            d.events[sid].append(kept)
            d.heads[sid] = (event.version, event.timestamp)  # the row and the counters follow when read
            d.unfolded[sid] = d.unfolded.get(sid, 0) + 1

    def write_events(self, events: Sequence[Event], expected_version: int, fence: int | None) -> None:
        # Under the lock at once: all of them or none.
        self._meta_json = None
        kept = [_keep(event, None) for event in events]
        if not events:
            return
        sid = events[0].session_id
        d = self._d
        with d.lock:
            _check_head(d, sid, expected_version, fence)
            d.events[sid].extend(kept)
            d.heads[sid] = (events[-1].version, events[-1].timestamp)
            d.unfolded[sid] = d.unfolded.get(sid, 0) + len(kept)

    def awrite_events(
        self, events: Sequence[Event], expected_version: int, fence: int | None, on_written: Callable[[], object] | None
    ) -> Awaitable[None]:
        self.write_events(events, expected_version, fence)
        if on_written is not None:
            on_written()
        return _DONE

    def awrite_event(
        self, event: Event, expected_version: int, fence: int | None, on_written: Callable[[], object] | None
    ) -> Awaitable[None]:
        # Nothing to wait for: written (and reported) now, and an awaitable already done is
        # returned (no coroutine to make and run per commit).
        self.write_event(event, expected_version, fence)
        if on_written is not None:
            on_written()
        return _DONE

    def read_own(self, session_id: str, after: int, upto: int | None) -> Iterator[Event]:
        with self._transaction() as d:
            events = d.events.get(session_id) or []
            # Own versions are consecutive, so the range is a slice (no scan).
            first = events[0].version if events else 0
            start = max(0, after + 1 - first)
            stop = len(events) if upto is None else max(start, min(len(events), upto + 1 - first))
            chosen = events[start:stop]
        for kept in chosen:
            yield kept.event()

    def own_formats(self, session_id: str) -> tuple[dict[int, int], dict[int, int]]:
        # Nothing outlives the process: every record is in this code's format.
        with self._transaction() as d:
            events = [e.version for e in d.events.get(session_id) or []]
            snaps = list(d.snapshots.get(session_id) or {})
        return dict.fromkeys(events, FORMAT_VERSION), dict.fromkeys(snaps, FORMAT_VERSION)

    def rewrite_rows(
        self, session_id: str, events: list[Event], snapshots: Sequence[Snapshot], meta: dict[str, Any] | None
    ) -> None:
        with self._transaction() as d:
            d.counters_of(session_id)  # folded before its events are replaced
            if meta is not None:
                d.infos[session_id] = replace(d.infos[session_id], meta=copy_json(meta))
            for snapshot in snapshots:
                d.snapshots.setdefault(session_id, {})[snapshot.version] = replace(
                    snapshot, state=copy_json(snapshot.state)
                )
            log = d.events.get(session_id) or []
            first = log[0].version if log else 0
            for event in events:
                index = event.version - first
                if not 0 <= index < len(log) or log[index].version != event.version:
                    raise StoreError(f"session {session_id!r} has no own event at version {event.version} to rewrite")
            for event in events:
                log[event.version - first] = _keep(event)

    def own_snapshot(self, session_id: str, upto: int | None) -> Snapshot | None:
        with self._transaction() as d:
            snaps = d.snapshots.get(session_id, {})
            versions = [v for v in snaps if upto is None or v <= upto]
            if not versions:
                return None
            snap = snaps[max(versions)]
        return replace(snap, state=copy_json(snap.state))

    def save_snapshot(self, snapshot: Snapshot) -> None:
        copy = replace(snapshot, state=copy_json(snapshot.state))
        with self._transaction() as d:
            d.snapshots.setdefault(snapshot.session_id, {})[snapshot.version] = copy

    def prune_snapshots(self, session_id: str, keep: int) -> None:
        with self._transaction() as d:
            snaps = d.snapshots.get(session_id)
            if snaps:
                for version in sorted(snaps, reverse=True)[max(0, keep) :]:
                    del snaps[version]

    def sessions(self) -> list[SessionInfo]:
        with self._transaction() as d:
            infos = list(d.infos.values())
        return sorted(infos, key=lambda i: (-i.updated_at, i.session_id))

    def lease_of(self, session_id: str) -> Lease | None:
        with self._transaction() as d:
            return d.leases.get(session_id)

    def delete_rows(self, session_id: str) -> None:
        with self._transaction() as d:
            d.forget(session_id)
            for table in (d.infos, d.events, d.snapshots, d.leases, d.tokens, d.counters):
                table.pop(session_id, None)

    def acquire_lease(self, session_id: str, owner: str, ttl: float) -> Lease:
        now = time.time()
        with self._transaction() as d:
            if session_id not in d.infos:
                raise SessionNotFoundError(session_id)
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
        with self._transaction() as d:
            held = d.leases.get(lease.session_id)
            if held is not None and held.token == lease.token and held.owner == lease.owner:
                d.leases[lease.session_id] = replace(held, expires_at=0.0)

    def prune_rows(self, session_id: str, cut: int, base: Event, snapshot: Snapshot) -> bool:
        with self._transaction() as d:
            info = d.infos.get(session_id)
            if info is None:
                raise SessionNotFoundError(session_id)
            if info.meta.get("pruned_to", 0) >= cut:
                return True
            if any(i.parent_id == session_id for i in d.infos.values()):
                return False
            d.counters_of(session_id)  # the versions cut were counted: folded before they go
            kept = [e for e in d.events.get(session_id, []) if e.version > cut]
            d.events[session_id] = [_keep(base), *kept]
            snaps = d.snapshots.setdefault(session_id, {})
            for version in [v for v in snaps if v < cut]:
                del snaps[version]
            snaps[cut] = replace(snapshot, state=copy_json(snapshot.state))
            d.infos[session_id] = replace(
                info, parent_id=None, parent_version=None, meta={**info.meta, "pruned_to": cut}
            )
            return True

    def materialise_rows(
        self, info: SessionInfo, events: list[Event], snapshot: Snapshot | None, meta: dict[str, Any]
    ) -> bool:
        sid = info.session_id
        with self._transaction() as d:
            now = d.infos.get(sid)
            if now is None or (now.parent_id, now.parent_version) != (info.parent_id, info.parent_version):
                return False
            d.counters_of(sid)  # (what is unfolded is the newest events: folded before the log changes)
            copies = [_keep(e) for e in events]
            d.events[sid] = copies + d.events.get(sid, [])
            if snapshot is not None:
                d.snapshots.setdefault(sid, {}).setdefault(
                    snapshot.version, replace(snapshot, state=copy_json(snapshot.state))
                )
            d.infos[sid] = replace(now, parent_id=None, parent_version=None, meta={**now.meta, **meta})
            return True

    def import_rows(
        self, info: SessionInfo, events: list[Event], snapshots: list[Snapshot], counters: Counters
    ) -> None:
        sid = info.session_id
        with self._transaction() as d:
            if sid in d.infos:
                raise SessionExistsError(f"session {sid!r} already exists")
            d.infos[sid] = replace(info, meta=copy_json(info.meta))
            d.events[sid] = [_keep(e) for e in events]
            d.snapshots[sid] = {s.version: replace(s, state=copy_json(s.state)) for s in snapshots}
            d.counters[sid] = counters


def _check_head(d: _Data, sid: str, expected_version: int, fence: int | None) -> None:
    """Refuse an append to ``sid`` (under ``d.lock``) unless it exists, ``fence`` holds its lease, and its head
    is ``expected_version``."""
    info = d.rows.get(sid)
    if info is None:
        raise SessionNotFoundError(sid)
    if fence is not None:
        current = d.tokens.get(sid)
        if current != fence:
            lease = d.leases.get(sid)
            raise FencedError(sid, fence, current, lease.owner if lease else None)
    head = d.heads.get(sid)
    version = info.version if head is None else head[0]
    if version != expected_version:
        raise ConflictError(sid, expected_version, version)
