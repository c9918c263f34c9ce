"""Helpers to run the CLI as a subprocess in a fresh directory, as a user would."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.support.cli import SAUCER, cli_env


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
