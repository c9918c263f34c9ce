"""One persistent MCP client session per server, owned by a dedicated task.

The SDK's ``Client`` is built on anyio task groups, which must be entered and
left by the same task. Commands arrive from many tasks (each batch, each
parallel read, each ``asyncio.timeout``), so every connection lives in an
*owner task* that enters the client, hands it out, and waits for the signal
to close. Other tasks only send requests through it, which the SDK allows.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
import os
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TextIO

import anyio
import httpx2
from mcp import Client, StdioServerParameters, stdio_client
from mcp.client._transport import TransportStreams
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, CallToolResult, Implementation, Tool

from saucer.dispatch.servers import MCPServerConfig

__all__ = ["ServerConnection", "ServerStartError", "is_connection_lost", "describe_exception"]

logger = logging.getLogger(__name__)

# Seconds a server gets to shut down cleanly before its owner task is cancelled.
_CLOSE_TIMEOUT = 10.0
_HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)
# Exceptions that mean the transport is gone (rather than that one call failed).
_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
    anyio.EndOfStream,
    ConnectionError,
    BrokenPipeError,
    httpx2.TransportError,
)


@functools.cache
def _client_info() -> Implementation:
    # Cached: reading the package metadata costs milliseconds, and every connection sends it.
    try:
        own = version("saucer")
    except PackageNotFoundError:
        own = "0"
    return Implementation(name="saucer", version=own)


class ServerStartError(RuntimeError):
    """A server could not be started or reached; the message names it and the cause."""


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` of the first leaf of ``exc`` (task groups wrap errors in groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return f"MCP error {exc.code}: {exc.message}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def is_connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` from a call means the connection to the server is gone."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return exc.code == CONNECTION_CLOSED
    return isinstance(exc, _TRANSPORT_ERRORS)


@asynccontextmanager
async def _http_transport(url: str, headers: dict[str, str]) -> AsyncIterator[TransportStreams]:
    """Streamable HTTP with our headers; the HTTP client lives exactly as long as the transport."""
    async with httpx2.AsyncClient(headers=headers, timeout=_HTTP_TIMEOUT) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


def _stderr_sink(config: MCPServerConfig, stack: AsyncExitStack) -> TextIO:
    """Where a stdio server's stderr goes; it must be a real file (the child inherits its descriptor)."""
    if config.stderr == "discard":
        return stack.enter_context(open(os.devnull, "w"))
    if isinstance(config.stderr, Path):
        config.stderr.parent.mkdir(parents=True, exist_ok=True)
        return stack.enter_context(open(config.stderr, "a", encoding="utf-8"))
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (AttributeError, OSError, ValueError):
            continue
    return stack.enter_context(open(os.devnull, "w"))


def load_server_object(import_path: str, options: Mapping[str, Any] | None = None) -> MCPServer | Server[Any]:
    """The MCPServer (or low-level Server) named by ``'package.module:attribute'``.

    When the attribute is a function instead, the server is what it returns,
    called with ``options`` as keyword arguments (a fresh server each time).
    """
    module_name, _, attribute = import_path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is reported the same way
        raise ServerStartError(f"cannot import module {module_name!r} of import_path {import_path!r}: "
                               f"{describe_exception(exc)}") from exc
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            message = f"import_path {import_path!r}: module {module_name!r} has no attribute {attribute!r}"
            raise ServerStartError(message) from exc
    if isinstance(obj, MCPServer | Server):
        if options:
            raise ServerStartError(f"import_path {import_path!r} names a server object, which takes no options")
        return obj
    if callable(obj) and not isinstance(obj, type):
        try:
            obj = obj(**(options or {}))
        except Exception as exc:  # noqa: BLE001 - a factory's failure is a start failure naming it
            raise ServerStartError(f"{import_path}(**options) failed: {describe_exception(exc)}") from exc
        if isinstance(obj, MCPServer | Server):
            return obj
        raise ServerStartError(f"{import_path}() returned a {type(obj).__name__}, not an MCPServer or Server")
    kind = type(obj).__name__
    raise ServerStartError(f"import_path {import_path!r} names a {kind}, not an MCPServer, a Server or a function")


class ServerConnection:
    """The persistent MCP session with one server: started on first use, restarted on demand."""

    def __init__(self, name: str, config: MCPServerConfig, instance: MCPServer | Server[Any] | None = None) -> None:
        self.name = name
        self.config = config
        self.instance = instance
        #: Counts successful starts; a caller that saw a crash restarts only the generation it saw.
        self.generation = 0
        #: The server's tools by name, as listed when it (re)started.
        self.tools: dict[str, Tool] = {}
        self._client: Client | None = None
        self._owner: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock = asyncio.Lock()

    @property
    def alive(self) -> bool:
        """Whether a session is open and its owner task still running."""
        return self._client is not None and self._owner is not None and not self._owner.done()

    def _target(self, stack: AsyncExitStack) -> Any:
        config = self.config
        if config.transport == "stdio":
            assert config.command is not None
            params = StdioServerParameters(
                command=config.command,
                args=list(config.args),
                env=dict(config.env) or None,
                cwd=config.cwd,
            )
            return stdio_client(params, errlog=_stderr_sink(config, stack))
        if config.transport == "http":
            assert config.url is not None
            return _http_transport(config.url, dict(config.headers))
        if self.instance is not None:
            return self.instance
        assert config.import_path is not None
        return load_server_object(config.import_path, config.options)

    async def _own(self, ready: asyncio.Future[Client], stop: asyncio.Event) -> None:
        """Owner task: open the session, publish it, keep it open until ``stop`` is set."""
        try:
            async with AsyncExitStack() as stack:
                target = self._target(stack)
                client = Client(target, cache=None, client_info=_client_info())
                await stack.enter_async_context(client)
                ready.set_result(client)
                await stop.wait()
        except Exception as exc:  # noqa: BLE001 - the owner reports failures, it must not crash the loop
            if not ready.done():
                ready.set_exception(exc)
            elif not stop.is_set():
                logger.warning("MCP server %r: connection ended: %s", self.name, describe_exception(exc))
        except BaseException:  # cancellation, KeyboardInterrupt: nobody gets a session, the signal goes on
            if not ready.done():
                ready.cancel()
            raise

    async def ensure_started(self) -> Client:
        """The open session, starting the server first when it is not running."""
        client = self._client
        if client is not None and self.alive:
            return client
        async with self._lock:
            if not self.alive:
                await self._stop_owner()
                await self._start()
            assert self._client is not None
            return self._client

    async def restart(self, seen_generation: int) -> bool:
        """Restart the server unless someone already did since ``seen_generation``; True when this call did."""
        async with self._lock:
            if self.generation != seen_generation and self.alive:
                return False
            await self._stop_owner()
            await self._start()
            return True

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[Client] = loop.create_future()
        # Retrieve the outcome even when no one is left waiting, so asyncio never
        # warns about an exception that was never retrieved.
        ready.add_done_callback(lambda f: None if f.cancelled() else f.exception())
        stop = asyncio.Event()
        owner = asyncio.create_task(self._own(ready, stop), name=f"saucer-mcp-{self.name}")
        limit = self.config.startup_timeout
        try:
            async with asyncio.timeout(limit):
                client = await asyncio.shield(ready)
                tools = await self._list_tools(client)
        except BaseException as exc:
            stop.set()
            if not ready.done():
                owner.cancel()  # still connecting: do not wait for a handshake that may never come
            await self._finish(owner)
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
        self._client, self._owner, self._stop = client, owner, stop
        self.tools = {tool.name: tool for tool in tools}
        self.generation += 1

    @staticmethod
    async def _list_tools(client: Client) -> list[Tool]:
        tools: list[Tool] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def refresh_tools(self) -> dict[str, Tool]:
        """List the tools again (the server may have changed them)."""
        client = await self.ensure_started()
        self.tools = {tool.name: tool for tool in await self._list_tools(client)}
        return self.tools

    async def call_tool(self, tool: str, arguments: dict[str, Any]) -> CallToolResult:
        """Call ``tool`` on the open session (starting the server if needed)."""
        client = await self.ensure_started()
        return await client.call_tool(tool, arguments)

    @staticmethod
    async def _finish(owner: asyncio.Task[None]) -> None:
        """Wait for an owner task to end (it closes the session), cancelling it if it hangs.

        ``asyncio.wait`` neither raises the task's exception nor cancels the
        task when the caller is cancelled, so a caller's cancellation still
        propagates and the session is still closed by its owner.
        """
        done, _ = await asyncio.wait({owner}, timeout=_CLOSE_TIMEOUT)
        if not done:
            owner.cancel()
            await asyncio.wait({owner}, timeout=_CLOSE_TIMEOUT)
        if owner.done() and not owner.cancelled():
            owner.exception()  # mark any exception as retrieved; _own already logged it

    async def _stop_owner(self) -> None:
        owner, stop = self._owner, self._stop
        self._client = self._owner = self._stop = None
        if owner is None:
            return
        if stop is not None:
            stop.set()
        await self._finish(owner)

    async def close(self) -> None:
        """Close the session and stop the server (a stdio server's process group is ended by the SDK)."""
        async with self._lock:
            await self._stop_owner()
