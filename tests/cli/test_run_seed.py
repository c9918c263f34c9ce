"""``saucer run --var KEY=JSON`` and ``--participant NAME`` (issue 26): what a session starts with."""

from __future__ import annotations

import getpass
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

PLAN = {
    "task": "seeded",
    "vars": {"phase": "draft", "retries": 0},
    "participants": ["human:reviewer"],
    "steps": [{"subtask": "one", "commands": [{"tool_name": "shell.run", "parameters": {"command": "true"}}]}],
}


def test_run_starts_the_session_with_vars_and_participants(
    tmp_path: Path, run_cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    (tmp_path / "plan.json").write_text(json.dumps(PLAN), encoding="utf-8")
    proc = run_cli(
        "run",
        "--plan",
        "plan.json",
        "--session-id",
        "seeded",
        "--yes",
        "--var",
        "retries=3",
        "--var",
        'owner={"name": "ana"}',
        "--var",
        'note="a=b"',
        "--participant",
        "human:bob",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state = run_cli("state", "seeded", "--json", check=True)
    shown = json.loads(state.stdout)
    vars_ = shown.get("_vars") or shown.get("vars")
    assert vars_ == {"phase": "draft", "retries": 3, "owner": {"name": "ana"}, "note": "a=b"}

    from saucer.context import Context
    from saucer.store import NotParticipantError, open_store

    with open_store(f"sqlite:///{tmp_path}/.saucer/saucer.db") as store:
        assert store.session_info("seeded").participants == {"human:reviewer", "human:bob", f"user:{getpass.getuser()}"}
        eve = Context.open(store, "seeded", author="human:eve", create=False)
        eve.update_vars(set={"x": 1})
        with pytest.raises(NotParticipantError):
            eve.commit()


def test_a_bad_var_is_one_line_and_runs_nothing(
    tmp_path: Path, run_cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    (tmp_path / "plan.json").write_text(json.dumps(PLAN), encoding="utf-8")
    for bad, says in (
        ("retries=three", "--var retries: 'three' is not JSON"),
        ("noequals", "--var 'noequals': write KEY=JSON"),
    ):
        proc = run_cli("run", "--plan", "plan.json", "--yes", "--var", bad)
        assert proc.returncode != 0
        assert proc.stderr.strip().count("\n") == 0 and says in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / ".saucer" / "saucer.db").exists()


def test_the_readme_command_runs_as_printed(
    tmp_path: Path, run_cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    import shlex

    section = (Path(__file__).resolve().parents[2] / "docs" / "how-to" / "routing.md").read_text(encoding="utf-8")
    [line] = [ln for ln in section.splitlines() if ln.startswith("saucer run ")]
    (tmp_path / "plan.json").write_text(json.dumps(PLAN), encoding="utf-8")
    proc = run_cli(*shlex.split(line)[1:])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shown = json.loads(run_cli("state", "review-1", "--json", check=True).stdout)
    assert (shown.get("_vars") or shown.get("vars")) == {"phase": "draft", "retries": 0}
