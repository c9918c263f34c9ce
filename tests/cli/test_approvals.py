"""Pending approvals from the command line: ``saucer run`` without a terminal waits, another process decides.

Real processes: the run is the subject (it must wait without a terminal and
go on when ``saucer approve``/``saucer refuse`` or the timeout decides).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.support.cli import SAUCER, cli_env

from saucer.store import open_store

RM_PLAN = {
    "task": "cleanup",
    "steps": [
        {"subtask": "look", "commands": [{"tool_name": "shell.run", "parameters": {"command": "ls"}}]},
        {
            "subtask": "remove junk",
            "commands": [{"tool_name": "shell.run", "parameters": {"command": "rm -f junk.txt"}}],
        },
    ],
}


def _saucer(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SAUCER, *args],
        cwd=tmp_path,
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _start(tmp_path: Path, session_id: str, *extra: str) -> subprocess.Popen[str]:
    (tmp_path / "plan.json").write_text(json.dumps(RM_PLAN))
    (tmp_path / "ws").mkdir(exist_ok=True)
    (tmp_path / "ws" / "junk.txt").write_text("junk")
    return subprocess.Popen(
        [*SAUCER, "run", "--plan", "plan.json", "--workspace", "ws", "--session-id", session_id, "--no-input", *extra],
        cwd=tmp_path,
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _pending(tmp_path: Path, run: subprocess.Popen[str], timeout: float = 40) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert run.poll() is None, "the run ended without waiting for an approval: " + run.communicate()[0]
        listed = _saucer(tmp_path, "approvals", "--json")
        if listed.returncode == 0 and json.loads(listed.stdout):
            return json.loads(listed.stdout)[0]
        time.sleep(0.3)
    raise AssertionError("no pending approval appeared")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _finish(run: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, errors = run.communicate(timeout=60)
    finally:
        run.kill()
    return run.returncode, out, errors


def test_a_waiting_step_runs_once_approved_from_another_process(tmp_path: Path) -> None:
    # Started before the run, in a directory without a store yet: --wait waits for the store, then the approval.
    watcher = subprocess.Popen(
        [*SAUCER, "approvals", "--wait", "50", "--json"],
        cwd=tmp_path,
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run = _start(tmp_path, "cli-ok")
    try:
        seen, problems = watcher.communicate(timeout=60)
        assert watcher.returncode == 0, problems
        approval = json.loads(seen)[0]
        assert approval == _pending(tmp_path, run)
        assert approval["session_id"] == "cli-ok" and approval["status"] == "pending"
        assert approval["action"] == "run shell.run" and "matches sensitive pattern 'rm *'" in approval["reason"]
        assert (tmp_path / "ws" / "junk.txt").exists()
        number = str(approval["number"])
        table = _saucer(tmp_path, "approvals", "cli-ok").stdout
        assert f"cli-ok {number} pending · run shell.run" in table and f"approve cli-ok {number}" in table

        wrong = _saucer(tmp_path, "approve", "cli-ok", "999")
        assert wrong.returncode == 2 and wrong.stderr.strip() == "error: session 'cli-ok' has no approval 999"
        done = _saucer(tmp_path, "approve", "cli-ok", number, "--author", "user:alice")
        assert (
            done.returncode == 0
            and done.stdout.strip() == f"approval {number} of session cli-ok approved by user:alice"
        )
        twice = _saucer(tmp_path, "refuse", "cli-ok", number)
        assert twice.returncode == 2
        assert (
            twice.stderr.strip() == f"error: approval {number} of session 'cli-ok' was already approved by user:alice"
        )
    finally:
        code, out, errors = _finish(run)
    assert code == 0, out + errors
    assert "waiting for approval" in errors and f"saucer approve cli-ok {number}" in errors  # told how, on stderr
    assert not (tmp_path / "ws" / "junk.txt").exists()
    with open_store(f"sqlite:///{tmp_path}/.saucer/saucer.db") as store:
        decisions = [
            (e.author, e.meta["approval"]) for e in store.read("cli-ok") if e.meta.get("kind") == "approval_decision"
        ]
    assert decisions == [("user:alice", {"number": int(number), "status": "approved"})]
    assert json.loads(_saucer(tmp_path, "approvals", "--json").stdout) == []  # nothing pending any more
    shown = _saucer(tmp_path, "show", "cli-ok").stdout  # the timeline says who allowed what, in its round
    assert f"v{number} approval {number} asked: run shell.run" in shown
    assert f"approval {number} approved by user:alice\n" in shown


def test_a_refusal_from_another_process_is_the_failed_result_with_its_reason(tmp_path: Path) -> None:
    run = _start(tmp_path, "cli-no", "--participant", "user:bob")
    try:
        number = str(_pending(tmp_path, run)["number"])
        # Waiting does not spin: the run follows its log at a modest pace (CPU seconds over 3 s of waiting).
        before = _cpu_seconds(run.pid)
        time.sleep(3)
        assert _cpu_seconds(run.pid) - before < 0.5
        # The session names its participants: anyone else's decision is refused, and nothing is written.
        outsider = _saucer(tmp_path, "approve", "cli-no", number, "--author", "user:mallory")
        assert outsider.returncode == 2 and outsider.stderr.strip() == (
            "error: 'user:mallory' is not a participant of session 'cli-no', so nothing was written "
            "(a participant can add it: Context.add_participants)"
        )
        assert json.loads(_saucer(tmp_path, "approvals", "cli-no", "--json").stdout)[0]["status"] == "pending"
        done = _saucer(tmp_path, "refuse", "cli-no", number, "--reason", "keep it", "--author", "user:bob")
        assert done.returncode == 0, done.stderr
    finally:
        code, out, errors = _finish(run)
    assert code == 1, out + errors
    assert f"refused by user:bob (approval {number} of session cli-no): keep it" in out
    assert (tmp_path / "ws" / "junk.txt").exists()
    later = _saucer(tmp_path, "approve", "cli-no", number)
    assert later.returncode == 2 and "already refused by user:bob" in later.stderr


def test_an_unanswered_approval_is_refused_by_timeout(tmp_path: Path) -> None:
    run = _start(tmp_path, "cli-late", "--approval-timeout", "1")
    code, out, errors = _finish(run)
    assert code == 1, out + errors
    assert "refused by timeout: nobody decided on approval" in out and "within 1 s" in out
    assert (tmp_path / "ws" / "junk.txt").exists()
    [approval] = json.loads(_saucer(tmp_path, "approvals", "cli-late", "--json").stdout)
    assert approval["status"] == "timed_out" and approval["decided_by"] == "system"
