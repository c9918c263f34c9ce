"""The MCP side of a connection: one persistent MCP client session per server, owned by a dedicated task.

Used for every server that is not a :class:`~saucer.tools.native.NativeServer`:
stdio processes, streamable HTTP endpoints and MCP servers in this process.
Importing this module imports the MCP SDK.

The SDK's ``Client`` is built on anyio task groups, which must be entered and
left by the same task. Commands arrive from many tasks (each batch, each
parallel read, each ``asyncio.timeout``), so every session lives in an
*owner task* that enters the client, hands it out, and waits for the signal
to close. Other tasks only send requests through it, which the SDK allows.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TextIO

import httpx2
from mcp import Client, StdioServerParameters, stdio_client
from mcp.client._transport import TransportStreams
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, Implementation, TextContent, Tool

from saucer.dispatch._tooling import CallOutcome, ToolInfo, describe_exception, load_server_object
from saucer.dispatch.servers import MCPServerConfig

__all__ = ["MCPBackend"]

logger = logging.getLogger(__name__)

# Seconds a server gets to shut down cleanly before its owner task is cancelled.
_CLOSE_TIMEOUT = 10.0
_HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)


@functools.cache
def _client_info() -> Implementation:
    # Cached: reading the package metadata costs milliseconds, and every connection sends it.
    try:
        own = version("saucer")
    except PackageNotFoundError:
        own = "0"
    return Implementation(name="saucer", version=own)


@asynccontextmanager
async def _http_transport(url: str, headers: dict[str, str]) -> AsyncIterator[TransportStreams]:
    """Streamable HTTP with our headers; the HTTP client lives exactly as long as the transport."""
    async with (
        httpx2.AsyncClient(headers=headers, timeout=_HTTP_TIMEOUT) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
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


def _tool_info(tool: Tool) -> ToolInfo:
    return ToolInfo.from_listing(tool.model_dump(mode="json", by_alias=True, exclude_none=True))


def _payload(result: CallToolResult) -> Any:
    """The JSON value a successful call produced: structured content, else its text, else its content blocks."""
    if result.structured_content is not None:
        return result.structured_content
    blocks = result.content
    if blocks and all(isinstance(block, TextContent) for block in blocks):
        texts = [block.text for block in blocks if isinstance(block, TextContent)]
        return texts[0] if len(texts) == 1 else texts
    return [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in blocks]


def _error_text(result: CallToolResult) -> str:
    texts = [block.text for block in result.content if isinstance(block, TextContent)]
    if texts:
        return "\n".join(texts)
    if result.structured_content is not None:
        return json.dumps(result.structured_content, default=str)
    return "the tool reported an error without a message"


def _outcome(result: CallToolResult) -> CallOutcome:
    if result.is_error:
        return CallOutcome(True, result.structured_content, None, _error_text(result))
    return CallOutcome(False, result.structured_content, _payload(result), "")


class MCPBackend:
    """The MCP client session with one server, kept open by its owner task until :meth:`close`."""

    def __init__(self, name: str, config: MCPServerConfig, instance: Any = None) -> None:
        self.name = name
        self.config = config
        self.instance = instance
        self._client: Client | None = None
        self._owner: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._ready: asyncio.Future[Client] | None = None

    @property
    def alive(self) -> bool:
        """Whether the session is open and its owner task still running."""
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

    async def start(self) -> list[ToolInfo]:
        """Open the session and list the tools; on failure :meth:`close` undoes what was started."""
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[Client] = loop.create_future()
        # Retrieve the outcome even when no one is left waiting, so asyncio never
        # warns about an exception that was never retrieved.
        ready.add_done_callback(lambda f: None if f.cancelled() else f.exception())
        self._ready, self._stop = ready, asyncio.Event()
        self._owner = asyncio.create_task(self._own(ready, self._stop), name=f"saucer-mcp-{self.name}")
        client = await asyncio.shield(ready)
        tools = await self._list(client)
        self._client = client
        return tools

    @staticmethod
    async def _list(client: Client) -> list[ToolInfo]:
        tools: list[ToolInfo] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools.extend(_tool_info(tool) for tool in page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def list_tools(self) -> list[ToolInfo]:
        """List the tools again on the open session."""
        assert self._client is not None
        return await self._list(self._client)

    async def call_tool(self, tool: str, arguments: dict[str, Any]) -> CallOutcome:
        """Call ``tool`` on the open session."""
        client = self._client
        if client is None:
            raise ConnectionError(f"the session with server {self.name!r} is closed")
        return _outcome(await client.call_tool(tool, arguments))

    async def close(self) -> None:
        """End the session (its owner closes it; one still connecting is cancelled)."""
        owner, stop, ready = self._owner, self._stop, self._ready
        self._client = self._owner = self._stop = self._ready = None
        if owner is None:
            return
        if stop is not None:
            stop.set()
        if ready is not None and not ready.done():
            owner.cancel()  # still connecting: do not wait for a handshake that may never come
        await self._finish(owner)

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
