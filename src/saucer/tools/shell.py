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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, Field

from saucer.tools import native
from saucer.tools._child import AsyncChild, start_child
from saucer.tools._child import CappedBuffer as _CappedBuffer
from saucer.tools._child import to_the_end as _to_the_end
from saucer.tools._common import (
    SandboxError,
    built_once,
    env_default,
    env_list,
    existing_dir,
    make_mcp_server,
    offload,
    one_line,
    parse,
    positive_float,
    positive_int,
    relative_to_root,
    resolve_in_root,
    serve_stdio,
)
from saucer.tools._orphans import forget_group, watch_group
from saucer.tools.confine import ConfinementError, Confiner, Policy, add_arguments
from saucer.tools.native import NativeServer, ToolError, ToolOutcome, ToolSpec
from saucer.tools.rules import (
    CommandRule,
    SensitivityRules,
    compile_rules,
    is_sensitive,
    refusal_reason,
    sensitive_reason,
)

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
    "default_environment",
    "parse_options",
    "main",
    "is_sensitive",
    "sensitive_reason",
    "SensitivityRules",
]

DEFAULT_MAX_OUTPUT = 64 * 1024
DEFAULT_TIMEOUT = 60.0
DEFAULT_MAX_TIMEOUT = 600.0
#: Exit codes that count as success unless a call says otherwise.
DEFAULT_EXPECT_EXIT = (0,)
# Time a timed-out process group gets between SIGTERM and SIGKILL.
_KILL_GRACE = 1.0
# Time to collect the last output once the group is dead; a daemon that left
# the group may hold the pipes open forever, so the wait is bounded.
_DRAIN_GRACE = 1.0


@dataclass(frozen=True)
class ShellOptions:
    """How the shell server runs commands."""

    root: Path
    allow: tuple[CommandRule, ...] = ()
    deny: tuple[CommandRule, ...] = ()
    max_output: int = DEFAULT_MAX_OUTPUT
    timeout: float = DEFAULT_TIMEOUT
    max_timeout: float = DEFAULT_MAX_TIMEOUT
    shell: str = "/bin/sh"
    #: The environment commands start from (plus a call's ``env``); None: this process's environment.
    env: Mapping[str, str] | None = field(default=None, hash=False)
    #: How commands are confined: the root and ``policy.write`` are writable, the rest as ``policy`` says.
    policy: Policy = Policy()

    @classmethod
    def create(
        cls,
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
        write: Sequence[str | os.PathLike[str]] = (),
        read: Sequence[str | os.PathLike[str]] = ("/",),
        network: bool | Sequence[int] = True,
    ) -> ShellOptions:
        """Options with ``root`` resolved, the rules compiled and the confinement policy built
        (writable: ``root`` and ``write``; see :class:`saucer.tools.confine.Policy`)."""
        real_root = Path(os.path.realpath(root))
        return cls(
            root=real_root,
            allow=compile_rules(allow),
            deny=compile_rules(deny),
            max_output=max_output,
            timeout=timeout,
            max_timeout=max(max_timeout, timeout),
            shell=shell,
            env=None if env is None else dict(env),
            policy=Policy.create(sandbox, (real_root, *write), read, network),
        )


class ShellResult(BaseModel):
    """What a finished command produced."""

    exit_code: int = Field(description="The exit status; negative when a signal ended the process.")
    stdout: str = Field(description="Standard output (UTF-8, undecodable bytes replaced), at most max_output bytes.")
    stderr: str = Field(description="Standard error, capped like stdout.")
    stdout_truncated: bool = Field(description="True when stdout was longer than the cap and was cut.")
    stderr_truncated: bool = Field(description="True when stderr was longer than the cap and was cut.")
    stdout_bytes: int = Field(description="Total bytes the command wrote to stdout.")
    stderr_bytes: int = Field(description="Total bytes the command wrote to stderr.")
    duration: float = Field(description="Seconds the command ran.")
    cwd: str = Field(description="Working directory, relative to the sandbox root.")
    note: str | None = Field(None, description="Anything unusual about the run, e.g. stopped background jobs.")


def _kill_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def _leader_exit(proc: AsyncChild) -> None:
    """Wait until the shell itself has exited (not for its output: a background child may hold it open)."""
    await proc.wait()


async def _stop_group(proc: AsyncChild, readers: list[asyncio.Task[None]]) -> None:
    """Terminate the command's whole process group: SIGTERM, a grace period, SIGKILL."""
    _kill_group(proc.pid, signal.SIGTERM)
    # Gone means: the shell has exited and nothing holds its output pipes any more.
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(_KILL_GRACE):
            await _leader_exit(proc)
            await asyncio.wait(readers)
    # Children may ignore SIGTERM; the group id outlives its leader, so this reaches them.
    _kill_group(proc.pid, signal.SIGKILL)


async def _clean_up(proc: AsyncChild, readers: list[asyncio.Task[None]], *, stop: bool) -> None:
    """Stop the group when ``stop``, collect its output readers, reap the shell and close its transport."""
    if stop:
        await _stop_group(proc, readers)
    if not all(r.done() for r in readers):
        await asyncio.wait(readers, timeout=_DRAIN_GRACE)
    for reader in readers:
        if not reader.done():
            reader.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), _DRAIN_GRACE)
    proc.close()
    forget_group(proc.pid)


def _format_partial(name: str, buffer: _CappedBuffer, limit: int = 2000) -> str:
    text = buffer.text()
    if not text:
        return ""
    shown = text[-limit:]
    return f"\n--- {name} (last {len(shown)} characters) ---\n{shown}"


def _prepare(
    command: str, options: ShellOptions, timeout: float | None, cwd: str | None, env: dict[str, str] | None
) -> tuple[float, Path, dict[str, str], str]:
    """The time limit, working directory, environment and shell of a command that may run; ToolError when not."""
    if not command.strip():
        raise ToolError("command is empty")
    try:
        confiner(options).check()
    except ConfinementError as exc:
        raise ToolError(str(exc)) from None
    reason = refusal_reason(command, options.allow, options.deny)
    if reason is not None:
        raise ToolError(reason)
    limit = options.timeout if timeout is None else timeout
    if limit <= 0:
        raise ToolError(f"timeout must be > 0 seconds, got {limit}")
    limit = min(limit, options.max_timeout)
    try:
        workdir = resolve_in_root(options.root, cwd or ".")
    except SandboxError as exc:
        raise ToolError(f"cwd refused: {exc}") from exc
    if not workdir.is_dir():
        raise ToolError(f"cwd {cwd!r} is not a directory")
    child_env = dict(os.environ if options.env is None else options.env)
    if env:
        bad = [k for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise ToolError(f"env values must be strings (bad keys: {bad})")
        child_env.update(env)
    child_env = confiner(options).environment(child_env)
    # Found as the operating system would find it (the child's PATH), so a missing shell is an error here.
    shell = shutil.which(options.shell, path=os.pathsep.join(os.get_exec_path(child_env)))
    if shell is None:
        raise ToolError(f"could not start {options.shell}: not found or not executable")
    return limit, workdir, child_env, shell


@functools.lru_cache(maxsize=64)
def confiner(options: ShellOptions) -> Confiner:
    """The :class:`Confiner` of ``options`` (one private temporary folder per options while in use)."""
    policy = options.policy
    if str(options.root) not in policy.write:  # options built without create(): the root is writable still
        policy = dataclasses.replace(policy, write=(str(options.root), *policy.write))
    return Confiner(policy)


# Runs as ``/bin/sh -c _GATE SHELL COMMAND``: wait for the host's newline (end of file: the host died
# before it announced the group, so never start), then become ``SHELL -c COMMAND`` with no input.
_GATE = 'IFS= read -r _ || exit 125; exec "$0" -c "$1" </dev/null'


async def run_command(
    command: str,
    options: ShellOptions,
    *,
    timeout: float | None = None,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
) -> ShellResult:
    """Run ``command`` under ``options``; raise :class:`ToolError` when it is refused or times out.

    The checks before the start (parsing the line against the rules, resolving
    ``cwd``) run in a worker thread: a hostile line costs that thread, never
    the event loop of the server, which may be its host's own loop.
    """
    limit, workdir, child_env, shell = await offload(_prepare, command, options, timeout, cwd, env)
    started = time.monotonic()
    # The command waits at a gate until its group is announced to the watchdog: a host killed
    # between the start and the announcement would otherwise leave it running unwatched.
    gate_read, gate_write = os.pipe()
    try:
        proc = await start_child(
            confiner(options).start(
                ["/bin/sh", "-c", _GATE, shell, command],
                stdin=gate_read,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                env=child_env,
                start_new_session=True,  # its own process group, so a timeout kills the children too
            )
        )
    except BaseException as exc:  # cancelled too: a started child must see end of file, never wait on
        os.close(gate_write)
        if isinstance(exc, (OSError, ConfinementError)):
            raise ToolError(f"could not start {options.shell}: {exc}") from exc
        raise
    finally:
        os.close(gate_read)  # only now: the thread that started the command is done with it
    try:
        watch_group(proc.pid)  # stopped even if this process is killed outright (see saucer.tools._orphans)
        os.write(gate_write, b"\n")
    finally:
        os.close(gate_write)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = _CappedBuffer(options.max_output), _CappedBuffer(options.max_output)
    readers = [asyncio.create_task(out.drain(proc.stdout)), asyncio.create_task(err.drain(proc.stderr))]
    timed_out = held_open = False
    try:
        async with asyncio.timeout(limit):
            await _leader_exit(proc)
            _, pending = await asyncio.wait(readers, timeout=_DRAIN_GRACE)
            held_open = bool(pending)
    except TimeoutError:
        timed_out = True
    finally:
        # Timed out, cancelled by the client, or background children holding the
        # output open: never leave the group running behind the call.
        await _to_the_end(_clean_up(proc, readers, stop=proc.returncode is None or held_open or timed_out))
    duration = time.monotonic() - started
    if timed_out:
        raise ToolError(
            f"command timed out after {limit:g} s; its process group was killed"
            + _format_partial("stdout", out)
            + _format_partial("stderr", err)
        )
    return ShellResult(
        exit_code=proc.returncode if proc.returncode is not None else -1,
        stdout=out.text(),
        stderr=err.text(),
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
        stdout_bytes=out.total,
        stderr_bytes=err.total,
        duration=round(duration, 4),
        cwd=relative_to_root(options.root, workdir),
        note=(
            "background processes kept stdout/stderr open after the command exited; they were stopped "
            "(redirect a background job's output, e.g. `job > job.log 2>&1 &`, to keep it running)"
            if held_open
            else None
        ),
    )


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


def _describe(options: ShellOptions) -> str:
    rules = []
    if options.allow:
        rules.append("Only commands matching these rules run: " + ", ".join(r.pattern for r in options.allow) + ".")
    if options.deny:
        rules.append("Commands matching these rules are refused: " + ", ".join(r.pattern for r in options.deny) + ".")
    return (
        "Run a shell command line with /bin/sh -c on this Linux machine and return its exit code, "
        "standard output and standard error. "
        f"The working directory defaults to the workspace root ({options.root}); `cwd` is relative to it and "
        "must stay inside it. Standard input is empty, so interactive programs will not wait for input. "
        f"Each of stdout and stderr is capped at {options.max_output} bytes (the result says when it was "
        f"truncated); prefer commands with short output (e.g. pipe through head or grep). "
        f"The command is killed with its child processes after `timeout` seconds (default {options.timeout:g}, "
        f"at most {options.max_timeout:g}). An exit code outside `expect_exit` (default [0]) makes the call fail; "
        "its exit code, stdout and stderr are returned either way (e.g. `grep` exits 1 when nothing matches: "
        "pass expect_exit [0, 1] when that is fine). "
        "A background job must redirect its output (`job > job.log 2>&1 &`), otherwise it is stopped "
        "when the command exits. " + " ".join(rules)
    ).strip()


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
        title="Run a shell command",
        description=_describe(options),
        hints={"title": "Run a shell command", "destructive": True, "open_world": True},
    )
    return NativeServer(
        "saucer-shell",
        f"Runs shell commands on Linux inside the workspace {options.root}.",
        [run_tool],
        schema_sources=(__file__, native.__file__),
    )


def build_server(options: ShellOptions) -> MCPServer:
    """The shell MCP server for ``options``: :func:`tool_table` registered on an MCPServer (imports the MCP SDK)."""
    return make_mcp_server(tool_table(options))


#: The variables a stdio MCP server inherits (the MCP SDK's DEFAULT_INHERITED_ENV_VARS on POSIX).
INHERITED_ENV_VARS = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")


def default_environment() -> dict[str, str]:
    """The environment a stdio server's commands get: the inherited variables of this process that are set.

    The same as the MCP SDK's ``get_default_environment`` on POSIX (a value
    starting with ``()``, an exported shell function, is left out), without
    importing the SDK; a test keeps the two equal.
    """
    return {
        key: value
        for key in INHERITED_ENV_VARS
        if (value := os.environ.get(key)) is not None and not value.startswith("()")
    }


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
    if env is None:
        env = default_environment()
        # A stdio server is a Python started without any LC_* or LANG: it coerces the C locale to
        # C.UTF-8 (PEP 538) and its commands inherit that. Give in-process commands the same.
        env.setdefault("LC_CTYPE", "C.UTF-8")
    if not os.path.isdir(root):
        raise ValueError(f"shell root {os.fspath(root)!r} is not a directory")
    options = ShellOptions.create(
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
    given = {
        "root": str(options.root),
        "allow": list(allow),
        "deny": list(deny),
        "max_output": max_output,
        "timeout": timeout,
        "max_timeout": max_timeout,
        "shell": shell,
        "env": env,
        "policy": options.policy,
    }
    return built_once("shell", given, lambda: tool_table(options))


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
