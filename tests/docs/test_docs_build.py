"""The documentation site builds with MkDocs in strict mode: a broken link, anchor or reference fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "saucer run" in cli and "--plan" in cli  # generated from the Typer app
    settings = (tmp_path / "site" / "reference" / "settings" / "index.html").read_text(encoding="utf-8")
    assert "SAUCER_SYSTEM__MAX_STEP" in settings  # generated from the settings model
    api = (tmp_path / "site" / "reference" / "python-api" / "index.html").read_text(encoding="utf-8")
    assert "compare_and_set" in api  # mkdocstrings read the Context's docstrings
