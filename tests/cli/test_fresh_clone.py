"""`make demo` from a fresh clone, as the README's Quickstart promises."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_make_demo_from_a_fresh_clone(tmp_path: Path) -> None:
    if not (REPO / ".git").exists() or shutil.which("git") is None or shutil.which("make") is None:
        pytest.skip("needs a git checkout, git and make (run from a clone of the repository)")
    clone = tmp_path / "saucer"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAUCER_", "VIRTUAL_ENV"))}
    proc = subprocess.run(
        ["make", "demo"], cwd=clone, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "session demo-" in proc.stdout and "finished" in proc.stdout
    # The demo's suggested commands work as printed from the clone.
    line = next(text.strip() for text in proc.stdout.splitlines() if text.strip().startswith(".venv/bin/saucer show "))
    shown = subprocess.run(line, shell=True, cwd=clone, env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "files.search" in shown.stdout, shown.stderr
