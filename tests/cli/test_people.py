"""``saucer set`` and ``saucer vars``: context variables written by a person, on ended and running sessions."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from tests.support.cli import SAUCER, cli_env

from saucer.context import Context
from saucer.engine.status import stored_status
from saucer.store import open_store

ECHO_PLAN = {
    "task": "t",
    "steps": [
        {"subtask": "one", "commands": [{"tool_name": "shell.run", "parameters": {"command": "echo one"}}]},
        {"subtask": "two", "commands": [{"tool_name": "shell.run", "parameters": {"command": "echo two"}}]},
    ],
}


def _store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/.saucer/saucer.db"


def test_set_and_vars_on_an_ended_session(cli_here, tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(json.dumps(ECHO_PLAN))
    cli_here("run", "--plan", "plan.json", "--session-id", "s1", check=True)
    first = cli_here("set", "s1", "gone=1", check=True).stdout
    at = int(first.split(" v")[1].split(":")[0])
    done = cli_here(
        "set", "s1", "count=3", 'note="hi [b]x[/b]"', 'flags={"ok": true}', "--delete", "gone", "--author", "human:me"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"session s1 v{at + 1}: set count, note, flags; deleted gone (author human:me)"

    shown = cli_here("vars", "s1", check=True)
    assert shown.stdout.splitlines() == ["count = 3", 'flags = {"ok": true}', 'note = "hi [b]x[/b]"']
    assert json.loads(cli_here("vars", "s1", "--json", check=True).stdout) == {
        "count": 3,
        "flags": {"ok": True},
        "note": "hi [b]x[/b]",
    }
    assert json.loads(cli_here("vars", "s1", "--at", str(at), "--json", check=True).stdout) == {"gone": 1}

    # One event, with its author; the session still reads as it ended (finished), not interrupted.
    history = cli_here("history", "s1", "--key", "vars.count", check=True).stdout
    assert "human:me" in history
    listed = json.loads(cli_here("sessions", "--json", check=True).stdout)
    assert [(r["id"], r["status"]) for r in listed] == [("s1", "finished")]
    with open_store(_store(tmp_path)) as store:
        assert stored_status(store, "s1").status == "finished"
    assert "s1: finished" in cli_here("resume", "s1", check=True).stdout


def test_set_and_vars_errors_are_one_line(cli_here, tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(json.dumps(ECHO_PLAN))
    cli_here("run", "--plan", "plan.json", "--session-id", "s1", check=True)
    cases = [
        (
            ("set", "s1", "note=hi"),
            "error: saucer set SESSION note: 'hi' is not JSON (Expecting value at column 1); quote a string: note='\"...\"'",
        ),
        (("set", "s1", "justakey"), "error: saucer set SESSION 'justakey': write KEY=JSON"),
        (("set", "s1"), "error: nothing to write: give KEY=JSON and/or --delete KEY"),
        (("set", "nosuch", "a=1"), "error: no session 'nosuch' in this store."),
        (("set", "s1", "a=1", "--author", " "), "error: --author must not be blank"),
        (("vars", "nosuch"), "error: no session 'nosuch' in this store."),
    ]
    for args, message in cases:
        done = cli_here(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith(message), (args, done.stderr)
    assert json.loads(cli_here("vars", "s1", "--json", check=True).stdout) == {}  # nothing was written


def test_a_set_on_a_stopped_session_is_seen_by_its_resume(run_cli, tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(json.dumps(ECHO_PLAN))
    stopped = run_cli("run", "--plan", "plan.json", "--session-id", "s1", "--max-step", "1")
    assert stopped.returncode == 1 and "s1: stopped" in stopped.stdout, stopped.stdout
    written = run_cli("set", "s1", "reviewed=true", check=True)
    version = int(written.stdout.split(" v")[1].split(":")[0])
    assert json.loads(run_cli("sessions", "--json", check=True).stdout)[0]["status"] == "stopped"
    resumed = run_cli("resume", "s1")
    assert resumed.returncode == 0 and "s1: finished" in resumed.stdout, resumed.stdout

    with open_store(_store(tmp_path)) as store:
        events = list(store.read("s1"))
        resume = next(e for e in events if e.meta.get("kind") == "session_resume")
        step = next(e for e in events if e.meta.get("kind") == "step" and e.version > resume.version)
        assert version < resume.version
        # The resumed run started from the written value: the state its next step committed on holds it.
        assert Context.open(store, "s1", at=step.version, create=False).vars == {"reviewed": True}


def test_set_on_a_running_session_is_written_and_the_run_goes_on(tmp_path: Path) -> None:
    plan = {
        "task": "slow",
        "steps": [
            {"subtask": f"s{i}", "commands": [{"tool_name": "shell.run", "parameters": {"command": "sleep 1"}}]}
            for i in range(3)
        ],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = cli_env()
    run = subprocess.Popen(
        [*SAUCER, "run", "--plan", "plan.json", "--session-id", "live"],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            probe = subprocess.run(
                [*SAUCER, "vars", "live"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
            )
            if probe.returncode == 0:
                break
            time.sleep(0.2)
        written = subprocess.run(
            [*SAUCER, "set", "live", 'seen_by="a person"'],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert written.returncode == 0, written.stderr
        out, errors = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 0, out + errors
    assert "live: finished" in out
    with open_store(_store(tmp_path)) as store:
        assert Context.open(store, "live", create=False, at=store.head("live")).vars == {"seen_by": "a person"}
        assert sum(1 for e in store.read("live") if e.meta.get("kind") == "step") == 3


def test_a_session_with_participants_refuses_a_set_by_anyone_else(run_cli, tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(json.dumps(ECHO_PLAN))
    run_cli("run", "--plan", "plan.json", "--session-id", "p1", "--participant", "user:alice", check=True)
    refused = run_cli("set", "p1", "x=1", "--author", "user:mallory")
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "error: 'user:mallory' is not a participant of session 'p1', so nothing was written "
        "(a participant can add it: Context.add_participants)"
    )
    run_cli("set", "p1", "x=2", "--author", "user:alice", check=True)
    run_cli("set", "p1", "y=3", check=True)  # the user who ran it (user:<login>) always is one
    assert json.loads(run_cli("vars", "p1", "--json", check=True).stdout) == {"x": 2, "y": 3}


def test_the_people_commands_have_help(cli_here) -> None:
    for command in ("set", "vars", "approvals", "approve", "refuse", "answer"):
        proc = cli_here(command, "--help", check=True)
        assert "Usage" in proc.stdout and "--store" in proc.stdout
