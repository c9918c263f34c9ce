"""Fixtures running the CLI: as a subprocess in a fresh directory, as a user would (``run_cli``), or the same
commands called in this process (``cli_here``) when the process is not what a test is about."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.support.cli import SAUCER, CliResult, cli_env, saucer_here


@pytest.fixture
def run_cli(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``saucer ARGS`` in a fresh directory with no standard input (``env``: extra variables)."""

    def run(
        *args: str,
        timeout: float = 60,
        cwd: Path | None = None,
        check: bool | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [*SAUCER, *args],
            cwd=cwd or tmp_path,
            env=cli_env(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check is True:
            assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    return run


@pytest.fixture
def cli_here(tmp_path: Path) -> Callable[..., CliResult]:
    """:func:`run_cli` with the command called in this process (:func:`tests.support.cli.saucer_here`): for a
    test about what a command reads, stores and prints, where starting Python again only costs time."""

    def run(
        *args: str, cwd: Path | None = None, check: bool | None = None, env: dict[str, str] | None = None
    ) -> CliResult:
        result = saucer_here(args, cwd=cwd or tmp_path, env=env)
        if check is True:
            assert result.returncode == 0, result.stdout + result.stderr
        return result

    return run
