"""The local dispatcher: commands run as tool calls on MCP servers of this machine.

::

    async with LocalCommandDispatcher.from_servers({"time": {"command": "mcp-server-time"}}) as dispatcher:
        tools = await dispatcher.list_tools()          # {"time.get_current_time": {...}, ...}
        [result] = await dispatcher.execute_commands(
            [Command(tool_name="time.get_current_time", parameters={"timezone": "UTC"})]
        )

Each server gets one persistent connection, opened on first use and closed
when the dispatcher closes: an MCP session, or for the built-in ``shell`` and
``files`` in-process (a :class:`~saucer.tools.native.NativeServer`) direct
calls, with the same listing and results (:mod:`saucer.dispatch._connection`). Tools are named ``server.tool``; a bare ``tool``
works when exactly one server has it. Everything that can go wrong with one
command (unknown or ambiguous tool, invalid parameters, refusal, timeout, a
tool error, a crashed server) is a failure *result* naming the tool, never an
exception; see :mod:`saucer.dispatch.base` for the batch rules.

Sensitive commands (tools listed in ``sensitive_tools``, or calls whose
``command`` parameter matches one of ``sensitive_commands``) run only when the
``approver`` says yes, or, without an approver, when ``assume_yes`` is set.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from saucer.dispatch._connection import ServerConnection
from saucer.dispatch._tooling import (
    ServerStartError,
    ToolInfo,
    describe_exception,
    is_connection_lost,
    is_mcp_server,
    mcp_error,
)
from saucer.dispatch.base import BatchCommandDispatcher
from saucer.dispatch.messages import Command, Result, ResultStatus
from saucer.dispatch.servers import MCPServerConfig, default_servers
from saucer.dispatch.shared import SharedServers, current_shared_servers
from saucer.dispatch.toolcheck import ParameterCheck
from saucer.tools.native import NativeServer
from saucer.tools.rules import SensitivityRules, compile_rules
from saucer.tools.rules import sensitive_reason as _rule_reason

__all__ = [
    "LocalCommandDispatcher",
    "Approver",
    "MCPServerConfig",
    "ServerStartError",
    "default_servers",
]

logger = logging.getLogger(__name__)

Approver = Callable[[Command], Awaitable[bool | str]]
"""Decides on a sensitive command: True runs it; False, or a sentence saying why, refuses it."""
ServerSpec = MCPServerConfig | Mapping[str, Any] | NativeServer | Any
"""A server: its configuration (a model or a table), or a live server (a NativeServer, an MCPServer or a Server)."""


@functools.cache
def _configs() -> TypeAdapter[dict[str, MCPServerConfig]]:
    """The validator of server tables, built when a table comes (the built-in servers are live objects)."""
    return TypeAdapter(dict[str, MCPServerConfig])


_SHOWN_CANDIDATES = 20


def _check_server_name(name: str) -> None:
    if not isinstance(name, str) or not name or "." in name or name != name.strip():
        raise ValueError(f"invalid MCP server name {name!r}: use a non-empty name without dots or surrounding spaces")


def _tool_type(tool: ToolInfo) -> str:
    return "data_collection" if tool.read_only else "action"


class LocalCommandDispatcher(BatchCommandDispatcher):
    """Runs commands as MCP tool calls on stdio, streamable HTTP and in-process servers.

    Use it as an async context manager (or call :meth:`aclose`); servers start
    on first use. It belongs to the event loop that first uses it.
    """

    def __init__(
        self,
        servers: Mapping[str, ServerSpec],
        *,
        approver: Approver | None = None,
        assume_yes: bool = False,
        sensitive_tools: Iterable[str] = (),
        sensitive_commands: Iterable[str] = (),
        parallel_data_collection: bool = False,
        validate_parameters: bool = True,
        shared: SharedServers | None = None,
    ) -> None:
        """Dispatch to ``servers`` (name → config, config table, or a live NativeServer, MCPServer or Server).

        Made inside :func:`~saucer.dispatch.shared.share_tool_servers` (or
        given ``shared``), the dispatcher borrows one connection per server
        name and configuration from that scope, shared with the other
        dispatchers made there, and leaves it open when it closes.

        ``sensitive_tools`` are added to each server's own list: a qualified
        name (``server.tool``) marks that tool, a bare name marks the tool of
        that name on every server. ``sensitive_commands`` are patterns added to
        every server's. ``parallel_data_collection`` runs consecutive data_collection
        commands concurrently. ``validate_parameters`` checks parameters
        against the tool's input schema before calling it.
        """
        configs: dict[str, MCPServerConfig] = {}
        instances: dict[str, Any] = {}
        tables: dict[str, Any] = {}
        for name, spec in servers.items():
            _check_server_name(name)
            if isinstance(spec, NativeServer) or is_mcp_server(spec):
                instances[name] = spec
                configs[name] = MCPServerConfig(
                    transport="inprocess", import_path=f"{type(spec).__module__}:{type(spec).__name__}"
                )
            elif isinstance(spec, MCPServerConfig):
                configs[name] = spec
            else:
                tables[name] = spec
        # Validated together so a pydantic error's location names the server and the field.
        if tables:
            configs.update(_configs().validate_python(tables))
        shared = shared if shared is not None else current_shared_servers()
        self._connections: dict[str, ServerConnection] = {}
        #: The connections this dispatcher closes (not those borrowed from a shared scope).
        self._owned: list[ServerConnection] = []
        for name in servers:
            config, instance = configs[name], instances.get(name)

            def make(name: str = name, config: MCPServerConfig = config, instance: Any = instance) -> ServerConnection:
                return ServerConnection(name, config, instance)

            if shared is not None:
                key = (name, config.model_dump_json(), id(instance) if instance is not None else None)
                self._connections[name] = shared.connection(key, make)
            else:
                self._connections[name] = make()
                self._owned.append(self._connections[name])
        self.approver = approver
        self.assume_yes = assume_yes
        self.parallel_data_collection = parallel_data_collection
        self.validate_parameters = validate_parameters
        extra_tools = list(sensitive_tools)
        extra_patterns = compile_rules(sensitive_commands)
        self._rules = {
            name: SensitivityRules(
                tools=frozenset(
                    tool if "." in tool else f"{name}.{tool}" for tool in [*configs[name].sensitive_tools, *extra_tools]
                ),
                command_patterns=compile_rules(configs[name].sensitive_commands) + extra_patterns,
            )
            for name in self._connections
        }
        self._approval_lock = asyncio.Lock()
        self._validators: dict[tuple[str, int, str], ParameterCheck] = {}
        self._closed = False
        #: Servers that failed to start when listing tools, with the cause.
        self.server_errors: dict[str, str] = {}

    # -- construction ---------------------------------------------------------------

    @classmethod
    def from_config(
        cls, servers: Mapping[str, MCPServerConfig | Mapping[str, Any]], **options: Any
    ) -> LocalCommandDispatcher:
        """A dispatcher for the ``[mcp.servers.NAME]`` tables (validated here, errors name server and field)."""
        return cls(servers, **options)

    @classmethod
    def from_servers(cls, servers: Mapping[str, ServerSpec], **options: Any) -> LocalCommandDispatcher:
        """A dispatcher for ``servers``: config tables, :class:`MCPServerConfig` or live server objects."""
        return cls(servers, **options)

    @classmethod
    def with_default_servers(cls, workspace: Path, **options: Any) -> LocalCommandDispatcher:
        """A dispatcher for the built-in ``shell`` and ``files`` servers rooted at ``workspace``."""
        return cls(default_servers(workspace), **options)

    # -- lifecycle ------------------------------------------------------------------

    async def __aenter__(self) -> LocalCommandDispatcher:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every session and stop every server it owns (not shared ones); it cannot be used afterwards."""
        self._closed = True
        await asyncio.gather(*(conn.close() for conn in self._owned))

    async def start(self) -> dict[str, str]:
        """Start every server now (instead of on first use); return the ones that failed, with the cause."""
        if self._closed:
            raise RuntimeError("the dispatcher is closed")

        async def one(conn: ServerConnection) -> tuple[str, str | None]:
            try:
                await conn.ensure_started()
                return conn.name, None
            except ServerStartError as exc:
                return conn.name, str(exc)

        outcomes = await asyncio.gather(*(one(conn) for conn in self._connections.values()))
        errors = {name: error for name, error in outcomes if error is not None}
        for name, error in errors.items():
            if self.server_errors.get(name) != error:  # say it once, not on every bare tool name
                logger.warning("MCP server %r is unavailable: %s", name, error)
        self.server_errors = errors
        return dict(errors)

    @property
    def server_names(self) -> list[str]:
        """The configured servers, in configuration order."""
        return list(self._connections)

    # -- tools ----------------------------------------------------------------------

    async def list_tools(self, *, refresh: bool = False, strict: bool = False) -> dict[str, dict[str, Any]]:
        """Every tool of every server that starts, keyed ``server.tool``, as JSON-ready dicts.

        Each entry has ``name``, ``server``, ``tool``, ``title``, ``description``,
        ``input_schema``, ``output_schema`` (or None), ``annotations``,
        ``tool_type`` (``data_collection`` for read-only tools) and
        ``sensitive``. Servers that fail to start are left out and recorded in
        :attr:`server_errors`; with ``strict`` they raise :class:`ServerStartError`.
        """
        errors = await self.start()
        if refresh:
            for conn in self._connections.values():
                if conn.alive:
                    await conn.refresh_tools()
                    self._validators = {k: v for k, v in self._validators.items() if k[0] != conn.name}
        if strict and errors:
            raise ServerStartError("; ".join(errors.values()))
        info: dict[str, dict[str, Any]] = {}
        for name, conn in self._connections.items():
            if name in errors:
                continue
            rules = self._rules[name]
            for tool in conn.tools.values():
                qualified = f"{name}.{tool.name}"
                info[qualified] = {
                    "name": qualified,
                    "server": name,
                    "tool": tool.name,
                    "title": tool.title,
                    "description": tool.description,
                    "input_schema": tool.input_schema,
                    "output_schema": tool.output_schema,
                    "annotations": tool.annotations,
                    "tool_type": _tool_type(tool),
                    "sensitive": qualified in rules.tools,
                    "sensitive_commands": [rule.pattern for rule in rules.command_patterns],
                }
        # One JSON round trip: the engine stores this as a durable Context value.
        plain: dict[str, dict[str, Any]] = json.loads(json.dumps(info, default=str))
        return plain

    async def _resolve(self, command: Command) -> tuple[ServerConnection, str] | Result:
        """The server and tool a command names, or a failure result saying why there is none."""
        name = command.tool_name
        # A qualified name: server names have no dots, so the server is what comes before the first one.
        server, dot, tool = name.partition(".")
        conn = self._connections.get(server) if dot else None
        if conn is not None:
            try:
                await conn.ensure_started()
            except ServerStartError as exc:
                return Result.failure(command, f"tool {name!r} is unavailable: {exc}", namespace=server)
            if tool not in conn.tools:
                listed = ", ".join(sorted(conn.tools)[:_SHOWN_CANDIDATES]) or "none"
                return Result.failure(
                    command,
                    f"unknown tool {name!r}: server {server!r} has no tool {tool!r} (its tools: {listed})",
                    namespace=server,
                )
            return conn, tool
        errors = await self.start()
        owners = [c for c in self._connections.values() if c.name not in errors and name in c.tools]
        if len(owners) == 1:
            return owners[0], name
        if len(owners) > 1:
            candidates = ", ".join(f"{c.name}.{name}" for c in owners)
            return Result.failure(
                command, f"ambiguous tool name {name!r}: it exists on several servers ({candidates}); use server.tool"
            )
        known = sorted(f"{c.name}.{t}" for c in self._connections.values() if c.name not in errors for t in c.tools)
        message = f"unknown tool {name!r}; available tools: {', '.join(known[:_SHOWN_CANDIDATES]) or 'none'}"
        if len(known) > _SHOWN_CANDIDATES:
            message += f" and {len(known) - _SHOWN_CANDIDATES} more"
        if dot and server not in self._connections:
            message += f" (there is no server {server!r}; servers: {', '.join(self._connections) or 'none'})"
        if errors:
            message += "; unavailable servers: " + "; ".join(errors.values())
        return Result.failure(command, message)

    def _parameter_error(self, conn: ServerConnection, tool: str, parameters: dict[str, Any]) -> str | None:
        """What is wrong with ``parameters`` according to the tool's input schema, or None."""
        key = (conn.name, conn.generation, tool)
        check = self._validators.get(key)
        if check is None:
            check = self._validators[key] = ParameterCheck(conn.tools[tool].input_schema)
            if not check.schema_is_valid:
                # The server's schema is broken; the server still validates, so do not block the call.
                logger.warning("tool %s.%s has an invalid input schema; parameters are not checked", conn.name, tool)
        return check.problem(parameters)

    async def sensitive_reason(self, command: Command) -> str | None:
        """Why ``command`` needs approval, or None (also None when its tool cannot be resolved)."""
        resolved = await self._resolve(command)
        if isinstance(resolved, Result):
            return None
        conn, tool = resolved
        return _rule_reason(f"{conn.name}.{tool}", command.parameters, self._rules[conn.name])

    async def _refusal(self, command: Command, qualified: str, reason: str) -> str | None:
        """None when a sensitive command may run, else why it may not."""
        if self.approver is None:
            if self.assume_yes:
                return None
            return (
                f"refused: tool {qualified!r} needs approval ({reason}) and no approver is set; "
                "allow it with assume_yes (the CLI's --yes)"
            )
        # One question at a time, even when reads run in parallel.
        async with self._approval_lock:
            try:
                approved = await self.approver(command)
            except Exception as exc:  # noqa: BLE001 - a broken approver refuses, it does not crash the batch
                return f"refused: the approver failed for tool {qualified!r} ({reason}): {describe_exception(exc)}"
        if approved is True:
            return None
        if isinstance(approved, str) and approved:
            return f"refused: tool {qualified!r} ({reason}): {approved}"
        return f"refused by the user: tool {qualified!r} ({reason})"

    # -- execution ------------------------------------------------------------------

    async def execute_command(self, command: Command) -> Result:
        """Run one command; every outcome is a Result whose ``namespace`` is the server name."""
        if self._closed:
            return Result.failure(command, "the dispatcher is closed")
        resolved = await self._resolve(command)
        if isinstance(resolved, Result):
            return resolved
        conn, tool = resolved
        qualified = f"{conn.name}.{tool}"
        namespace = conn.name
        if self.validate_parameters:
            problem = self._parameter_error(conn, tool, command.parameters)
            if problem is not None:
                return Result.failure(command, f"invalid parameters for tool {qualified!r}: {problem}", namespace)
        reason = _rule_reason(qualified, command.parameters, self._rules[conn.name])
        if reason is not None:
            refusal = await self._refusal(command, qualified, reason)
            if refusal is not None:
                return Result.failure(command, refusal, namespace)

        limit = conn.config.timeout
        generation = conn.generation
        try:
            async with asyncio.timeout(limit):
                outcome = await conn.call_tool(tool, dict(command.parameters))
        except TimeoutError:
            return Result.failure(command, f"tool {qualified!r} timed out after {limit:g} s", namespace)
        except ServerStartError as exc:
            return Result.failure(command, f"tool {qualified!r} is unavailable: {exc}", namespace)
        except Exception as exc:  # noqa: BLE001 - sorted into crash or call failure below
            if is_connection_lost(exc) or not conn.alive:
                return await self._after_crash(command, conn, generation, qualified, exc)
            protocol = mcp_error(exc)
            if protocol is not None:
                error = f"tool {qualified!r} failed: {protocol[1]} (MCP error {protocol[0]})"
                return Result.failure(command, error, namespace)
            return Result.failure(command, f"tool {qualified!r} failed: {describe_exception(exc)}", namespace)
        if outcome.is_error:
            # A failed call keeps its data (e.g. a command's exit code, stdout and stderr).
            return Result(
                status=ResultStatus.FAILURE,
                result=outcome.structured,
                error=f"tool {qualified!r} failed: {outcome.error_text}",
                namespace=namespace,
                call_id=command.call_id,
            )
        return Result(status=ResultStatus.SUCCESS, result=outcome.payload, namespace=namespace, call_id=command.call_id)

    async def _after_crash(
        self, command: Command, conn: ServerConnection, generation: int, qualified: str, exc: BaseException
    ) -> Result:
        """The failure for a command whose server died under it, after restarting the server once."""
        cause = describe_exception(exc)
        try:
            restarted = await conn.restart(generation)
            state = "it was restarted" if restarted else "it had already been restarted"
        except ServerStartError as start_error:
            state = f"restarting it failed: {start_error}"
        return Result.failure(
            command,
            f"server {conn.name!r} crashed while running tool {qualified!r} ({cause}); {state}; "
            "the command was not retried",
            conn.name,
        )
