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

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from typing import Any

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
        self.features = inner.features  # type: ignore[misc]

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

    def _open_info(self, info: SessionInfo | None) -> Any:
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

    # ---------------------------------------------------------- primitives

    def _create(self, info: SessionInfo) -> None:
        self.inner._create(self._seal_info(info))

    def _info(self, session_id: str) -> SessionInfo | None:
        return self._open_info(self.inner._info(session_id))

    def _row(self, session_id: str) -> SessionInfo | None:
        return self._open_info(self.inner._row(session_id))

    def _info_without_plan(self, session_id: str) -> tuple[SessionInfo, bool] | None:
        found = self.inner._info_without_plan(session_id)
        return None if found is None else (self._open_info(found[0]), found[1])

    # The summaries are the backend's: they are counted from the plain part of event meta (PLAIN_EVENT_META).
    def _create_with(self, info: SessionInfo, counters: Counters) -> None:
        self.inner._create_with(self._seal_info(info), counters)

    def _stored_counters(self, session_id: str) -> Counters | None:
        return self.inner._stored_counters(session_id)

    def _list(self, query: ListQuery) -> list[SessionSummary]:
        rows = self.inner._list(query)
        if not self.sealer.seals_meta:
            return rows
        return [row._replace(request=self.sealer.open_brief(row.session_id, row.request)) for row in rows]

    def _append(self, event: Event, expected_version: int, fence: int | None) -> None:
        try:
            self.inner._append(self._seal(event), expected_version, fence)
        except OutcomeUnknownError as exc:
            exc.event = event  # the caller compares it with what it reads back: the opened event
            raise

    async def _aappend(
        self, event: Event, expected_version: int, fence: int | None, on_written: Callable[[], Any] | None
    ) -> None:
        try:
            await self.inner._aappend(self._seal(event), expected_version, fence, on_written)
        except OutcomeUnknownError as exc:
            exc.event = event
            raise

    def _read(self, session_id: str, after: int, upto: int | None) -> Iterator[Event]:
        for event in self.inner._read(session_id, after, upto):
            yield self._open(event)

    def _snapshot(self, session_id: str, upto: int | None) -> Snapshot | None:
        return self._open_snapshot(self.inner._snapshot(session_id, upto))

    def save_snapshot(self, snapshot: Snapshot) -> None:
        self.inner.save_snapshot(self._seal_snapshot(snapshot))

    def sessions(self) -> list[SessionInfo]:
        return [self._open_info(info) for info in self.inner.sessions()]

    def find_sessions(self, prefix: str = "", limit: int | None = None) -> list[SessionInfo]:
        return [self._open_info(info) for info in self.inner.find_sessions(prefix, limit)]

    def find_session_ids(self, prefix: str = "", limit: int | None = None) -> list[str]:
        return self.inner.find_session_ids(prefix, limit)

    def lease_of(self, session_id: str) -> Lease | None:
        return self.inner.lease_of(session_id)

    def _delete(self, session_id: str) -> None:
        self.inner._delete(session_id)

    def acquire_lease(self, session_id: str, owner: str, ttl: float) -> Lease:
        return self.inner.acquire_lease(session_id, owner, ttl)

    def release_lease(self, lease: Lease) -> None:
        self.inner.release_lease(lease)

    def prune_snapshots(self, session_id: str, keep: int) -> None:
        self.inner.prune_snapshots(session_id, keep)

    def quarantine_record(self, session_id: str, version: int) -> bool:
        return self.inner.quarantine_record(session_id, version)

    def migrate(self) -> int | None:
        return self.inner.migrate()

    def format_version(self) -> int:
        return self.inner.format_version()

    def close(self) -> None:
        self.inner.close()

    def _forks(self, session_id: str) -> list[SessionInfo]:
        return [self._open_info(info) for info in self.inner._forks(session_id)]

    def _prune(self, session_id: str, cut: int, base: Event, snapshot: Snapshot) -> bool:
        return self.inner._prune(session_id, cut, self._seal(base), self._seal_snapshot(snapshot))

    def _materialise(
        self, info: SessionInfo, events: list[Event], snapshot: Snapshot | None, meta: dict[str, Any]
    ) -> bool:
        sealed = None if snapshot is None else self._seal_snapshot(snapshot)
        return self.inner._materialise(info, [self._seal(e) for e in events], sealed, meta)

    def _import(self, info: SessionInfo, events: list[Event], snapshots: list[Snapshot]) -> None:
        self.inner._import(
            self._seal_info(info), [self._seal(e) for e in events], [self._seal_snapshot(s) for s in snapshots]
        )

    async def watch(self, session_id: str, after: int = 0, *, interval: float = 0.2) -> AsyncIterator[Event]:
        async for event in self.inner.watch(session_id, after, interval=interval):
            yield self._open(event)

    def _formats(self, session_id: str) -> tuple[dict[int, int], dict[int, int]]:
        return self.inner._formats(session_id)

    def _rewrite(
        self, session_id: str, events: list[Event], snapshots: Any = (), meta: dict[str, Any] | None = None
    ) -> None:
        self.inner._rewrite(
            session_id,
            [self._seal(e) for e in events],
            [self._seal_snapshot(s) for s in snapshots],
            None if meta is None else self._seal_info(SessionInfo(session_id, 0, 0, 0, None, None, meta)).meta,
        )
