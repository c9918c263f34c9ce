"""``make test``'s closing summary (issue 33, item 7): skips grouped by what enables them, each group
with its one command, the duration, and no line per skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_skips_are_grouped_with_the_command_that_enables_them() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("SAUCER_TEST_POSTGRES_URL", "CI", "PYTEST_ADDOPTS")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/store/test_summary_migration.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "what ran, what was skipped" in out
    [counts] = [line for line in out.splitlines() if " skipped in " in line and " min (expected: " in line]
    assert " passed, 0 failed or errored, " in counts
    assert "skipped: needs PostgreSQL" in out
    assert "enable with: export SAUCER_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:5432/test" in out
    assert "SKIPPED [" not in out  # no -ra line per skip


def test_make_test_takes_args() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "$(ARGS)" in makefile and "make test ARGS=" in (ROOT / "docs" / "contributing.md").read_text()
