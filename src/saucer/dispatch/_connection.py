"""One connection per tool server: started on first use, restarted on demand, closed by its owner.

A connection talks to its server one of two ways, chosen when it starts:

* a :class:`~saucer.tools.native.NativeServer` (the built-in ``shell`` and
  ``files``, in-process by default) is called directly: no MCP session, and
  the MCP SDK is not even imported;
* anything else (a stdio process, a streamable HTTP endpoint, an MCPServer
  in this process) gets a persistent MCP client session
  (:mod:`saucer.dispatch._mcp`).

Either way the dispatcher sees the same :class:`ToolInfo` listing and
:class:`CallOutcome` results, so what it records does not depend on the way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import sys
import threading
from typing import Any, Protocol

from saucer.dispatch._tooling import (
    CallOutcome,
    ServerStartError,
    ToolInfo,
    describe_exception,
    is_connection_lost,
    load_server_object,
)
from saucer.dispatch.servers import MCPServerConfig
from saucer.tools.native import NativeServer

__all__ = ["ServerConnection", "ServerStartError", "Backend"]


class Backend(Protocol):
    """How a connection reaches its server once started (native calls or an MCP session)."""

    @property
    def alive(self) -> bool: ...

    async def start(self) -> list[ToolInfo]: ...

    async def list_tools(self) -> list[ToolInfo]: ...

    async def call_tool(self, tool: str, arguments: dict[str, Any]) -> CallOutcome: ...

    async def close(self) -> None: ...


class _NativeBackend:
    """A NativeServer called directly: nothing to open, nothing that can be lost."""

    def __init__(self, server: NativeServer) -> None:
        self.server = server
        self._open = False

    @property
    def alive(self) -> bool:
        return self._open

    async def start(self) -> list[ToolInfo]:
        tools = await self.list_tools()
        self._open = True
        return tools

    async def list_tools(self) -> list[ToolInfo]:
        return [ToolInfo.from_listing(entry) for entry in self.server.list_tools()]

    async def call_tool(self, tool: str, arguments: dict[str, Any]) -> CallOutcome:
        outcome = await self.server.call_tool(tool, arguments)
        return CallOutcome(outcome.is_error, outcome.structured, outcome.payload, outcome.text)

    async def close(self) -> None:
        self._open = False


class ServerConnection:
    """The connection to one server: started on first use, restarted on demand."""

    def __init__(self, name: str, config: MCPServerConfig, instance: Any = None) -> None:
        self.name = name
        self.config = config
        #: A live server object to use instead of the configuration's (a NativeServer or an MCP server).
        self.instance = instance
        #: Counts successful starts; a caller that saw a crash restarts only the generation it saw.
        self.generation = 0
        #: The server's tools by name, as listed when it (re)started.
        self.tools: dict[str, ToolInfo] = {}
        self._backend: Backend | None = None
        self._lock = asyncio.Lock()

    @property
    def alive(self) -> bool:
        """Whether the server is started and its session (if it has one) still open."""
        return self._backend is not None and self._backend.alive

    async def _make_backend(self) -> Backend:
        # Modules imported for the first time are imported in a thread: seconds of imports on the event loop
        # (an in-process server's module, the MCP SDK) would hold every other session of a worker, and its heartbeats.
        config, target = self.config, self.instance
        if target is None and config.transport == "inprocess":
            assert config.import_path is not None
            await _imported(config.import_path.partition(":")[0])
            target = load_server_object(config.import_path, config.options)
        if isinstance(target, NativeServer):
            return _NativeBackend(target)
        await _imported("saucer.dispatch._mcp")
        from saucer.dispatch._mcp import MCPBackend  # the MCP SDK: only for servers that speak MCP

        return MCPBackend(self.name, config, target)

    async def ensure_started(self) -> None:
        """Start the server first when it is not running."""
        if self.alive:
            return
        async with self._lock:
            if not self.alive:
                await self._stop_backend()
                await self._start()

    async def restart(self, seen_generation: int) -> bool:
        """Restart the server unless someone already did since ``seen_generation``; True when this call did."""
        async with self._lock:
            if self.generation != seen_generation and self.alive:
                return False
            await self._stop_backend()
            await self._start()
            return True

    async def _start(self) -> None:
        limit = self.config.startup_timeout
        backend: Backend | None = None
        try:
            async with asyncio.timeout(limit):
                backend = await self._make_backend()
                tools = await backend.start()
        except BaseException as exc:
            if backend is not None:
                await backend.close()  # a session still connecting is cancelled, not waited for
            if isinstance(exc, TimeoutError):
                raise ServerStartError(f"server {self.name!r} did not start within {limit:g} s") from exc
            if isinstance(exc, ServerStartError):
                raise ServerStartError(f"server {self.name!r} could not start: {exc}") from exc
            if isinstance(exc, Exception):
                hint = ""
                if self.config.transport == "stdio" and is_connection_lost(exc):
                    hint = " (the process ended or closed stdout before answering; see its stderr)"
                raise ServerStartError(
                    f"server {self.name!r} could not start: {describe_exception(exc)}{hint}"
                ) from exc
            raise
        self._backend = backend
        self.tools = {tool.name: tool for tool in tools}
        self.generation += 1

    async def refresh_tools(self) -> dict[str, ToolInfo]:
        """List the tools again (the server may have changed them)."""
        await self.ensure_started()
        assert self._backend is not None
        self.tools = {tool.name: tool for tool in await self._backend.list_tools()}
        return self.tools

    async def call_tool(self, tool: str, arguments: dict[str, Any]) -> CallOutcome:
        """Call ``tool`` (starting the server if needed)."""
        await self.ensure_started()
        backend = self._backend
        assert backend is not None
        return await backend.call_tool(tool, arguments)

    async def _stop_backend(self) -> None:
        backend, self._backend = self._backend, None
        if backend is not None:
            await backend.close()

    async def close(self) -> None:
        """Close the session and stop the server (a stdio server's process group is ended by the SDK)."""
        async with self._lock:
            await self._stop_backend()


#: Modules being imported off the loop, and their outcome (shared by every session and loop of the process).
_importing: dict[str, concurrent.futures.Future[None]] = {}
_importing_lock = threading.Lock()


async def _imported(module: str) -> None:
    """Import ``module`` in a thread unless it is imported already; the sessions that need it meanwhile
    wait for that one import (a failure is left to the import that follows, which reports it)."""
    with _importing_lock:
        future = _importing.get(module)
        if future is None:
            if module in sys.modules:
                return
            future = _importing[module] = concurrent.futures.Future()
            threading.Thread(target=_import, args=(module, future), name=f"saucer-import-{module}", daemon=True).start()
    with contextlib.suppress(Exception):
        await asyncio.wrap_future(future)


def _import(module: str, future: concurrent.futures.Future[None]) -> None:
    try:
        importlib.import_module(module)
    except BaseException as exc:  # noqa: BLE001 - handed to the waiters
        future.set_exception(exc)
    else:
        future.set_result(None)
    finally:
        with _importing_lock:
            _importing.pop(module, None)
