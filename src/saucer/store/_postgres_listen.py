"""One LISTEN connection per process (per store and event loop), fanned out to every watcher.

Every live page of the viewer watches a session (:meth:`PostgresStore.watch`).
Giving each watcher a LISTEN connection of its own let a hundred open pages
exhaust a default PostgreSQL (100 connections) for everyone. A
:class:`Listener` holds ONE connection, LISTENs on the store's channel and
wakes the watchers of the session each notification names. It connects when
the first watcher subscribes and closes when the last one leaves; when the
connection is lost, every watcher is woken and told (:attr:`Subscription.lost`),
and goes on by polling, as a watcher that could not listen does.

Commits notify only the sessions someone watches: the listener registers its
connection's backend pid in the row of each session it watches (``register``,
after its ``LISTEN`` took effect and before the watcher's first read), and the
append statement notifies only where that row's ``watchers`` is not empty. A
commit cannot slip between: it updates the same row, so either it updated it
first (the registration waits for its COMMIT, and the watcher's first read sees
its events) or after (PostgreSQL re-reads a row updated meanwhile, so it sees
the pid and notifies). A session created between a watcher's registration
(which found no row) and its first read is registered again after that read,
before the watcher waits (:meth:`Listener.confirm`). The pid of a listener that died without unregistering
only costs wasted notifications until a registration for that session drops
the pids no backend has any more.
"""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.sql import SQL, Identifier

from saucer.store._postgres_conn import display_url

__all__ = ["Listener", "Subscription", "registrar", "watch_notified"]


@dataclass(eq=False)
class Subscription:
    """One watcher of one session: ``wake`` is set by a notification for it (or when the listener is lost)."""

    session_id: str
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    lost: str | None = None


class Listener:
    """The one LISTEN connection of a store on one event loop, shared by all its watchers."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
        channel: str,
        register: Callable[[int, str, bool], Awaitable[bool]],
    ) -> None:
        self._connect = connect
        self._channel = channel
        self._register = register  # (pid, session_id, watched): add or remove pid from the session's watchers
        self._unregistered: set[str] = set()  # watched sessions whose registration found no row
        self._subscribers: dict[str, set[Subscription]] = {}
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    @property
    def watchers(self) -> int:
        """How many subscriptions are open."""
        return sum(map(len, self._subscribers.values()))

    async def subscribe(self, session_id: str) -> Subscription:
        """A subscription to ``session_id``'s notifications; psycopg.Error when the store cannot LISTEN."""
        async with self._lock:
            if self._conn is None:
                conn = await self._connect()
                try:
                    await conn.execute(SQL("LISTEN {}").format(Identifier(self._channel)))
                except BaseException:
                    await conn.close()
                    raise
                self._conn = conn
                self._reader = asyncio.get_running_loop().create_task(self._read(conn), name=f"listen {self._channel}")
            conn = self._conn
            if session_id not in self._subscribers:
                try:  # after LISTEN (autocommit: in effect), before the watcher's first read
                    if not await self._register(conn.info.backend_pid, session_id, True):
                        self._unregistered.add(session_id)
                except BaseException:
                    if not self._subscribers:
                        await self._close()
                    raise
            sub = Subscription(session_id)
            self._subscribers.setdefault(session_id, set()).add(sub)
            return sub

    async def confirm(self, session_id: str) -> bool:
        """Register ``session_id`` again if its registration found no row (the session did not exist
        then; a read has just found it): True when it did so, and the watcher must read again before
        it waits, as after a first registration."""
        if session_id not in self._unregistered:
            return False
        async with self._lock:
            if session_id not in self._unregistered or self._conn is None:
                return False
            self._unregistered.discard(session_id)
            await self._register(self._conn.info.backend_pid, session_id, True)
            return True

    async def unsubscribe(self, sub: Subscription) -> None:
        """End ``sub``; the connection closes with the last subscription."""
        async with self._lock:
            subs = self._subscribers.get(sub.session_id)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subscribers[sub.session_id]
                    self._unregistered.discard(sub.session_id)
                    if self._conn is not None:  # else its pid is gone (a registration drops it)
                        with contextlib.suppress(Exception):  # a pid left behind only wastes notifications
                            await self._register(self._conn.info.backend_pid, sub.session_id, False)
            if not self._subscribers:
                await self._close()

    async def _close(self) -> None:
        conn, reader = self._conn, self._reader
        self._conn = self._reader = None
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def _read(self, conn: psycopg.AsyncConnection[Any]) -> None:
        try:
            async for note in conn.notifies():
                _, _, sid = note.payload.partition(" ")
                for sub in self._subscribers.get(sid, ()):
                    sub.wake.set()
        except psycopg.Error as exc:
            problem = " ".join(str(exc).split()) or type(exc).__name__
            async with self._lock:
                if self._conn is conn:  # every watcher goes on by polling; the next subscriber reconnects
                    for subs in self._subscribers.values():
                        for sub in subs:
                            sub.lost = problem
                            sub.wake.set()
                    self._subscribers.clear()
                    self._conn = self._reader = None
                    with contextlib.suppress(Exception):
                        await conn.close()


async def watch_notified(
    store: Any,
    listener: Listener,
    session_id: str,
    after: int,
    interval: float,
    polling: Callable[..., AsyncIterator[Any]],
) -> AsyncIterator[Any]:
    """The body of ``PostgresStore.watch``: the session's new events, read when ``listener`` says it
    changed (and every few seconds as a safety net); by ``polling(after)`` every ``interval``
    seconds when it cannot listen, or from the moment the listening connection is lost."""
    where = f"store {display_url(store.url)}"
    try:
        sub = await listener.subscribe(session_id)
    except psycopg.Error as exc:
        warnings.warn(
            f"{where}: cannot LISTEN ({' '.join(str(exc).split())}); watching {session_id!r} by polling",
            RuntimeWarning,
            stacklevel=3,
        )
        async for event in polling(after=after):
            yield event
        return
    last = after
    try:
        while sub.lost is None:
            sub.wake.clear()  # before the read: a commit after it wakes the wait below
            fresh = await asyncio.to_thread(_read_after, store, session_id, last)
            registered_now = await listener.confirm(session_id)
            for event in fresh:
                last = event.version
                yield event
            if registered_now:
                continue  # read what was committed before the registration, then wait
            if not fresh:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(sub.wake.wait(), max(interval, 5.0))
    finally:
        await listener.unsubscribe(sub)
    warnings.warn(
        f"{where}: lost the LISTEN connection ({sub.lost}); watching {session_id!r} by polling",
        RuntimeWarning,
        stacklevel=3,
    )
    async for event in polling(after=last):
        yield event


def registrar(conn: Callable[[], Any], statements: Any) -> Callable[[int, str, bool], Awaitable[bool]]:
    """A :class:`Listener`'s ``register``: ``statements.set_watcher`` on a pooled connection ``conn()``, off the loop."""

    def set_watcher(pid: int, session_id: str, watched: bool) -> bool:
        with conn() as c:
            return bool(statements.set_watcher(c, pid, session_id, watched))

    async def register(pid: int, session_id: str, watched: bool) -> bool:
        return await asyncio.to_thread(set_watcher, pid, session_id, watched)

    return register


def _read_after(store: Any, session_id: str, after: int) -> list[Any]:
    return list(store.read(session_id, after))
