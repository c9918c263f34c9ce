"""The inspection commands, run as subprocesses in a fresh directory."""

from __future__ import annotations

import json
from pathlib import Path

from saucer.context import Context, ContextNames
from saucer.engine.summaries import summary_of


def _make_session(cwd: Path, sid: str = "s1") -> None:
    ctx = Context.open(
        f"sqlite:///{cwd}/.saucer/saucer.db", sid, author="agent:Follower", meta={"task": "t", "mode": "follower"}
    )
    ctx.set(ContextNames.CURRENT_ROUND_ID, 1)
    ctx.set(ContextNames.REQUEST, "write a file")
    ctx.commit(step=0)
    ctx.incr(ContextNames.CURRENT_ROUND_STEP)
    ctx.update_vars(set={"file": "a.txt"})
    ctx.commit(
        step=1,
        meta={
            "agent": "Follower",
            "state": "CONTINUE",
            "commands": [{"tool_name": "files.write", "parameters": {"path": "a.txt"}}],
            "results": [{"status": "success", "result": "written"}],
        },
    )
    ctx.close()


def test_version_and_help(run_cli) -> None:
    out = run_cli("--version", check=True)
    assert out.stdout.startswith("saucer ")
    for command in ("sessions", "show", "history", "state", "diff", "fork", "export", "import"):
        proc = run_cli(command, "--help", check=True)
        assert "Usage" in proc.stdout


def test_no_store_yet_is_one_clear_sentence(run_cli) -> None:
    proc = run_cli("sessions")
    assert proc.returncode == 2
    assert "no saucer store" in proc.stderr and "Traceback" not in proc.stderr


def test_inspection_commands(run_cli, tmp_path: Path) -> None:
    _make_session(tmp_path)
    listing = json.loads(run_cli("sessions", "--json", check=True).stdout)
    assert [row["id"] for row in listing] == ["s1"] and listing[0]["task"] == "t"
    shown = run_cli("show", "s1", check=True).stdout
    assert "files.write" in shown and "vars.file = a.txt" in shown and "round 1" in shown
    history = run_cli("history", "s1", "--key", "REQUEST", check=True).stdout
    assert "write a file" in history and "agent:Follower" in history
    state = json.loads(run_cli("state", "s1", "--at", "1", "--json", check=True).stdout)
    assert state["version"] == 1 and state["vars"] == {} and state["names"]["REQUEST"] == "write a file"
    latest = json.loads(run_cli("state", "s1", "--json", check=True).stdout)
    assert latest["vars"] == {"file": "a.txt"} and latest["names"]["ROUND_STEP"] == {"1": 1}
    diff = json.loads(run_cli("diff", "s1", "1", "2", "--json", check=True).stdout)
    assert set(diff) == {"ROUND_STEP", "vars.file"}
    forked = run_cli("fork", "s1", "--at", "1", "--as", "s1b", check=True).stdout
    assert "s1b" in forked
    assert json.loads(run_cli("state", "s1b", "--json", check=True).stdout)["vars"] == {}


def test_export_import_round_trip(run_cli, tmp_path: Path) -> None:
    _make_session(tmp_path)
    run_cli("export", "s1", "-o", "s1.json", check=True)
    data = json.loads((tmp_path / "s1.json").read_text())
    assert len(data["events"]) == 2 and data["state"]["vars"] == {"file": "a.txt"}
    run_cli("import", "s1.json", "--as", "copy", check=True)
    copy = json.loads(run_cli("state", "copy", "--json", check=True).stdout)
    assert copy["vars"] == {"file": "a.txt"} and copy["version"] == 2
    again = run_cli("import", "s1.json", "--as", "copy")
    assert again.returncode == 2 and "already exists" in again.stderr


def test_user_mistakes_are_one_sentence(run_cli, tmp_path: Path) -> None:
    _make_session(tmp_path)
    cases = [
        (("show", "nope"), "no session 'nope'"),
        (("state", "s1", "--at", "99"), "versions 0..2"),
        (("import", "missing.json"), "no such file"),
        (("diff", "s1", "1", "7"), "versions 0..2"),
    ]
    (tmp_path / "bad.json").write_text('{"format": "saucer.session/1", "session": {}, "events": []}')
    cases.append((("import", "bad.json"), "session.session_id"))
    (tmp_path / "notjson.json").write_text("{nope")
    cases.append((("import", "notjson.json"), "not JSON"))
    for args, message in cases:
        proc = run_cli(*args)
        assert proc.returncode != 0, args
        assert message in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_show_follow_prints_new_steps_and_stops_at_the_end(tmp_path: Path) -> None:
    import subprocess
    import sys

    _make_session(tmp_path)
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("SAUCER_")}
    env.update({"COLUMNS": "200", "NO_COLOR": "1"})
    proc = subprocess.Popen(
        [sys.executable, "-m", "saucer", "show", "s1", "--follow", "--interval", "0.1"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen = ""
        while "following s1" not in seen:  # it prints the timeline so far, then waits
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            seen += line
        ctx = Context.open(f"sqlite:///{tmp_path}/.saucer/saucer.db", "s1", author="agent:late")
        ctx.update_vars(set={"late": "yes"})
        ctx.commit(step=2)
        end = {"kind": "session_end", "session_status": "finished"}
        ctx.commit(meta=end, summary=summary_of(end))
        ctx.close()
        out, err = proc.communicate(timeout=30)
        out = seen + out
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "vars.late = yes" in out and "session finished" in out


def test_show_lists_the_artifacts_of_each_step_literally(run_cli, tmp_path: Path) -> None:
    """save_ui_tree's entries: a markup-like path and an error with control characters are shown as stored."""
    ctx = Context.open(
        f"sqlite:///{tmp_path}/.saucer/saucer.db", "ui", author="follower", meta={"task": "t", "mode": "follower"}
    )
    ctx.set(ContextNames.CURRENT_ROUND_ID, 0)
    ctx.commit(step=0)
    artifacts = [
        {"kind": "ui_tree", "path": "/art/[bold]step[/bold]-0001-tree.json", "app": "calc", "nodes": 95},
        {"kind": "screenshot", "error": "no display\x1b[2J [red]here[/red]"},
    ]
    ctx.update_vars(set={"x": 1})
    ctx.commit(
        step=1,
        meta={"kind": "step", "agent": "follower", "state": "CONTINUE", "session_step": 1, "artifacts": artifacts},
    )
    ctx.close()
    shown = run_cli("show", "ui", check=True).stdout
    assert "ui tree: /art/[bold]step[/bold]-0001-tree.json (95 elements)" in shown
    assert "screenshot: not saved: no display\\x1b[2J [red]here[/red]" in shown and "\x1b[2J" not in shown
    events = json.loads(run_cli("show", "ui", "--json", check=True).stdout)["events"]
    assert [e.get("artifacts") for e in events] == [None, artifacts]
