"""Naming sessions: whole ids at any width, unique prefixes and ``last`` everywhere, ``run --session-id``,
``history --key`` checks, and forks with their own log folder and workspace (real processes)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.support.cli import cli_env

from saucer.context import Context

PLAN = {
    "task": "names",
    "steps": [
        {
            "subtask": "first",
            "commands": [{"tool_name": "files.write", "parameters": {"path": "a.txt", "content": "A"}}],
        },
        {
            "subtask": "second",
            "commands": [{"tool_name": "files.write", "parameters": {"path": "b.txt", "content": "B"}}],
        },
    ],
}
LONG_ID = "a-very-long-session-id-that-does-not-fit-in-forty-columns-0123456789"


def test_prefixes_last_and_session_id_work_in_every_command(cli_here, tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    cli_here("run", "--plan", "plan.json", "-w", "ws", "--session-id", "alpha-one", check=True)
    cli_here("run", "--plan", "plan.json", "-w", "ws", "--session-id", "alpha-two", check=True)
    taken = cli_here("run", "--plan", "plan.json", "-w", "ws", "--session-id", "alpha-one")
    assert taken.returncode == 2 and "session 'alpha-one' already exists; continue it with: " in taken.stderr
    (tmp_path / "folder").mkdir()
    folder = cli_here("run", "--plan", "folder", "--session-id", "x")
    assert folder.returncode == 2 and "--session-id names one session" in folder.stderr
    ambiguous = cli_here("show", "alpha")
    assert (
        ambiguous.returncode == 2
        and "'alpha' is the start of several session ids (alpha-two, alpha-one)" in ambiguous.stderr
    )

    assert json.loads(cli_here("state", "last", "--json", check=True).stdout)["session_id"] == "alpha-two"
    for args in (
        ("history", "alpha-o"),
        ("diff", "alpha-o", "1", "3"),
        ("export", "last"),
        ("store", "prune", "alpha-t", "--keep-last", "50"),
    ):
        proc = cli_here(*args)
        assert proc.returncode == 0, (args, proc.stderr)
    assert json.loads(cli_here("show", "alpha-o", "--json", check=True).stdout)["session"]["id"] == "alpha-one"
    assert "session alpha-one: finished" in cli_here("resume", "alpha-o", check=True).stdout

    request = cli_here("history", "alpha-o", "--key", "request")
    assert request.returncode == 2 and "did you mean REQUEST?" in request.stderr
    assert "REQUEST = first" in cli_here("history", "alpha-o", "--key", "REQUEST", check=True).stdout

    # A fork, named by prefix, with its own workspace and its own log folder.
    steps = [
        e for e in json.loads(cli_here("show", "alpha-o", "--json", check=True).stdout)["events"] if e["kind"] == "step"
    ]
    forked = cli_here(
        "fork", "alpha-o", "--at", str(steps[0]["version"]), "--as", "branch", "--workspace", "ws2", check=True
    )
    assert "its tools act in:" in forked.stdout
    parent_md = next((tmp_path / "logs" / "names").glob("alpha-one*/output.md"))
    before = parent_md.read_text()
    resumed = cli_here("resume", "last", check=True)  # the fork is now the most recently updated session
    assert "session branch: finished" in resumed.stdout
    assert (tmp_path / "ws2" / "b.txt").read_text() == "B" and not (tmp_path / "ws2" / "a.txt").exists()
    assert parent_md.read_text() == before  # the parent's logs are untouched
    assert (tmp_path / "logs" / "names" / "branch" / "output.md").exists()
    cli_here("store", "delete", "bran", "--yes", check=True)
    cli_here("store", "delete", "alpha-t", "--yes", check=True)
    assert [r["id"] for r in json.loads(cli_here("sessions", "--json", check=True).stdout)] == ["alpha-one"]


def test_sessions_prints_whole_ids_in_a_narrow_terminal(tmp_path: Path) -> None:
    import pexpect

    ctx = Context.open(f"sqlite:///{tmp_path}/.saucer/saucer.db", LONG_ID)
    ctx.update_vars(set={"x": 1})
    ctx.commit()
    ctx.close()
    env = cli_env({"TERM": "xterm"})  # a "dumb" terminal is 80 columns to rich, whatever its size
    env.pop("COLUMNS")
    child = pexpect.spawn(
        sys.executable,
        ["-m", "saucer", "sessions"],
        cwd=str(tmp_path),
        env=env,
        encoding="utf-8",
        timeout=30,
        dimensions=(24, 40),
    )
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert LONG_ID in child.before  # not folded, not cut: it can be copied
