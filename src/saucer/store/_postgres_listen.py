"""One LISTEN connection per process (per store and event loop), fanned out to every watcher.

Every live page of the viewer watches a session (:meth:`PostgresStore.watch`).
Giving each watcher a LISTEN connection of its own let a hundred open pages
exhaust a default PostgreSQL (100 connections) for everyone. A
:class:`Listener` holds ONE connection, LISTENs on the store's channel and
wakes the watchers of the session each notification names. It connects when
the first watcher subscribes and closes when the last one leaves; when the
connection is lost, every watcher is woken and told (:attr:`Subscription.lost`),
and goes on by polling, as a watcher that could not listen does.
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

__all__ = ["Listener", "Subscription", "watch_notified"]


@dataclass(eq=False)
class Subscription:
    """One watcher of one session: ``wake`` is set by a notification for it (or when the listener is lost)."""

    session_id: str
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    lost: str | None = None


class Listener:
    """The one LISTEN connection of a store on one event loop, shared by all its watchers."""

    def __init__(self, connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]], channel: str) -> None:
        self._connect = connect
        self._channel = channel
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
            sub = Subscription(session_id)
            self._subscribers.setdefault(session_id, set()).add(sub)
            return sub

    async def unsubscribe(self, sub: Subscription) -> None:
        """End ``sub``; the connection closes with the last subscription."""
        async with self._lock:
            subs = self._subscribers.get(sub.session_id)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subscribers[sub.session_id]
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
            for event in fresh:
                last = event.version
                yield event
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


def _read_after(store: Any, session_id: str, after: int) -> list[Any]:
    return list(store.read(session_id, after))
