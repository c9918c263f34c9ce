"""End to end: a sensitive command hidden in a compound is refused without a terminal unless --yes.

(Every other form is checked by the rules' table test, which also runs each one through a shell.)
"""

from __future__ import annotations

import json
from pathlib import Path


def test_run_plan_without_a_terminal_refuses_hidden_rm_unless_yes(run_cli, tmp_path: Path) -> None:
    plan = {"task": "tidy", "steps": [{"subtask": "remove v", "commands": [
        {"tool_name": "shell.run", "parameters": {"command": "if [ -f v ]; then rm -f v; fi"}}]}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "v").write_text("keep me\n")

    refused = run_cli("run", "--plan", "plan.json", "--workspace", "ws")
    assert refused.returncode != 0, refused.stdout + refused.stderr
    assert "refused" in refused.stdout + refused.stderr and "rm *" in refused.stdout + refused.stderr
    assert (workspace / "v").read_text() == "keep me\n"

    approved = run_cli("run", "--plan", "plan.json", "--workspace", "ws", "--yes")
    assert approved.returncode == 0, approved.stdout + approved.stderr
    assert not (workspace / "v").exists()
