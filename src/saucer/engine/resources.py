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

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from saucer.engine.dispatching import DispatcherHolder
from saucer.engine.lease import LeaseKeeper
from saucer.store import EventStore, open_store

if TYPE_CHECKING:
    from saucer.config import SettingsModel
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
        settings: SettingsModel,
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

    async def take_lease(self, owner: str, on_new_fence: Callable[[int], None], wait: float) -> Lease:
        """Take the session's lease for ``owner`` (waiting up to ``wait`` seconds for another holder's to expire)."""
        assert self.store is not None
        self.keeper = LeaseKeeper(self.store, self.session_id, owner, self._settings.store.lease_ttl, on_new_fence)
        return await self.keeper.acquire(wait)

    async def create_leased(
        self,
        owner: str,
        on_new_fence: Callable[[int], None],
        meta: dict[str, Any],
        participants: Sequence[str] | None,
    ) -> tuple[Lease, Context]:
        """Create the session with ``owner``'s lease on it, at once
        (:meth:`~saucer.store.EventStore.create_session_leased`), and open its Context: both in ONE
        thread, off the event loop; :class:`~saucer.store.SessionExistsError` if it exists."""
        store = self.store
        assert store is not None
        ttl = self._settings.store.lease_ttl
        self.keeper = keeper = LeaseKeeper(store, self.session_id, owner, ttl, on_new_fence)

        def create_and_open() -> tuple[Lease, Context]:
            _, lease = store.create_session_leased(
                self.session_id, owner=owner, ttl=ttl, meta=meta, participants=participants
            )
            return lease, self._open_context(lease.token, fresh=True)  # just made: nothing to read

        lease, context = await asyncio.to_thread(create_and_open)
        keeper.adopt(lease)
        return lease, context

    async def open_context(self, token: int) -> Context:
        """The session's Context for its runner (commits fenced by ``token``), opened in a thread (it reads the store)."""
        return await asyncio.to_thread(self._open_context, token)

    def _open_context(self, token: int, *, fresh: bool = False) -> Context:
        """The Context :meth:`open_context` opens; ``fresh``: this runner has just made the session, so it opens
        empty and reads nothing (see ``Context.open``)."""
        from saucer.context import Context

        store, store_settings = self.store, self._settings.store
        assert store is not None
        return Context.open(
            store,
            self.session_id,
            author="system",
            durability=store_settings.durability,
            snapshot_every=store_settings.snapshot_every,
            create=False,
            fence=token,
            serialise=True,  # out-of-turn writes never fail a step: it is ordered after them
            fresh=fresh,
        )

    def lease_checker(self) -> Callable[[], None]:
        """The keeper's check (:class:`~saucer.engine.errors.LeaseLostError` if this runner lost its lease;
        renewed when due), looked up once: a round calls it before every step."""
        return self.keeper.check if self.keeper is not None else _no_lease

    def add_closer(self, closer: Callable[[], Awaitable[Any]]) -> None:
        """Await ``closer()`` when the run closes."""
        self._closers.append(closer)

    def _close_store_side(self, context: Context | None, clean: bool) -> None:
        keeper = self.keeper
        if context is not None:
            try:
                if clean:  # the lease goes back with the last snapshot, when there is one: one round trip
                    if context.close(release=None if keeper is None else keeper.to_give_back()):
                        assert keeper is not None
                        keeper.given_back()
                else:
                    context.abort()  # discard the unfinished step
            except Exception as exc:  # noqa: BLE001
                _log.warning("session %s: closing the context failed: %s", self.session_id, exc)
        if keeper is not None:
            keeper.release()

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
        # The last snapshot and the lease's release wait on the store: in a thread, off the event loop.
        await _to_thread_to_its_end(self._close_store_side, context, clean)
        logs.close()
        if self._owns_store and self.store is not None:
            self.store.close()
            self.store = None  # the plan property opens the store's URL again if it still has to read


async def _to_thread_to_its_end(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a thread; a cancellation meanwhile reaches the caller once it has ended
    (a thread cannot be stopped: what closes after it must not run before it)."""
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return task.result()


def _no_lease() -> None:
    """The lease check before a lease is taken: nothing to check."""
