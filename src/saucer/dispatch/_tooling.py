"""What every tool connection shares: the listing and result forms, start errors, loading a server by name.

Kept apart from :mod:`saucer.dispatch._connection` and :mod:`saucer.dispatch._mcp`
so both use it without importing each other; nothing here imports the MCP SDK
(an MCP exception or server is recognised only once the SDK is imported, since
none can exist before).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from saucer.tools.native import NativeServer

__all__ = [
    "ServerStartError",
    "ToolInfo",
    "CallOutcome",
    "is_connection_lost",
    "describe_exception",
    "mcp_error",
    "is_mcp_server",
    "load_server_object",
]


class ServerStartError(RuntimeError):
    """A server could not be started or reached; the message names it and the cause."""


@dataclass(frozen=True)
class ToolInfo:
    """One tool as a server lists it (MCP's ``Tool``, in JSON form)."""

    name: str
    title: str | None
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    #: MCP's ToolAnnotations as JSON (camelCase names, unset ones left out); empty when there are none.
    annotations: dict[str, Any] = field(default_factory=dict)

    @property
    def read_only(self) -> bool:
        """Whether the server says the tool only reads (``readOnlyHint``)."""
        return bool(self.annotations.get("readOnlyHint"))

    @classmethod
    def from_listing(cls, entry: Mapping[str, Any]) -> ToolInfo:
        """From a tool listed in MCP's JSON form (``inputSchema``, ``outputSchema``, ``annotations``)."""
        annotations = dict(entry.get("annotations") or {})
        return cls(
            name=entry["name"],
            title=entry.get("title") or annotations.get("title"),
            description=entry.get("description") or "",
            input_schema=entry["inputSchema"],
            output_schema=entry.get("outputSchema"),
            annotations=annotations,
        )


@dataclass(frozen=True)
class CallOutcome:
    """What one call returned: MCP's ``CallToolResult`` reduced to what the dispatcher records."""

    is_error: bool
    #: The structured content (None when the server sent none).
    structured: Any
    #: A successful call's JSON value: structured content, else its text, else its content blocks.
    payload: Any
    #: A failed call's message: its text blocks, else its structured content as JSON.
    error_text: str


def _loaded(module: str, name: str) -> Any:
    """Attribute ``name`` of ``module`` if that module is imported, else None.

    An exception or server of the MCP SDK can exist only once the SDK is
    imported; asking ``sys.modules`` keeps the in-process path from importing it.
    """
    found = sys.modules.get(module)
    return getattr(found, name, None) if found is not None else None


def mcp_error(exc: BaseException) -> tuple[int, str] | None:
    """(code, message) when ``exc`` is the MCP SDK's ``MCPError`` (a protocol error), else None."""
    error_type = _loaded("mcp.shared.exceptions", "MCPError")
    if error_type is not None and isinstance(exc, error_type):
        return exc.code, exc.message
    return None


def is_mcp_server(obj: object) -> bool:
    """Whether ``obj`` is an MCP SDK server (an ``MCPServer`` or a low-level ``Server``)."""
    kinds = tuple(
        kind
        for kind in (
            _loaded("mcp.server.mcpserver.server", "MCPServer"),
            _loaded("mcp.server.lowlevel.server", "Server"),
        )
        if kind is not None
    )
    return bool(kinds) and isinstance(obj, kinds)


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` of the first leaf of ``exc`` (task groups wrap errors in groups)."""
    exc = _leaf(exc)
    protocol = mcp_error(exc)
    if protocol is not None:
        return f"MCP error {protocol[0]}: {protocol[1]}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def is_connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` from a call means the connection to the server is gone."""
    exc = _leaf(exc)
    protocol = mcp_error(exc)
    if protocol is not None:
        closed: int | None = _loaded("mcp_types", "CONNECTION_CLOSED")
        return protocol[0] == closed
    if isinstance(exc, (ConnectionError, BrokenPipeError)):
        return True
    # The transports' own errors: only possible once their modules are imported.
    kinds = [_loaded("anyio", name) for name in ("ClosedResourceError", "BrokenResourceError", "EndOfStream")]
    kinds.append(_loaded("httpx2", "TransportError"))
    return any(kind is not None and isinstance(exc, kind) for kind in kinds)


def load_server_object(import_path: str, options: Mapping[str, Any] | None = None) -> Any:
    """The server named by ``'package.module:attribute'``: a NativeServer, an MCPServer or a low-level Server.

    When the attribute is a function instead, the server is what it returns,
    called with ``options`` as keyword arguments (a fresh server each time).
    """
    module_name, _, attribute = import_path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is reported the same way
        raise ServerStartError(
            f"cannot import module {module_name!r} of import_path {import_path!r}: {describe_exception(exc)}"
        ) from exc
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            message = f"import_path {import_path!r}: module {module_name!r} has no attribute {attribute!r}"
            raise ServerStartError(message) from exc
    if isinstance(obj, NativeServer) or is_mcp_server(obj):
        if options:
            raise ServerStartError(f"import_path {import_path!r} names a server object, which takes no options")
        return obj
    if callable(obj) and not isinstance(obj, type):
        try:
            obj = obj(**(options or {}))
        except Exception as exc:  # noqa: BLE001 - a factory's failure is a start failure naming it
            raise ServerStartError(f"{import_path}(**options) failed: {describe_exception(exc)}") from exc
        if isinstance(obj, NativeServer) or is_mcp_server(obj):
            return obj
        raise ServerStartError(f"{import_path}() returned a {type(obj).__name__}, not an MCPServer or Server")
    kind = type(obj).__name__
    raise ServerStartError(f"import_path {import_path!r} names a {kind}, not an MCPServer, a Server or a function")
