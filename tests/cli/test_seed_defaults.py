"""The seed's defaults through the real CLI: a default that cannot apply is said once on stderr, however many
sessions meet it, and each session's record (saucer show) says what was skipped and why."""

from __future__ import annotations

import json
from pathlib import Path


def _plan(name: str) -> dict[str, object]:
    return {
        "task": name,
        "steps": [
            {
                "subtask": "note",
                "commands": [{"tool_name": "files.write", "parameters": {"path": f"{name}.txt", "content": "x"}}],
            }
        ],
    }


def test_a_default_without_a_desktop_is_said_once_and_recorded(run_cli, tmp_path: Path) -> None:
    (tmp_path / "plans").mkdir()
    for name in ("one", "two"):
        (tmp_path / "plans" / f"{name}.json").write_text(json.dumps(_plan(name)))
    proc = run_cli("run", "--plan", "plans", "--workspace", "ws", env={"DISPLAY": ""})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = [line for line in proc.stderr.splitlines() if "save_ui_tree is on but skipped" in line]
    assert len(said) == 1 and "no desktop to read" in said[0], proc.stderr
    shown = run_cli("show", "last", check=True).stdout
    assert "(skipped: save_ui_tree)" in shown
    events = json.loads(run_cli("show", "last", "--json", check=True).stdout)["events"]
    [end] = [e for e in events if e["kind"] == "session_end"]
    assert end["skipped"]["save_ui_tree"].startswith("no desktop to read")
    evaluated = [e for e in events if e["kind"] == "evaluation"]
    assert [e["scope"] for e in evaluated] == ["session"]  # eva_session is on by default, with no model
