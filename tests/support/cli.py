"""The CLI as a user runs it: ``python -m saucer`` in a fresh environment (no SAUCER_* settings of the caller's),
or the same commands called in this process (:func:`saucer_here`) when the process is not what a test is about."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SAUCER", "CliResult", "cli_env", "saucer_here"]

SAUCER = [sys.executable, "-m", "saucer"]


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a CLI run: no SAUCER_* settings of the caller's, no colour, 200 columns."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")}
    env["COLUMNS"] = "200"
    env["NO_COLOR"] = "1"
    env.update(extra or {})
    return env


def saucer_here(args: Sequence[str], *, cwd: Path, env: dict[str, str] | None = None) -> CliResult:
    """``saucer ARGS`` called in this process (typer's runner over :data:`saucer.cli.app.app`), in ``cwd``, with
    the caller's SAUCER_* settings removed and ``env`` added, no colour, 200 columns, empty standard input.

    The same commands, options, output and exit codes as the command line, without starting Python again:
    for a test whose subject is what a command does, not the process (its start, its signals, its exit).
    Unexpected exceptions propagate (a bug is a traceback, as from the process).
    """
    from typer.testing import CliRunner

    from saucer.cli.app import app

    unset: dict[str, str | None] = {k: None for k in os.environ if k.startswith("SAUCER_")}
    runner = CliRunner(env={**unset, "COLUMNS": "200", "NO_COLOR": "1", **(env or {})})
    with contextlib.chdir(cwd):
        result = runner.invoke(app, list(args), catch_exceptions=False)
    return CliResult(result.exit_code, result.stdout, result.stderr)


@dataclass(frozen=True)
class CliResult:
    """What a command gave: its exit code and what it wrote (named as on a CompletedProcess)."""

    returncode: int
    stdout: str
    stderr: str
