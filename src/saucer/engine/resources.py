"""What a run of a session holds open, and closes in order: its store, its lease, its dispatcher, close callbacks.

:class:`RunResources` is the session's collaborator for these. A store given
as a URL is opened by the run and closed with it (a store object belongs to
the caller); the lease (:mod:`saucer.engine.lease`) is taken once the session
exists and released last; the dispatcher (:mod:`saucer.engine.dispatching`)
is made on first use. :meth:`RunResources.close` never raises: each failure
is logged and the rest still closes.

Leases. A run takes the store's lease on the session (owner
``host:pid:uuid``, ``store.lease_ttl`` seconds), renews it from a background
task and at step boundaries, and fences every commit with the lease token, so
a second runner gets :class:`~saucer.store.LeaseHeldError` naming the holder,
and a runner whose lease was taken over cannot commit any more.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from saucer.engine.dispatching import DispatcherHolder
from saucer.engine.lease import LeaseKeeper
from saucer.store import EventStore, SessionNotFoundError, open_store

if TYPE_CHECKING:
    from saucer.config import Settings
    from saucer.context import Context
    from saucer.engine.logs import SessionLogs
    from saucer.store.base import Lease

__all__ = ["RunResources"]

_log = logging.getLogger("saucer.engine")


class RunResources:
    """A session run's store, lease, dispatcher and close callbacks (see the module docs)."""

    def __init__(
        self,
        session_id: str,
        settings: Settings,
        store: EventStore | str | None,
        dispatcher: Any,
        dispatcher_factory: Callable[[Any], Any] | None,
    ) -> None:
        self.session_id = session_id
        self._settings = settings
        #: The store as given (an object, or a URL the run opens).
        self.spec: EventStore | str = store if store is not None else settings.store.url
        #: The open store while the session runs (None before and after a run that opened it).
        self.store: EventStore | None = None
        self._owns_store = False
        #: This runner's lease keeper, once the lease is taken.
        self.keeper: LeaseKeeper | None = None
        self.dispatcher = DispatcherHolder(dispatcher, dispatcher_factory)
        self._closers: list[Callable[[], Awaitable[Any]]] = []

    @property
    def lease(self) -> Lease | None:
        """This runner's lease on the session while it runs."""
        return self.keeper.lease if self.keeper is not None else None

    def open_store(self) -> EventStore:
        """The store, opened from its URL (and then owned by the run) when it was given as one."""
        spec = self.spec
        if isinstance(spec, str):
            self._owns_store = True
            spec = open_store(spec, encrypt=self._settings.store.encrypt, key_file=self._settings.store.key_file)
        self.store = spec
        return spec

    async def take_lease(
        self,
        owner: str,
        on_new_fence: Callable[[int], None],
        wait: float,
        *,
        create: tuple[dict[str, Any], list[str] | None] | None = None,
    ) -> Lease:
        """Take the session's lease for ``owner`` (waiting up to ``wait`` seconds for another holder's to expire).

        First, in the same call in a thread (one hop, not two: :meth:`LeaseKeeper.acquire`), the session
        is created (``create``: its meta and participants), else found (:class:`SessionNotFoundError`).
        """
        store, sid = self.store, self.session_id
        assert store is not None

        def before() -> None:
            if create is not None:
                store.create_session(sid, meta=create[0], participants=create[1])
            elif not store.exists(sid):  # (never parses the stored meta, which may hold a whole plan)
                raise SessionNotFoundError(sid)

        self.keeper = LeaseKeeper(store, sid, owner, self._settings.store.lease_ttl, on_new_fence)
        return await self.keeper.acquire(wait, before)

    def check_lease(self) -> None:
        """:class:`~saucer.engine.errors.LeaseLostError` if this runner lost its lease; renew it when due."""
        if self.keeper is not None:
            self.keeper.check()

    def add_closer(self, closer: Callable[[], Awaitable[Any]]) -> None:
        """Await ``closer()`` when the run closes."""
        self._closers.append(closer)

    async def close(self, context: Context | None, logs: SessionLogs, *, clean: bool) -> None:
        """Close everything, in order: renewals, the dispatcher, the close callbacks, the Context
        (``clean``: closed; else its unfinished step is discarded), the lease, the logs, an owned store."""
        sid = self.session_id
        if self.keeper is not None:
            self.keeper.stop()
        await self.dispatcher.close(sid)
        for closer in self._closers:
            try:
                await closer()
            except Exception as exc:  # noqa: BLE001
                _log.warning("session %s: a close callback failed: %s", sid, exc)
        self._closers.clear()
        if context is not None:
            try:
                if clean:
                    context.close()
                else:
                    context.abort()  # discard the unfinished step
            except Exception as exc:  # noqa: BLE001
                _log.warning("session %s: closing the context failed: %s", sid, exc)
        if self.keeper is not None:
            self.keeper.release()
        logs.close()
        if self._owns_store and self.store is not None:
            self.store.close()
            self.store = None  # the plan property opens the store's URL again if it still has to read
