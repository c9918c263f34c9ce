"""What is shown is what is stored: markup-like text goes through every command byte for byte,
and output to a pipe is never wrapped (real processes; the prompts through a pseudo-terminal)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.support.cli import cli_env

from saucer.context import Context, ContextNames

MARK = "check [todo] items [bold]loud[/bold] :smile:"
TASK = "[b]t[/b]"
LONG = "a long value " + "x" * 150 + " [i]end[/i]"


def _plan(tmp_path: Path) -> None:
    plan = {
        "task": TASK,
        "steps": [
            {
                "subtask": MARK,
                "commands": [{"tool_name": "files.write", "parameters": {"path": "n.md", "content": MARK}}],
            },
            {
                "subtask": "[red]second[/red]",
                "commands": [{"tool_name": "shell.run", "parameters": {"command": "cat n.md"}}],
            },
        ],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))


def _context_session(tmp_path: Path) -> None:
    ctx = Context.open(f"sqlite:///{tmp_path}/.saucer/saucer.db", "ctx", author="agent:[b]writer[/b]")
    ctx.set(ContextNames.REQUEST, MARK)
    ctx.update_vars(set={"note": MARK, "long": LONG, "esc": "clear\x1b[2Jscreen\x07"})
    ctx.commit(meta={"agent": "[b]writer[/b]", "state": "CONTINUE"})
    ctx.update_vars(set={"note": "[/]"})
    ctx.commit()
    ctx.close()


def test_markup_like_text_is_printed_byte_for_byte_by_every_command(cli_here, tmp_path: Path) -> None:
    _plan(tmp_path)
    ran = cli_here("run", "--plan", "plan.json", "-w", "ws", "--session-id", "mk", check=True)
    assert f"round 0: {MARK}" in ran.stdout and "round 1: [red]second[/red]" in ran.stdout
    assert (tmp_path / "ws" / "n.md").read_text() == MARK
    _context_session(tmp_path)

    sessions = cli_here("sessions", check=True).stdout
    assert f"\nmk   {TASK}" in sessions and "\nctx  " in sessions
    assert json.loads(cli_here("sessions", "--json", check=True).stdout)[1]["task"] == TASK
    shown = cli_here("show", "mk", check=True).stdout
    assert f"round 0: {MARK}" in shown and f"subtask: {MARK}" in shown and f"SUBTASK = {MARK}" in shown
    assert '"content":"check [todo] items [bol…' in shown  # parameters are shortened, never interpreted
    timeline = json.loads(cli_here("show", "mk", "--json", check=True).stdout)
    assert timeline["rounds"][0]["request"] == MARK and timeline["session"]["task"] == TASK
    [write] = [e for e in timeline["events"] if e["kind"] == "step"][0]["commands"]
    assert write["parameters"]["content"] == MARK and write["result"]["status"] == "success"
    history = cli_here("history", "mk", "--key", "REQUEST", check=True).stdout
    assert f"REQUEST = {MARK}" in history and "REQUEST = [red]second[/red]" in history
    assert "[b]writer[/b]" in cli_here("history", "ctx", check=True).stdout  # an author, too
    assert f"vars.note = {MARK}" in cli_here("history", "ctx", "--key", "note", check=True).stdout
    state = cli_here("state", "ctx", check=True).stdout
    assert (
        "vars.note = [/]" in state.splitlines() and LONG in state
    )  # piped: plain KEY = VALUE lines, long ones on one line
    assert f"vars.note = {MARK}" not in state  # the latest value is "[/]"
    assert MARK in cli_here("state", "ctx", "--at", "1", check=True).stdout
    assert json.loads(cli_here("state", "ctx", "--at", "1", "--json", check=True).stdout)["vars"]["note"] == MARK
    diff = cli_here("diff", "ctx", "1", "2", check=True).stdout
    assert MARK in diff and "[/]" in diff
    assert json.loads(cli_here("export", "ctx", check=True).stdout)["state"]["vars"]["note"] == "[/]"
    # Control characters are shown as escapes: stored data never drives the terminal.
    for args in (("state", "ctx"), ("history", "ctx"), ("show", "ctx")):
        out = cli_here(*args, check=True).stdout
        assert "clear\\x1b[2Jscreen\\x07" in out and "\x1b" not in out and "\x07" not in out, args
    assert json.loads(cli_here("state", "ctx", "--json", check=True).stdout)["vars"]["esc"] == "clear\x1b[2Jscreen\x07"

    # Error messages quote what the user typed, literally.
    unknown = cli_here("history", "mk", "--key", "[bold]x[/bold]")
    assert unknown.returncode == 2 and "unknown key '[bold]x[/bold]'" in unknown.stderr
    missing = cli_here("show", "[b]nope[/b]")
    assert missing.returncode == 2 and "no session '[b]nope[/b]'" in missing.stderr
    # The saucer.toml example printed when no model is set keeps its [llm] header, so it can be copied.
    no_model = cli_here("run", "--request", "hello")
    assert no_model.returncode == 2
    assert '\n  [llm]\n  model = "gpt-4o-mini"\n' in no_model.stderr
    assert "Traceback" not in no_model.stderr


def test_output_to_a_pipe_is_never_wrapped(run_cli, tmp_path: Path) -> None:
    _context_session(tmp_path)
    narrow = {"COLUMNS": "40"}  # a pipe ignores it: lines are as long as their content
    state = run_cli("state", "ctx", env=narrow, check=True).stdout
    assert LONG in state
    history = run_cli("history", "ctx", env=narrow, check=True).stdout
    assert "[b]writer[/b]" in history and "vars.note = [/]" in history
    error = run_cli("diff", "ctx", "1", "99", env=narrow)
    [line] = error.stderr.splitlines()
    assert len(line) > 40 and line.startswith("error: ")
    sessions = run_cli("sessions", env=narrow, check=True).stdout
    assert "\nctx " in sessions


def test_prompts_show_parameters_literally(tmp_path: Path) -> None:
    import pexpect

    plan = {
        "task": "cleanup",
        "steps": [
            {
                "subtask": "remove",
                "commands": [
                    {
                        "tool_name": "shell.run",
                        "parameters": {"command": "rm -f junk.txt  # [bold]loud[/bold] :smile:"},
                    },
                ],
            }
        ],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "junk.txt").write_text("junk")
    env = cli_env({"COLUMNS": "160", "TERM": "dumb"})
    child = pexpect.spawn(
        sys.executable,
        ["-m", "saucer", "run", "--plan", "plan.json", "-w", "ws"],
        cwd=str(tmp_path),
        env=env,
        encoding="utf-8",
        timeout=30,
    )
    child.expect_exact("run shell.run")
    child.expect_exact("rm -f junk.txt  # [bold]loud[/bold] :smile:")
    child.expect("Run it")
    child.sendline("n")
    child.expect_exact("refused by the user")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1
    assert (tmp_path / "ws" / "junk.txt").exists()
