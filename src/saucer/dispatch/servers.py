"""Configuration of the MCP servers the local dispatcher talks to.

One :class:`MCPServerConfig` per ``[mcp.servers.NAME]`` table of
``saucer.toml``. The transport follows from the keys given (or from an
explicit ``transport``)::

    [mcp.servers.time]            # stdio: a subprocess speaking MCP on stdin/stdout
    command = "mcp-server-time"
    args = ["--local-timezone", "UTC"]

    [mcp.servers.remote]          # streamable HTTP
    url = "http://127.0.0.1:8000/mcp"
    headers = { Authorization = "Bearer ..." }

    [mcp.servers.demo]            # in-process: an MCPServer object in an importable module
    import_path = "my_package.tools:server"
    timeout = 5
    sensitive_tools = ["delete_everything"]

Unknown keys, values of the wrong type and keys that belong to another
transport are validation errors naming the field.
"""

from __future__ import annotations

import difflib
import re
import sys
from dataclasses import dataclass
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from saucer.tools.desktop import DEFAULT_SENSITIVE_TOOLS, desktop_environment
from saucer.tools.rules import DEFAULT_SENSITIVE_COMMANDS, CommandRule

__all__ = ["MCPServerConfig", "Transport", "DesktopServer", "default_servers", "configured_servers", "DEFAULT_TIMEOUT"]

Transport = Literal["stdio", "http", "inprocess"]
DEFAULT_TIMEOUT = 30.0

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
# The key that selects each transport, and the keys only that transport accepts.
_SELECTOR: dict[str, Transport] = {"command": "stdio", "url": "http", "import_path": "inprocess"}
_OWN_FIELDS: dict[Transport, tuple[str, ...]] = {
    "stdio": ("command", "args", "env", "cwd", "stderr"),
    "http": ("url", "headers"),
    "inprocess": ("import_path",),
}


class MCPServerConfig(BaseModel):
    """How to reach one MCP server, its per-command timeout and which of its tools need approval."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    transport: Transport = Field(
        description="stdio, http (streamable HTTP) or inprocess; inferred from command, url or import_path."
    )
    # stdio
    command: str | None = Field(None, min_length=1, description="Executable of a stdio server.")
    args: list[str] = Field(default_factory=list, description="Arguments of the stdio server.")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environment variables, added to a minimal inherited set (HOME, PATH, USER, ...).",
    )
    cwd: Path | None = Field(None, description="Working directory of the stdio server.")
    stderr: Literal["inherit", "discard"] | Path = Field(
        "inherit", description="Where the stdio server's stderr goes: inherit, discard, or a file to append to."
    )
    # streamable HTTP
    url: str | None = Field(None, description="Endpoint of a streamable HTTP server, e.g. http://127.0.0.1:8000/mcp.")
    headers: dict[str, str] = Field(default_factory=dict, description="HTTP headers sent with every request.")
    # in-process
    import_path: str | None = Field(
        None, description="'package.module:attribute' naming an MCPServer (or low-level Server) object."
    )
    # all transports
    timeout: float = Field(DEFAULT_TIMEOUT, gt=0, description="Seconds one command may take on this server.")
    startup_timeout: float = Field(30.0, gt=0, description="Seconds the server may take to start and answer.")
    sensitive_tools: list[str] = Field(
        default_factory=list, description="Tools of this server (bare names) that need the user's approval."
    )
    sensitive_commands: list[str] = Field(
        default_factory=list,
        description="Glob or 're:' patterns; a call whose string 'command' parameter matches needs approval.",
    )

    @model_validator(mode="before")
    @classmethod
    def _infer_transport(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("transport") is not None:
            return data
        present = [key for key in _SELECTOR if data.get(key) is not None]
        if not present:
            message = "a server needs one of 'command' (stdio), 'url' (streamable HTTP) or 'import_path' (in-process)"
            unknown = [key for key in data if key not in cls.model_fields]
            if unknown:
                # Likely a typo of the selecting key: name it, since nothing else will be checked.
                hints = []
                for key in unknown:
                    close = difflib.get_close_matches(str(key), list(cls.model_fields), n=1)
                    hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
                message = f"unknown field {', '.join(hints)}; {message}"
            raise ValueError(message)
        if len(present) > 1:
            raise ValueError(f"give only one of 'command', 'url' or 'import_path', not {' and '.join(present)}")
        return {**data, "transport": _SELECTOR[present[0]]}

    @model_validator(mode="after")
    def _check_transport_fields(self) -> "MCPServerConfig":
        needed = next(key for key, kind in _SELECTOR.items() if kind == self.transport)
        if getattr(self, needed) is None:
            raise ValueError(f"field {needed!r} is required for a {self.transport} server")
        for kind, fields in _OWN_FIELDS.items():
            if kind == self.transport:
                continue
            for name in fields:
                # A default value is no claim (a full dump carries every field), anything else is.
                default = type(self).model_fields[name].get_default(call_default_factory=True)
                if getattr(self, name) != default:
                    raise ValueError(f"field {name!r} applies to {kind} servers, not to this {self.transport} server")
        return self

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
        return value

    @field_validator("import_path")
    @classmethod
    def _check_import_path(cls, value: str | None) -> str | None:
        if value is not None and not _IMPORT_PATH.match(value):
            raise ValueError(f"must look like 'package.module:attribute', got {value!r}")
        return value

    @field_validator("sensitive_commands")
    @classmethod
    def _check_patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            CommandRule.compile(pattern)  # a ValueError names the pattern
        return value

    @field_validator("sensitive_tools")
    @classmethod
    def _check_tool_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not name.strip():
                raise ValueError("tool names must not be empty")
        return value


@dataclass(frozen=True)
class DesktopServer:
    """How to run the built-in ``desktop`` server (see :mod:`saucer.tools.desktop`)."""

    #: Where screenshots, saved trees and program logs go.
    artifacts: Path
    #: The X display (default: this process's ``DISPLAY``).
    display: str | None = None
    #: Its tools that need the user's approval (default: ``launch``); ``()`` asks about nothing.
    sensitive_tools: tuple[str, ...] = DEFAULT_SENSITIVE_TOOLS
    #: Seconds one command may take; ``launch`` and ``find`` wait up to 120 s.
    timeout: float = 150.0

    def config(self, cwd: Path) -> MCPServerConfig:
        """The stdio server: this Python, the display and D-Bus variables of this process, ``cwd`` as its directory.

        A relative ``artifacts`` is taken from the current directory (like ``logs.root``).
        """
        return MCPServerConfig(
            command=sys.executable,
            args=["-P", "-m", "saucer.tools.desktop", "--artifacts", str(self.artifacts.expanduser().resolve())],
            cwd=Path(cwd).expanduser().resolve(),
            # An MCP stdio server inherits only HOME, PATH and a few others: pass DISPLAY and the buses.
            env=desktop_environment(self.display),
            timeout=self.timeout,
            sensitive_tools=list(self.sensitive_tools),
        )


def default_servers(
    workspace: Path,
    *,
    shell_allow: list[str] | None = None,
    shell_deny: list[str] | None = None,
    sensitive_commands: list[str] | None = None,
    shell_timeout: float = 60.0,
    max_output: int = 64 * 1024,
    max_read: int = 256 * 1024,
    desktop: DesktopServer | None = None,
) -> dict[str, MCPServerConfig]:
    """The built-in ``shell`` and ``files`` servers, both rooted at ``workspace`` (stdio, this Python),
    and the ``desktop`` server when ``desktop`` is given (:meth:`DesktopServer.config`).

    They run as ``python -P -m saucer.tools.NAME``: ``-P`` keeps the workspace
    (their working directory) off ``sys.path``, so files in it cannot shadow
    saucer's modules.

    ``sensitive_commands`` defaults to :data:`saucer.tools.rules.DEFAULT_SENSITIVE_COMMANDS`
    (``rm *``, ``sudo *``, ...); pass ``[]`` to ask about nothing.
    """
    root = Path(workspace).expanduser().resolve()
    shell_args = ["-P", "-m", "saucer.tools.shell", "--root", str(root), "--timeout", f"{shell_timeout:g}",
                  "--max-timeout", f"{max(shell_timeout, 600.0):g}", "--max-output", str(max_output)]
    for pattern in shell_allow or ():
        shell_args += ["--allow", pattern]
    for pattern in shell_deny or ():
        shell_args += ["--deny", pattern]
    patterns = list(DEFAULT_SENSITIVE_COMMANDS) if sensitive_commands is None else list(sensitive_commands)
    servers = {
        "shell": MCPServerConfig(
            command=sys.executable,
            args=shell_args,
            cwd=root,
            # A command may ask for up to --max-timeout; the dispatcher must wait at least that long.
            timeout=max(shell_timeout, 600.0) + 10.0,
            sensitive_commands=patterns,
        ),
        "files": MCPServerConfig(
            command=sys.executable,
            args=["-P", "-m", "saucer.tools.files", "--root", str(root), "--max-read", str(max_read)],
            cwd=root,
        ),
    }
    if desktop is not None:
        servers["desktop"] = desktop.config(root)
    return servers


def configured_servers(
    configured: Mapping[str, MCPServerConfig], workspace: Path, *, desktop: DesktopServer | None = None
) -> dict[str, MCPServerConfig]:
    """The servers a session or a device uses: the ``[mcp.servers]`` tables, or when there are none the
    built-in ``shell`` and ``files`` in ``workspace``; plus the ``desktop`` server when ``desktop`` is given
    and no table is named ``desktop``."""
    if not configured:
        return default_servers(workspace, desktop=desktop)
    servers = dict(configured)
    if desktop is not None and "desktop" not in servers:
        servers["desktop"] = desktop.config(workspace)
    return servers
