"""The "People in the loop" examples (docs/how-to/people-in-the-loop.md) run as written (the API's curl
block runs in tests/service/test_service_approvals.py, against a real server)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.cli import cli_env

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "people-in-the-loop.md"


def people_section() -> str:
    """The text of the "People in the loop" page."""
    return PAGE.read_text(encoding="utf-8")


def blocks(language: str) -> list[str]:
    """The page's fenced blocks of ``language`` (whatever options follow it in the fence), in order."""
    return re.findall(rf"```{language}(?: [^\n]*)?\n(.*?)```", people_section(), re.S)


def _bash(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = cli_env({"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})
    return subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180
    )


def test_the_readme_people_in_the_loop_examples_run(tmp_path: Path) -> None:
    [plan] = blocks("json")
    (tmp_path / "cleanup.json").write_text(plan)
    assert json.loads(plan)["task"] == "cleanup"
    variables, approvals, _questions, _api = blocks("bash")  # questions: tests/agents/test_ask_user_pending.py

    for _ in range(2):  # as written, and again: the examples start over
        (tmp_path / "junk.txt").write_text("junk")
        done = _bash(variables, tmp_path)
        assert 'note = "checked by hand"\nreviewed = true' in done.stdout, done.stdout + done.stderr
        assert '{\n  "reviewed": true\n}' in done.stdout
        assert "tidy: finished" in done.stdout and "user:alice" in done.stdout, done.stdout + done.stderr
        assert not (tmp_path / "junk.txt").exists()

        (tmp_path / "junk.txt").write_text("junk")
        done = _bash(approvals, tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "cleanup 6 pending · run shell.run" in done.stdout, done.stdout + done.stderr
        assert "approval 6 of session cleanup approved by user:alice" in done.stdout
        assert "session cleanup: finished" in done.stdout
        assert "cleanup 6 approved by user:alice · run shell.run" in done.stdout
        assert not (tmp_path / "junk.txt").exists()
