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

    [mcp.servers.demo]            # in-process: an MCPServer (or a saucer NativeServer) in an importable module
    import_path = "my_package.tools:server"
    timeout = 5
    sensitive_tools = ["delete_everything"]

    [mcp.servers.scratch]         # in-process, made by a function called with these options
    import_path = "saucer.tools.shell:create_server"
    options = { root = "/tmp/scratch", deny = ["curl *"] }

The built-in ``shell`` and ``files`` servers run in-process by default
(:func:`default_servers`); ``isolate`` runs them as their own stdio processes.

Unknown keys, values of the wrong type and keys that belong to another
transport are validation errors naming the field.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

# The model of one server table is a setting: it lives in saucer.config (which imports nothing of
# saucer) and is named here too, where the dispatcher's users have always found it.
from saucer.config import DEFAULT_MCP_TIMEOUT as DEFAULT_TIMEOUT
from saucer.config import MCPServerConfig, ShellSettings
from saucer.config import MCPTransport as Transport
from saucer.tools.desktop import DEFAULT_SENSITIVE_TOOLS, desktop_environment
from saucer.tools.rules import DEFAULT_SENSITIVE_COMMANDS

__all__ = [
    "MCPServerConfig",
    "Transport",
    "DesktopServer",
    "default_servers",
    "configured_servers",
    "isolated_names",
    "BUILTIN_SERVERS",
    "DEFAULT_TIMEOUT",
]

#: The built-in servers that can run in-process (``desktop`` always runs as its own process).
BUILTIN_SERVERS = ("shell", "files")


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
    #: How launched programs are confined (``[shell]``; default: its defaults).
    sandbox: ShellSettings | None = None

    def config(self, cwd: Path) -> MCPServerConfig:
        """The stdio server: this Python, the display and D-Bus variables of this process, ``cwd`` as its directory.

        A relative ``artifacts`` is taken from the current directory (like ``logs.root``).
        """
        return MCPServerConfig(
            transport="stdio",
            command=sys.executable,
            args=[
                "-P",
                "-m",
                "saucer.tools.desktop",
                *confinement_args(self.sandbox or ShellSettings()),
                "--artifacts",
                str(self.artifacts.expanduser().resolve()),
            ],
            cwd=Path(cwd).expanduser().resolve(),
            # An MCP stdio server inherits only HOME, PATH and a few others: pass DISPLAY and the buses.
            env=desktop_environment(self.display),
            timeout=self.timeout,
            sensitive_tools=list(self.sensitive_tools),
        )


def confinement_args(shell: ShellSettings) -> list[str]:
    """The ``--sandbox``, ``--network``, ``--read`` and ``--write`` flags of a built-in server for ``[shell]``."""
    network = shell.network if not isinstance(shell.network, bool) else None
    args = [
        "--sandbox",
        shell.sandbox,
        "--network",
        ",".join(map(str, network)) if network is not None else ("on" if shell.network else "off"),
    ]
    for path in shell.read:
        args += ["--read", str(path)]
    for path in shell.write:
        args += ["--write", str(path)]
    return args


class ShellConfinement(TypedDict):
    """The confinement keyword arguments of :func:`saucer.tools.shell.create_server`."""

    sandbox: str
    write: list[str]
    read: list[str]
    network: bool | list[int]


def shell_confinement(shell: ShellSettings | None, artifacts: Path | None) -> ShellConfinement:
    """The confinement options of the in-process shell's ``create_server`` for ``[shell]`` and the artifacts folder."""
    shell = shell or ShellSettings()
    write = ([str(artifacts.expanduser().resolve())] if artifacts is not None else []) + [str(p) for p in shell.write]
    return {
        "sandbox": shell.sandbox,
        "write": write,
        "read": [str(p) for p in shell.read],
        "network": shell.network if isinstance(shell.network, bool) else list(shell.network),
    }


def confinement_summary(shell: ShellSettings | None, workspace: Path) -> str:
    """The one line ``saucer doctor`` and ``saucer run`` print: the confinement in force for the built-in tools."""
    from saucer.tools.confine import Policy, confinement_line

    shell = shell or ShellSettings()
    policy = Policy.create(
        shell.sandbox, (Path(workspace).expanduser().resolve(), *shell.write), shell.read, shell.network
    )
    return confinement_line(policy, also=("the session's artifacts folder (desktop sessions)",))


def isolated_names(isolate: bool | Iterable[str]) -> frozenset[str]:
    """The built-in servers ``isolate`` asks to run as their own processes (``True``: all of them).

    A ValueError names anything that is not a built-in server.
    """
    if isinstance(isolate, bool):
        return frozenset(BUILTIN_SERVERS) if isolate else frozenset()
    if isinstance(isolate, str):
        isolate = [isolate]
    names = frozenset(isolate)
    unknown = sorted(names - set(BUILTIN_SERVERS))
    if unknown:
        raise ValueError(
            f"isolate names built-in servers ({', '.join(BUILTIN_SERVERS)}), not {', '.join(map(repr, unknown))}; "
            "desktop always runs as its own process, a server of [mcp.servers] the way its table says"
        )
    return names


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
    isolate: bool | Iterable[str] = False,
    shell: ShellSettings | None = None,
    artifacts: Path | None = None,
) -> dict[str, MCPServerConfig]:
    """The built-in ``shell`` and ``files`` servers, both rooted at ``workspace``, and the ``desktop``
    server when ``desktop`` is given (:meth:`DesktopServer.config`, always its own process).

    By default ``shell`` and ``files`` run in-process: ``import_path`` names
    their ``create_server`` and ``options`` carry what the command line would,
    so a session starts without starting a process; ``create_server`` returns
    their tool table, which the dispatcher calls directly (no MCP session). The shell's is
    :func:`saucer.tools.shell_table.create_server`, which lists the tool without importing
    its implementation until a command runs. Their blocking work runs
    in worker threads and a call's timeout applies as over stdio; the shell's
    commands start from the same minimal environment a stdio server gets.

    ``isolate`` (``True``, or the names of the servers to isolate) runs them
    as their own stdio processes instead, ``python -P -m saucer.tools.NAME``:
    ``-P`` keeps the workspace (their working directory) off ``sys.path``, so
    files in it cannot shadow saucer's modules.

    Commands run confined as ``shell`` (``[shell]``) says, writing only to the
    workspace, ``artifacts`` (the session's artifacts folder), the ``write``
    folders and a private temporary folder (:mod:`saucer.tools.confine`).

    ``sensitive_commands`` defaults to :data:`saucer.tools.rules.DEFAULT_SENSITIVE_COMMANDS`
    (``rm *``, ``sudo *``, ...); pass ``[]`` to ask about nothing.
    """
    root = Path(workspace).expanduser().resolve()
    isolated = isolated_names(isolate)
    shell_args = [
        "-P",
        "-m",
        "saucer.tools.shell",
        "--root",
        str(root),
        "--timeout",
        f"{shell_timeout:g}",
        "--max-timeout",
        f"{max(shell_timeout, 600.0):g}",
        "--max-output",
        str(max_output),
    ]
    for pattern in shell_allow or ():
        shell_args += ["--allow", pattern]
    for pattern in shell_deny or ():
        shell_args += ["--deny", pattern]
    confinement = shell_confinement(shell, artifacts)
    shell_args += confinement_args(shell or ShellSettings())
    if artifacts is not None:
        shell_args += ["--write", str(confinement["write"][0])]
    patterns = list(DEFAULT_SENSITIVE_COMMANDS) if sensitive_commands is None else list(sensitive_commands)
    # A command may ask for up to max_timeout; the dispatcher must wait at least that long.
    shell_wait = max(shell_timeout, 600.0) + 10.0
    shell_options: dict[str, object] = {
        "root": str(root),
        "timeout": shell_timeout,
        "max_timeout": max(shell_timeout, 600.0),
        "max_output": max_output,
        "allow": list(shell_allow or ()),
        "deny": list(shell_deny or ()),
        **confinement,
    }
    servers = {
        "shell": (
            MCPServerConfig(
                transport="stdio",
                command=sys.executable,
                args=shell_args,
                cwd=root,
                timeout=shell_wait,
                sensitive_commands=patterns,
            )
            if "shell" in isolated
            else MCPServerConfig(
                transport="inprocess",
                import_path="saucer.tools.shell_table:create_server",
                options=shell_options,
                timeout=shell_wait,
                sensitive_commands=patterns,
            )
        ),
        "files": (
            MCPServerConfig(
                transport="stdio",
                command=sys.executable,
                args=["-P", "-m", "saucer.tools.files", "--root", str(root), "--max-read", str(max_read)],
                cwd=root,
            )
            if "files" in isolated
            else MCPServerConfig(
                transport="inprocess",
                import_path="saucer.tools.files:create_server",
                options={"root": str(root), "max_read": max_read},
            )
        ),
    }
    if desktop is not None:
        servers["desktop"] = desktop.config(root)
    return servers


def configured_servers(
    configured: Mapping[str, MCPServerConfig],
    workspace: Path,
    *,
    desktop: DesktopServer | None = None,
    isolate: bool | Iterable[str] = False,
    shell: ShellSettings | None = None,
    artifacts: Path | None = None,
) -> dict[str, MCPServerConfig]:
    """The servers a session or a device uses: the ``[mcp.servers]`` tables, or when there are none the
    built-in ``shell`` and ``files`` in ``workspace`` (in-process unless ``isolate``d, see
    :func:`default_servers`); plus the ``desktop`` server when ``desktop`` is given and no table is
    named ``desktop``. ``shell`` (``[shell]``) and ``artifacts`` confine the built-in servers' commands."""
    isolated_names(isolate)  # a wrong name is an error even when [mcp.servers] replaces the built-ins
    if not configured:
        return default_servers(workspace, desktop=desktop, isolate=isolate, shell=shell, artifacts=artifacts)
    servers = dict(configured)
    if desktop is not None and "desktop" not in servers:
        servers["desktop"] = desktop.config(workspace)
    return servers
