"""The built-in ``shell`` MCP server: run a command line and get its exit code and output.

Run it over stdio with ``python -m saucer.tools.shell [--root DIR] [--allow PATTERN]...``
(``--help`` lists the options; each also has a ``SAUCER_SHELL_*`` variable).

Commands run through ``/bin/sh -c`` in their own process group, with an
asyncio subprocess so the server keeps answering while they run. On timeout
the whole group is terminated (SIGTERM, then SIGKILL). Output beyond
``--max-output`` bytes per stream is dropped and reported as truncated.
An exit code outside ``expect_exit`` (default ``[0]``) makes the call a tool
error (``isError``) that still carries the exit code, stdout and stderr as
structured content, so a failing command is a failed result, never a success.
Allow/deny rules (see :mod:`saucer.tools.rules`) are checked before running;
a refused command is a tool error naming the rule. Which commands need the
user's approval is decided on the client side by the dispatcher, with
:func:`saucer.tools.rules.sensitive_reason`, re-exported here.

Running one command (options, checks, the process group's life) is
:mod:`saucer.tools.shell_run`; this module makes it a tool: its result, its
table, the stdio server and its command line.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from saucer.tools import native, shell_run
from saucer.tools._common import (
    built_once,
    env_default,
    env_list,
    existing_dir,
    make_mcp_server,
    one_line,
    parse,
    positive_float,
    positive_int,
    serve_stdio,
)
from saucer.tools.confine import add_arguments
from saucer.tools.native import NativeServer, ToolError, ToolOutcome, ToolSpec
from saucer.tools.rules import SensitivityRules, is_sensitive, sensitive_reason
from saucer.tools.shell_options import (
    DEFAULT_EXPECT_EXIT,
    DEFAULT_MAX_OUTPUT,
    DEFAULT_MAX_TIMEOUT,
    DEFAULT_TIMEOUT,
    RUN_HINTS,
    RUN_TITLE,
    SERVER_NAME,
    ShellOptions,
    default_environment,
    describe,
    instructions,
    prepare,
)
from saucer.tools.shell_run import ShellResult, run_command

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer
    from mcp.types import CallToolResult

__all__ = [
    "ShellOptions",
    "ShellResult",
    "run_command",
    "shell_outcome",
    "shell_call_result",
    "DEFAULT_EXPECT_EXIT",
    "tool_table",
    "build_server",
    "create_server",
    "shared_table",
    "built_schemas",
    "default_environment",
    "parse_options",
    "main",
    "is_sensitive",
    "sensitive_reason",
    "SensitivityRules",
]


def shell_outcome(result: ShellResult, expect_exit: Sequence[int] | None = None) -> ToolOutcome:
    """The outcome of a finished command: an error when its exit code is not expected.

    Either way the structured content is the whole :class:`ShellResult`, so the
    exit code, stdout and stderr of a failed command stay available as data.
    """
    expected = tuple(DEFAULT_EXPECT_EXIT if expect_exit is None else expect_exit)
    data = result.model_dump(mode="json")
    if result.exit_code in expected:
        return ToolOutcome(result.model_dump_json(indent=2), data)
    wanted = ", ".join(map(str, expected)) or "none"
    text = f"command exited with code {result.exit_code} (expected {wanted})"
    for name, value in (("stdout", result.stdout), ("stderr", result.stderr)):
        if value:
            text += f"\n--- {name} ---\n{value[-2000:].rstrip()}"
    return ToolOutcome(text, data, is_error=True)


def shell_call_result(result: ShellResult, expect_exit: Sequence[int] | None = None) -> CallToolResult:
    """:func:`shell_outcome` as the MCP result (``CallToolResult``; imports the MCP SDK)."""
    from mcp.types import CallToolResult, TextContent

    outcome = shell_outcome(result, expect_exit)
    return CallToolResult(
        content=[TextContent(type="text", text=outcome.text)],
        structured_content=outcome.structured,
        is_error=outcome.is_error,
    )


def tool_table(options: ShellOptions) -> NativeServer:
    """The shell tools (one, ``run``) for ``options``, to call in-process or serve over MCP."""

    # Annotations here must not refer to local names: this module uses postponed
    # annotations, and they are evaluated in the module's namespace.
    async def run(
        command: Annotated[str, Field(description="The command line to run, e.g. `ls -la src | head -50`.")],
        timeout: Annotated[
            float | None,
            Field(description="Seconds before the command and its children are killed (default: the server's)."),
        ] = None,
        cwd: Annotated[
            str | None, Field(description="Working directory relative to the workspace root (default: the root).")
        ] = None,
        env: Annotated[
            dict[str, str] | None, Field(description="Extra environment variables for this command.")
        ] = None,
        expect_exit: Annotated[
            list[int] | None,
            Field(description="Exit codes that count as success (default [0]); any other makes the call fail."),
        ] = None,
    ) -> ToolOutcome:
        try:
            finished = await run_command(command, options, timeout=timeout, cwd=cwd, env=env)
        except ToolError:
            raise
        except Exception as exc:  # noqa: BLE001 - one line to the caller, no traceback in the server
            raise ToolError(one_line(exc)) from None
        return shell_outcome(finished, expect_exit)

    run_tool = ToolSpec(
        "run",
        run,
        ShellResult,
        title=RUN_TITLE,
        description=describe(options),
        hints=RUN_HINTS,
    )
    return NativeServer(
        SERVER_NAME,
        instructions(options),
        [run_tool],
        schema_sources=(__file__, shell_run.__file__, native.__file__),
    )


def build_server(options: ShellOptions) -> MCPServer:
    """The shell MCP server for ``options``: :func:`tool_table` registered on an MCPServer (imports the MCP SDK)."""
    return make_mcp_server(tool_table(options))


def create_server(
    root: str | os.PathLike[str] = ".",
    *,
    allow: Sequence[str] = (),
    deny: Sequence[str] = (),
    max_output: int = DEFAULT_MAX_OUTPUT,
    timeout: float = DEFAULT_TIMEOUT,
    max_timeout: float = DEFAULT_MAX_TIMEOUT,
    shell: str = "/bin/sh",
    env: Mapping[str, str] | None = None,
    sandbox: str = "auto",
    write: Sequence[str] = (),
    read: Sequence[str] = ("/",),
    network: bool | Sequence[int] = True,
) -> NativeServer:
    """The shell tool to run in-process, from keyword options (an ``import_path`` factory).

    The options are those of the command line. The dispatcher calls the
    tool directly (no MCP server is built). Commands start from ``env``,
    by default the minimal environment a stdio server gets (HOME, PATH, USER,
    ...; what the MCP SDK's ``get_default_environment`` gives a stdio server), never the whole
    environment of the host process, which may hold its secrets. Commands run confined as
    ``sandbox``, ``write``, ``read`` and ``network`` say (:mod:`saucer.tools.confine`). Tables are
    built once per options and shared (:func:`saucer.tools._common.built_once`).
    """
    options, given = prepare(
        root,
        allow=allow,
        deny=deny,
        max_output=max_output,
        timeout=timeout,
        max_timeout=max_timeout,
        shell=shell,
        env=env,
        sandbox=sandbox,
        write=write,
        read=read,
        network=network,
    )
    return shared_table(options, given)


def shared_table(options: ShellOptions, key: dict[str, Any]) -> NativeServer:
    """The table of ``options``, built once and shared by every server with the same ``key``
    (:func:`saucer.tools._common.built_once`; ``key`` from :func:`saucer.tools.shell_options.prepare`)."""
    return built_once("shell", key, lambda: tool_table(options))


def built_schemas() -> dict[str, Any]:
    """The ``run`` tool's input and output JSON schemas as its models build them (no cache), what
    :mod:`saucer.tools.shell_table` keeps in ``shell_schema.json``."""
    return tool_table(ShellOptions(root=Path("/")))._compiled_schemas("run")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m saucer.tools.shell",
        description="saucer's shell MCP server over stdio: one tool, `run`, that runs a command line.",
        epilog="Rules are globs (`rm *`) or regular expressions with the prefix `re:`. "
        "Environment variables: SAUCER_SHELL_ROOT, SAUCER_SHELL_ALLOW and SAUCER_SHELL_DENY "
        "(one pattern per line), SAUCER_SHELL_MAX_OUTPUT, SAUCER_SHELL_TIMEOUT, SAUCER_SHELL_MAX_TIMEOUT, "
        "SAUCER_SHELL_SANDBOX.",
    )
    parser.add_argument(
        "--root",
        type=existing_dir,
        default=env_default("SAUCER_SHELL_ROOT", "."),
        help="workspace root: default working directory, cwd must stay inside it (default: .)",
    )
    parser.add_argument(
        "--allow",
        action="append",
        default=None,
        metavar="PATTERN",
        help="only run commands whose every segment matches one of these rules (repeatable)",
    )
    parser.add_argument(
        "--deny",
        action="append",
        default=None,
        metavar="PATTERN",
        help="refuse commands matching this rule (repeatable)",
    )
    parser.add_argument(
        "--max-output",
        type=positive_int,
        default=env_default("SAUCER_SHELL_MAX_OUTPUT", str(DEFAULT_MAX_OUTPUT)),
        metavar="BYTES",
        help=f"cap on each of stdout and stderr (default {DEFAULT_MAX_OUTPUT})",
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=env_default("SAUCER_SHELL_TIMEOUT", str(DEFAULT_TIMEOUT)),
        metavar="S",
        help=f"default seconds before a command is killed (default {DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument(
        "--max-timeout",
        type=positive_float,
        default=env_default("SAUCER_SHELL_MAX_TIMEOUT", str(DEFAULT_MAX_TIMEOUT)),
        metavar="S",
        help=f"largest timeout a call may ask for (default {DEFAULT_MAX_TIMEOUT:g})",
    )
    parser.add_argument("--shell", default="/bin/sh", help="shell used as `SHELL -c COMMAND` (default /bin/sh)")
    add_arguments(parser)
    return parser


def parse_options(argv: Sequence[str] | None = None) -> ShellOptions:
    """Options from ``argv`` and ``SAUCER_SHELL_*`` variables; a bad rule exits with a usage error."""
    parser = _parser()
    args = parse(parser, argv)
    try:
        return ShellOptions.create(
            args.root,
            allow=args.allow if args.allow is not None else env_list("SAUCER_SHELL_ALLOW"),
            deny=args.deny if args.deny is not None else env_list("SAUCER_SHELL_DENY"),
            max_output=args.max_output,
            timeout=args.timeout,
            max_timeout=args.max_timeout,
            shell=args.shell,
            sandbox=args.sandbox,
            write=args.write,
            read=args.read or ("/",),
            network=args.network,
        )
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the shell tool over stdio until the client closes the connection."""
    options = parse_options(argv)
    return serve_stdio(lambda: build_server(options), "saucer-shell")


if __name__ == "__main__":
    sys.exit(main())
