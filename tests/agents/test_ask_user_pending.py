"""The model's ask_user in a session with no terminal (``saucer run --no-input``, a real process) waits as a
pending question stored in the session: another process lists it (``saucer approvals``) and answers it
(``saucer answer``), and the model's next request carries the answer; unanswered, it reads "no answer (timeout)".
(The same through ``saucer serve`` + ``saucer device``: tests/service/test_service_questions.py.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.fake_openai import FakeOpenAI


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAUCER_", "OPENAI_"))}
    env.update(COLUMNS="200", NO_COLOR="1")
    return env


def _config(tmp_path: Path, fake: FakeOpenAI, timeout: float) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "notes.txt").write_text("buy milk\n")
    (tmp_path / "saucer.toml").write_text(
        f'[llm]\nbase_url = "{fake.base_url}"\nmodel = "gpt-4o-mini"\napi_key = "unused-locally"\n'
        f"[approvals]\ntimeout = {timeout}\n[system]\nmax_step = 6\neva_session = false\nsave_ui_tree = false\n"
        '[store]\nurl = "sqlite:///events.db"\n'
    )


def _saucer(tmp_path: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "saucer", *args],
        cwd=tmp_path,
        env=_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _run(tmp_path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "saucer",
            "run",
            "--request",
            "read my notes",
            "--no-input",
            "--session-id",
            "ask1",
            "--workspace",
            "ws",
            "--task",
            "ask1",
        ],
        cwd=tmp_path,
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _tool_message(request: Any, call_id: str) -> str:
    [message] = [m for m in request.json["messages"] if m.get("role") == "tool" and m.get("tool_call_id") == call_id]
    return message["content"]


def test_a_question_is_answered_from_another_process(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.push(
        fake.tool_calls(("ask_user", {"question": "Which file holds your [bold]notes[/bold]?"}, "call_q")),
        fake.tool_calls(("files.read", {"path": "notes.txt"}, "call_read")),
        fake.text("Your notes say: buy milk."),
    )
    _config(tmp_path, fake, timeout=60)
    run = _run(tmp_path)
    try:
        listed = _saucer(tmp_path, "approvals", "--wait", "30")  # every running session's pending ones
        assert listed.returncode == 0, listed.stderr
        [line] = [ln for ln in listed.stdout.splitlines() if ln.startswith("ask1 ")]
        number = line.split()[1]
        assert line == f"ask1 {number} pending · question: Which file holds your [bold]notes[/bold]?", listed.stdout
        assert f"saucer answer ask1 {number} TEXT" in listed.stdout
        assert len(fake.requests) == 1  # the model waits for the answer

        wrong = _saucer(tmp_path, "approve", "ask1", number)
        assert wrong.returncode != 0 and wrong.stderr.strip() == (
            f"error: {number} of session 'ask1' is a question, not an approval: answer it (saucer answer ask1 {number} TEXT)"
        )
        answered = _saucer(
            tmp_path, "answer", "ask1", number, "notes.txt in [red]the workspace[/red]", "--author", "user:ana"
        )
        assert answered.returncode == 0, answered.stderr
        assert (
            answered.stdout.strip()
            == f"question {number} of session ask1 answered by user:ana: notes.txt in [red]the workspace[/red]"
        )
        out, _ = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, out
    assert f"saucer answer ask1 {number} TEXT" in out  # the run said how to answer it
    assert "Which file holds your [bold]notes[/bold]?" in out
    assert (
        _tool_message(fake.requests[1], "call_q")
        == "the user (user:ana) answered: notes.txt in [red]the workspace[/red]"
    )
    again = _saucer(tmp_path, "answer", "ask1", number, "late")
    assert again.returncode != 0 and again.stderr.strip() == (
        f"error: question {number} of session 'ask1' was already answered by user:ana"
    )
    recorded = json.loads(_saucer(tmp_path, "approvals", "ask1", "--json").stdout)
    assert [(q["kind"], q["status"], q["decided_by"], q["answer"]) for q in recorded] == [
        ("question", "answered", "user:ana", "notes.txt in [red]the workspace[/red]")
    ]
    timeline = _saucer(tmp_path, "show", "ask1").stdout  # markup-like text printed literally everywhere
    assert f"question {number} answered by user:ana: notes.txt in [red]the workspace[/red]" in timeline, timeline


def test_an_unanswered_question_times_out_and_the_model_reads_it(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.push(
        fake.tool_calls(("ask_user", {"question": "Which file?"}, "call_q")),
        fake.tool_calls(("files.read", {"path": "notes.txt"}, "call_read")),
        fake.text("Read notes.txt without an answer."),
    )
    _config(tmp_path, fake, timeout=1)
    run = _run(tmp_path)
    out, _ = run.communicate(timeout=60)
    assert run.returncode == 0, out
    content = _tool_message(fake.requests[1], "call_q")
    assert content.startswith("no answer (timeout): nobody answered question "), content
    [recorded] = json.loads(_saucer(tmp_path, "approvals", "ask1", "--json").stdout)
    assert (recorded["status"], recorded["decided_by"], recorded["answer"]) == ("timed_out", "system", None)


def test_the_readme_questions_example_runs(fake: FakeOpenAI, tmp_path: Path) -> None:
    """docs/how-to/people-in-the-loop.md's questions block, run as written with the fake model in saucer.toml."""
    section = (Path(__file__).resolve().parents[2] / "docs" / "how-to" / "people-in-the-loop.md").read_text(
        encoding="utf-8"
    )
    [script] = [b for b in re.findall(r"```bash(?: [^\n]*)?\n(.*?)```", section, re.S) if "saucer answer" in b]
    fake.push(
        fake.tool_calls(("ask_user", {"question": "Which file holds your notes?"}, "call_q")),
        fake.tool_calls(("files.read", {"path": "notes.txt"}, "call_read")),
        fake.text("Your notes say: buy milk."),
    )
    _config(tmp_path, fake, timeout=60)
    (tmp_path / "notes.txt").write_text("buy milk\n")  # the page's run has no --workspace: the current folder
    env = {**_env(), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "notes 3 pending · question: Which file holds your notes?" in done.stdout, done.stdout + done.stderr
    assert "question 3 of session notes answered by user:alice: notes.txt" in done.stdout
    assert "session notes: finished" in done.stdout, done.stdout
    assert _tool_message(fake.requests[1], "call_q") == "the user (user:alice) answered: notes.txt"
    assert "buy milk" in _tool_message(fake.requests[2], "call_read")
