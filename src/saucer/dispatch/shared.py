"""Tool servers shared by many dispatchers: a pool starts each server once, not once per session.

::

    async with share_tool_servers():
        ...  # every LocalCommandDispatcher made in here, in this task or the tasks it starts,
             # uses one connection per (server name, configuration) instead of its own

A dispatcher made inside the scope borrows its connections from it: closing
the dispatcher leaves them open for the others, and the scope closes them
(stopping stdio servers) when it ends. What stays per dispatcher is what is
per session: the approver, ``assume_yes`` and the sensitivity rules. One
MCP session serves concurrent calls, so sessions run side by side on one
server; a crashed server is restarted once, for all of them.

Entering a scope inside another one reuses the outer scope. A dispatcher
made on another event loop than the scope's (a thread with its own loop)
gets connections of its own, since a connection belongs to its loop.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import asynccontextmanager
from typing import Any, Protocol

__all__ = ["SharedServers", "share_tool_servers", "current_shared_servers"]


class _Closable(Protocol):
    async def close(self) -> None: ...


_CURRENT: contextvars.ContextVar[SharedServers | None] = contextvars.ContextVar("saucer_shared_servers", default=None)


class SharedServers:
    """Open server connections by key, on one event loop, closed together by :meth:`aclose`."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._connections: dict[Hashable, Any] = {}
        self._closed = False

    def usable(self) -> bool:
        """Whether a dispatcher made now may borrow from this scope (open, and on the caller's loop)."""
        if self._closed:
            return False
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:  # made outside any loop: it will run wherever its owner runs it
            return False

    def connection(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """The shared connection for ``key``, made by ``make()`` the first time it is asked for."""
        if self._closed:
            raise RuntimeError("the shared tool servers are closed")
        conn = self._connections.get(key)
        if conn is None:
            conn = self._connections[key] = make()
        return conn

    def __len__(self) -> int:
        return len(self._connections)

    async def aclose(self) -> None:
        """Close every connection (stdio servers stop); the scope cannot be used afterwards."""
        self._closed = True
        connections: list[_Closable] = list(self._connections.values())
        self._connections.clear()
        await asyncio.gather(*(conn.close() for conn in connections), return_exceptions=True)


def current_shared_servers() -> SharedServers | None:
    """The scope a dispatcher made here would borrow from, or None."""
    shared = _CURRENT.get()
    return shared if shared is not None and shared.usable() else None


@asynccontextmanager
async def share_tool_servers() -> AsyncIterator[SharedServers]:
    """A scope in which local dispatchers share their tool servers (the current one, if already inside one)."""
    outer = current_shared_servers()
    if outer is not None:
        yield outer
        return
    shared = SharedServers()
    token = _CURRENT.set(shared)
    try:
        yield shared
    finally:
        _CURRENT.reset(token)
        await shared.aclose()
