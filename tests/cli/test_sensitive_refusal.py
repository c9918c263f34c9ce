"""End to end: a sensitive command hidden in a compound is refused without a terminal unless --yes.

(Every other form is checked by the rules' table test, which also runs each one through a shell.)
"""

from __future__ import annotations

import json
from pathlib import Path


def test_run_plan_without_a_terminal_refuses_hidden_rm_unless_yes(run_cli, tmp_path: Path) -> None:
    plan = {
        "task": "tidy",
        "steps": [
            {
                "subtask": "remove v",
                "commands": [{"tool_name": "shell.run", "parameters": {"command": "if [ -f v ]; then rm -f v; fi"}}],
            }
        ],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "v").write_text("keep me\n")

    # --approval-timeout 0: refused at once instead of waiting as a pending approval (tests/cli/test_approvals.py).
    refused = run_cli("run", "--plan", "plan.json", "--workspace", "ws", "--approval-timeout", "0")
    assert refused.returncode != 0, refused.stdout + refused.stderr
    assert "refused" in refused.stdout + refused.stderr and "rm *" in refused.stdout + refused.stderr
    assert (workspace / "v").read_text() == "keep me\n"

    approved = run_cli("run", "--plan", "plan.json", "--workspace", "ws", "--yes")
    assert approved.returncode == 0, approved.stdout + approved.stderr
    assert not (workspace / "v").exists()
