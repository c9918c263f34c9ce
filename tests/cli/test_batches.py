"""Folders of plans: the status lives in the store, two runs never run a plan twice, a re-run says what
it skipped, and a pool asks about experience once (real processes; a pseudo-terminal for the question)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.cli import SAUCER, cli_env


def _folder(root: Path, n: int, name: str = "plans") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    for i in range(n):
        command = f"sleep 0.2; echo p{i} >> ran.log"
        plan = {
            "task": f"p{i}",
            "steps": [{"subtask": "w", "commands": [{"tool_name": "shell.run", "parameters": {"command": command}}]}],
        }
        (folder / f"p{i}.json").write_text(json.dumps(plan))
    return folder


def test_two_runs_over_one_folder_never_run_a_plan_twice(run_cli, tmp_path: Path) -> None:
    _folder(tmp_path, 6)
    args = [*SAUCER, "run", "--plan", "plans", "-w", "ws", "--concurrency", "2"]
    runs = [
        subprocess.Popen(
            args,
            cwd=tmp_path,
            env=cli_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [run.communicate(timeout=180) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    assert sorted((tmp_path / "ws" / "ran.log").read_text().split()) == [f"p{i}" for i in range(6)]  # each plan once
    finished = sum(out.count(" finished ") for out, _ in outputs)
    assert finished >= 6  # between them, every plan finished (the other run reports it skipped)
    rows = json.loads(run_cli("sessions", "--json", check=True).stdout)
    assert len(rows) == 6 and {r["status"] for r in rows} == {"finished"}
    assert not list(tmp_path.rglob("tasks_status.json"))  # the batch's status is in the store
    # Each finished plan was saved as experience: "ask" without a terminal is "auto" for a pool.
    # Each plan keeps its own task ("p0".."p5"), and its logs are under it.
    assert len(list((tmp_path / "logs").glob("p*/*/experience.json"))) == 6

    again = run_cli("run", "--plan", "plans", "-w", "ws", check=True)
    assert "6 plan(s) in plans: 0 to run, 0 to continue, 6 skipped" in again.stdout
    assert again.stdout.count(": already finished (session p") == 6
    # A folder with the same name somewhere else holds other plans.
    _folder(tmp_path / "elsewhere", 1)
    other = run_cli("run", "--plan", "elsewhere/plans", "-w", "ws", check=True)
    assert "1 plan(s) in elsewhere/plans: 1 to run, 0 to continue, 0 skipped" in other.stdout
    assert len(json.loads(run_cli("sessions", "--json", check=True).stdout)) == 7


def test_a_pool_in_a_terminal_asks_about_experience_once(tmp_path: Path) -> None:
    import pexpect

    _folder(tmp_path, 2)
    env = cli_env({"COLUMNS": "160", "TERM": "dumb"})
    child = pexpect.spawn(
        sys.executable,
        ["-m", "saucer", "run", "--plan", "plans", "-w", "ws"],
        cwd=str(tmp_path),
        env=env,
        encoding="utf-8",
        timeout=60,
    )
    child.expect("Save each of the 2 sessions of this batch")
    before = child.before
    child.sendline("y")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert "running session" not in before  # asked before any session started
    assert "Save this session" not in child.before  # and never again, per session
    assert len(list((tmp_path / "logs").glob("p*/*/experience.json"))) == 2  # under each plan's own task
