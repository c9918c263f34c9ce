"""The shell tool's options and what its listing says about them, without running anything.

:class:`ShellOptions` (the root, the allow/deny rules, the caps, the
confinement policy) and :func:`describe` (the tool's description for those
options) are all a session needs to list the shell's tool: the running of a
command (:mod:`saucer.tools.shell_run`) and the tool around it
(:mod:`saucer.tools.shell`) are imported only when a command runs
(:mod:`saucer.tools.shell_table`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from saucer.tools.confine import Policy
from saucer.tools.rules import CommandRule, compile_rules

__all__ = [
    "DEFAULT_EXPECT_EXIT",
    "DEFAULT_MAX_OUTPUT",
    "DEFAULT_MAX_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "INHERITED_ENV_VARS",
    "RUN_TITLE",
    "RUN_HINTS",
    "SERVER_NAME",
    "ShellOptions",
    "default_environment",
    "describe",
    "instructions",
    "prepare",
]

DEFAULT_MAX_OUTPUT = 64 * 1024
DEFAULT_TIMEOUT = 60.0
DEFAULT_MAX_TIMEOUT = 600.0
#: Exit codes that count as success unless a call says otherwise.
DEFAULT_EXPECT_EXIT = (0,)
#: The server's name and its one tool's title and behaviour hints (as :class:`~saucer.tools.native.ToolSpec` takes them).
SERVER_NAME = "saucer-shell"
RUN_TITLE = "Run a shell command"
RUN_HINTS: dict[str, Any] = {"title": RUN_TITLE, "destructive": True, "open_world": True}
#: The variables a stdio MCP server inherits (the MCP SDK's DEFAULT_INHERITED_ENV_VARS on POSIX).
INHERITED_ENV_VARS = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")


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


def describe(options: ShellOptions) -> str:
    """The description of the ``run`` tool for ``options`` (what a model reads before calling it)."""
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


def instructions(options: ShellOptions) -> str:
    """The server's instructions for ``options``."""
    return f"Runs shell commands on Linux inside the workspace {options.root}."


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


def prepare(
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
) -> tuple[ShellOptions, dict[str, Any]]:
    """The options of an in-process shell (``create_server``'s keywords) and the key its table is shared by.

    ``env`` defaults to the minimal environment a stdio server gets, never the whole environment of the
    host process, which may hold its secrets. A root that is not a directory, a bad rule or a bad
    confinement option is a ValueError.
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
    return options, given
