"""A store that seals chosen values before they reach its backend (see :mod:`saucer.store.crypto`).

:class:`SealedStore` wraps any :class:`~saucer.store.EventStore`: every event
and snapshot it hands down has the values ``store.encrypt`` covers sealed, and
every one it reads back has them opened with the key (without the key they
stay sealed and read as ``<encrypted>``). The backend never sees a covered
value in plain text, and never sees the key. When the patterns cover
``REQUEST``, the meta of sessions and events is sealed too, all but the keys
listings and summaries need (:data:`~saucer.store.crypto.PLAIN_SESSION_META`,
:data:`~saucer.store.crypto.PLAIN_EVENT_META`); without the key, no session
is created (nothing is written). Everything else -- sessions,
versions, leases, forks, prunes -- is the backend's, unchanged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, overload

from saucer.store.base import EventStore
from saucer.store.crypto import KEY_ENV, PLAIN_EVENT_META, PLAIN_SESSION_META, Sealer
from saucer.store.model import Event, Lease, OutcomeUnknownError, SessionInfo, Snapshot, StoreKeyError
from saucer.store.summary import Counters, ListQuery, SessionSummary

__all__ = ["SealedStore"]


class SealedStore(EventStore):
    """``inner`` with the values ``sealer`` covers sealed at rest."""

    def __init__(self, inner: EventStore, sealer: Sealer) -> None:
        self.inner = inner
        self.sealer = sealer
        self.url = inner.url
        self.features = inner.features

    def __getattr__(self, name: str) -> Any:
        # Backend specifics (``path``, ``schema``, ``schema_version()``...) are the inner store's.
        if name.startswith("__") or name in ("inner", "sealer"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    # ------------------------------------------------------------- sealing

    def _seal(self, event: Event) -> Event:
        ops = self.sealer.seal_ops(event.session_id, event.ops)
        meta = self.sealer.seal_meta(event.session_id, f"meta@{event.version}", event.meta, PLAIN_EVENT_META)
        return event if ops is event.ops and meta is event.meta else replace(event, ops=ops, meta=meta)

    def _open(self, event: Event) -> Event:
        ops = self.sealer.open_ops(event.session_id, event.ops)
        meta = self.sealer.open_meta(event.session_id, f"meta@{event.version}", event.meta)
        return event if ops is event.ops and meta is event.meta else replace(event, ops=ops, meta=meta)

    def _seal_info(self, info: SessionInfo) -> SessionInfo:
        if self.sealer.patterns and self.sealer.ring is None:
            # Before anything is written: a session made without the key would hold what it must not.
            raise StoreKeyError(
                f"session {info.session_id!r}: store.encrypt is set ({', '.join(self.sealer.patterns)}), but no store "
                f"key is given; set {KEY_ENV} or store.key_file (nothing was written)"
            )
        meta = self.sealer.seal_meta(info.session_id, "meta", info.meta, PLAIN_SESSION_META)
        return info if meta is info.meta else replace(info, meta=meta)

    @overload
    def _open_info(self, info: SessionInfo) -> SessionInfo: ...
    @overload
    def _open_info(self, info: None) -> None: ...
    def _open_info(self, info: SessionInfo | None) -> SessionInfo | None:
        if info is None:
            return None
        meta = self.sealer.open_meta(info.session_id, "meta", info.meta)
        return info if meta is info.meta else replace(info, meta=meta)

    def _seal_snapshot(self, snapshot: Snapshot) -> Snapshot:
        return replace(snapshot, state=self.sealer.seal_state(snapshot.session_id, snapshot.state))

    def _open_snapshot(self, snapshot: Snapshot | None) -> Snapshot | None:
        if snapshot is None:
            return None
        return replace(snapshot, state=self.sealer.open_state(snapshot.session_id, snapshot.state))

    # ------------------------------------------------------------ recorder

    def create_row(self, info: SessionInfo, counters: Counters) -> None:
        # The summaries are the backend's: each event's SummaryDelta is plain (it is not meta).
        self.inner.create_row(self._seal_info(info), counters)

    def row(self, session_id: str) -> SessionInfo | None:
        return self._open_info(self.inner.row(session_id))

    def log_row(self, session_id: str) -> SessionInfo | None:
        return self._open_info(self.inner.log_row(session_id))

    def row_without_plan(self, session_id: str) -> tuple[SessionInfo, bool] | None:
        found = self.inner.row_without_plan(session_id)
        return None if found is None else (self._open_info(found[0]), found[1])

    def kept_counters(self, session_id: str) -> Counters | None:
        return self.inner.kept_counters(session_id)

    def list_rows(self, query: ListQuery) -> list[SessionSummary] | None:
        rows = self.inner.list_rows(query)
        if rows is None or not self.sealer.seals_meta:
            return rows
        return [row._replace(request=self.sealer.open_brief(row.session_id, row.request)) for row in rows]

    def write_event(self, event: Event, expected_version: int, fence: int | None) -> None:
        try:
            self.inner.write_event(self._seal(event), expected_version, fence)
        except OutcomeUnknownError as exc:
            exc.event = event  # the caller compares it with what it reads back: the opened event
            raise

    async def awrite_event(
        self, event: Event, expected_version: int, fence: int | None, on_written: Callable[[], object] | None
    ) -> None:
        try:
            await self.inner.awrite_event(self._seal(event), expected_version, fence, on_written)
        except OutcomeUnknownError as exc:
            exc.event = event
            raise

    def write_events(self, events: Sequence[Event], expected_version: int, fence: int | None) -> None:
        try:
            self.inner.write_events([self._seal(e) for e in events], expected_version, fence)
        except OutcomeUnknownError as exc:
            exc.event = _opened(exc, events)
            raise

    async def awrite_events(
        self, events: Sequence[Event], expected_version: int, fence: int | None, on_written: Callable[[], object] | None
    ) -> None:
        try:
            await self.inner.awrite_events([self._seal(e) for e in events], expected_version, fence, on_written)
        except OutcomeUnknownError as exc:
            exc.event = _opened(exc, events)
            raise

    def read_own(self, session_id: str, after: int, upto: int | None) -> Iterator[Event]:
        for event in self.inner.read_own(session_id, after, upto):
            yield self._open(event)

    def own_snapshot(self, session_id: str, upto: int | None) -> Snapshot | None:
        return self._open_snapshot(self.inner.own_snapshot(session_id, upto))

    def save_snapshot(self, snapshot: Snapshot) -> None:
        self.inner.save_snapshot(self._seal_snapshot(snapshot))

    def sessions(self) -> list[SessionInfo]:
        return [self._open_info(info) for info in self.inner.sessions()]

    def find(self, prefix: str, limit: int | None) -> list[SessionInfo]:
        return [self._open_info(info) for info in self.inner.find(prefix, limit)]

    def find_ids(self, prefix: str, limit: int | None) -> list[str]:
        return self.inner.find_ids(prefix, limit)

    def lease_of(self, session_id: str) -> Lease | None:
        return self.inner.lease_of(session_id)

    def delete_rows(self, session_id: str) -> None:
        self.inner.delete_rows(session_id)

    def acquire_lease(self, session_id: str, owner: str, ttl: float) -> Lease:
        return self.inner.acquire_lease(session_id, owner, ttl)

    def release_lease(self, lease: Lease) -> None:
        self.inner.release_lease(lease)

    def prune_snapshots(self, session_id: str, keep: int) -> None:
        self.inner.prune_snapshots(session_id, keep)

    def save_snapshot_pruned(self, snapshot: Snapshot, keep: int) -> None:
        self.inner.save_snapshot_pruned(self._seal_snapshot(snapshot), keep)

    def save_snapshot_released(self, snapshot: Snapshot, keep: int, lease: Lease) -> None:
        self.inner.save_snapshot_released(self._seal_snapshot(snapshot), keep, lease)

    def create_row_leased(self, info: SessionInfo, counters: Counters, owner: str, ttl: float) -> Lease:
        return self.inner.create_row_leased(self._seal_info(info), counters, owner, ttl)

    def quarantine_record(self, session_id: str, version: int) -> bool:
        return self.inner.quarantine_record(session_id, version)

    def migrate(self) -> int | None:
        return self.inner.migrate()

    def format_version(self) -> int:
        return self.inner.format_version()

    def close(self) -> None:
        self.inner.close()

    def forks_of(self, session_id: str) -> list[SessionInfo]:
        return [self._open_info(info) for info in self.inner.forks_of(session_id)]

    def prune_rows(self, session_id: str, cut: int, base: Event, snapshot: Snapshot) -> bool:
        return self.inner.prune_rows(session_id, cut, self._seal(base), self._seal_snapshot(snapshot))

    def materialise_rows(
        self, info: SessionInfo, events: list[Event], snapshot: Snapshot | None, meta: dict[str, Any]
    ) -> bool:
        sealed = None if snapshot is None else self._seal_snapshot(snapshot)
        return self.inner.materialise_rows(info, [self._seal(e) for e in events], sealed, meta)

    def import_rows(
        self, info: SessionInfo, events: list[Event], snapshots: list[Snapshot], counters: Counters
    ) -> None:
        self.inner.import_rows(
            self._seal_info(info),
            [self._seal(e) for e in events],
            [self._seal_snapshot(s) for s in snapshots],
            counters,
        )

    async def watch(self, session_id: str, after: int = 0, *, interval: float = 0.2) -> AsyncIterator[Event]:
        async for event in self.inner.watch(session_id, after, interval=interval):
            yield self._open(event)

    def own_formats(self, session_id: str) -> tuple[dict[int, int], dict[int, int]]:
        return self.inner.own_formats(session_id)

    def rewrite_rows(
        self, session_id: str, events: list[Event], snapshots: Sequence[Snapshot], meta: dict[str, Any] | None
    ) -> None:
        self.inner.rewrite_rows(
            session_id,
            [self._seal(e) for e in events],
            [self._seal_snapshot(s) for s in snapshots],
            None if meta is None else self._seal_info(SessionInfo(session_id, 0, 0, 0, None, None, meta)).meta,
        )


def _opened(exc: OutcomeUnknownError, events: Sequence[Event]) -> Event | None:
    """The caller's own (opened) event of the sealed one an unknown outcome names."""
    version = None if exc.event is None else exc.event.version
    return next((e for e in events if e.version == version), events[-1] if events else None)
