"""What ``saucer`` reports is what happened: results, statuses, retries and costs, through real processes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.cli import SAUCER, cli_env

from saucer.context import ContextNames
from saucer.engine import Agent, AgentStatus, NonInteractiveInteractor, Session


def _shell(command: str, **extra: Any) -> dict[str, Any]:
    return {"tool_name": "shell.run", "parameters": {"command": command}, **extra}


def _plan(tmp_path: Path, *commands: dict[str, Any], name: str = "plan.json", task: str = "t") -> str:
    steps = [{"subtask": f"step {i}", "commands": [c]} for i, c in enumerate(commands)]
    (tmp_path / name).write_text(json.dumps({"task": task, "steps": steps}))
    return name


def _rows(run_cli: Any) -> list[dict[str, Any]]:
    return json.loads(run_cli("sessions", "--json", check=True).stdout)


def _printed(out: str, comment: str) -> str:
    """The command printed under ``# comment`` in the "next" list."""
    lines = out.splitlines()
    index = next(i for i, line in enumerate(lines) if line.strip() == f"# {comment}")
    return lines[index + 1].strip()


def _sh(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        shell=True,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env=cli_env(),
    )


def test_a_command_exiting_3_fails_the_session_its_evaluation_and_its_experience(run_cli, tmp_path: Path) -> None:
    plan = _plan(
        tmp_path,
        _shell("grep -q nothing /dev/null; echo first >> log", expect_exit=[0, 1]),  # grep's 1 is declared fine
        _shell("echo why >&2; test -f ready || exit 3"),
        _shell("echo after >> log; exit 4", expect_exit=[4]),
    )
    env = {"SAUCER_SYSTEM__EVA_SESSION": "true", "SAUCER_SYSTEM__SAVE_EXPERIENCE": "always"}
    proc = run_cli("run", "--plan", plan, "-w", "ws", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "shell.run failure tool 'shell.run' failed: command exited with code 3 (expected 0)" in proc.stdout
    shown = json.loads(run_cli("show", "last", "--json", check=True).stdout)
    row = shown["session"]
    assert row["status"] == "failed" and row["steps"] == 2
    failed = [e for e in shown["events"] if e["kind"] == "step"][1]
    [command] = failed["commands"]
    assert command["result"]["status"] == "failure" and command["result"]["result"]["exit_code"] == 3
    assert command["result"]["result"]["stderr"] == "why\n"  # kept as data
    [log_dir] = (tmp_path / "logs" / "t").iterdir()
    [verdict] = [json.loads(line) for line in (log_dir / "evaluation.log").read_text().splitlines()]
    assert verdict["complete"] == "no" and verdict["evaluator"] == "rules"
    assert not (log_dir / "experience.json").exists()
    # resume only reports it, and says how to run the failed step again; that command works as printed.
    reported = run_cli("resume", row["id"])
    assert reported.returncode == 1
    retry = re.search(r"run the failed step again with: (.+)", reported.stdout).group(1)  # type: ignore[union-attr]
    (tmp_path / "ws" / "ready").touch()
    retried = _sh(retry, tmp_path)
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert (tmp_path / "ws" / "log").read_text() == "first\nafter\n"  # the good step did not run twice
    [row] = _rows(run_cli)
    assert row["status"] == "finished" and row["steps"] == 4  # the failed attempt stays in the log


def test_plans_are_checked_against_the_tools_before_anything_runs(run_cli, tmp_path: Path) -> None:
    # (More messages are checked in tests/engine/test_engine_verdicts.py, without processes.)
    cases = [
        ({"tool_name": "files.frobnicate"}, "unknown tool 'files.frobnicate' (closest: files."),
        (
            {"tool_name": "files.write", "parameters": {"path": "x"}},
            "invalid parameters for tool 'files.write': 'content' is a required property",
        ),
    ]
    for bad, message in cases:
        plan = _plan(tmp_path, _shell("echo ran > ran.txt"), bad, name="bad.json")
        proc = run_cli("run", "--plan", plan, "-w", "ws")
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout
        [line] = proc.stderr.splitlines()  # one sentence, on stderr
        assert line.startswith("error: bad.json: steps[1].commands[0]: ") and message in line, line
    assert not (tmp_path / "ws" / "ran.txt").exists()  # the good first step never ran
    assert _rows(run_cli) == []  # no session was started
    folder = tmp_path / "plans"
    folder.mkdir()
    _plan(folder, _shell("echo a > a.txt"), name="a.json")
    _plan(folder, {"tool_name": "frobnicate"}, name="b.json")
    proc = run_cli("run", "--plan", "plans", "-w", "ws")
    assert proc.returncode == 2 and "b.json: steps[0].commands[0]: unknown tool 'frobnicate'" in proc.stderr
    assert not (tmp_path / "ws" / "a.txt").exists()  # a batch is checked whole before any plan runs


def test_a_limit_stops_the_session_and_resume_continues_it(run_cli, tmp_path: Path) -> None:
    plan = _plan(tmp_path, *(_shell(f"echo {i} >> log") for i in range(3)))
    proc = run_cli("run", "--plan", plan, "-w", "ws", "--max-round", "1")
    assert proc.returncode == 1 and "stopped (max_round (1) reached)" in proc.stdout
    assert _rows(run_cli)[0]["status"] == "stopped"
    again = _sh(_printed(proc.stdout, "continue where the limit stopped it"), tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (tmp_path / "ws" / "log").read_text() == "0\n1\n2\n"
    assert _rows(run_cli)[0]["status"] == "finished"


def _wait_for(proc: subprocess.Popen[str], text: str, timeout: float = 30) -> str:
    seen = ""
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while text not in seen:
        assert time.monotonic() < deadline, seen
        line = proc.stdout.readline()
        assert line, seen
        seen += line
    return seen


def test_a_session_whose_runner_vanished_is_interrupted_not_running(run_cli, tmp_path: Path) -> None:
    plan = _plan(tmp_path, _shell("echo 0 >> log"), _shell("test -f go || sleep 20"), _shell("echo 2 >> log"))
    proc = subprocess.Popen(
        [*SAUCER, "run", "--plan", plan, "-w", "ws"],
        cwd=tmp_path,
        env=cli_env({"SAUCER_STORE__LEASE_TTL": "1"}),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for(proc, "round 1")
        assert _rows(run_cli)[0]["status"] == "running"  # its runner holds a live lease
        os.kill(proc.pid, signal.SIGKILL)  # the runner crashes mid-step
        proc.wait(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its tool servers too
    time.sleep(1.5)  # past the lease's 1 s
    [row] = _rows(run_cli)
    assert row["status"] == "interrupted"
    shown = run_cli("show", row["id"], check=True).stdout
    assert "· interrupted" in shown
    resume = re.search(r"continue it with: (.+)", shown).group(1)  # type: ignore[union-attr]
    (tmp_path / "ws" / "go").touch()
    done = _sh(resume, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "ws" / "log").read_text() == "0\n2\n"
    assert _rows(run_cli)[0]["status"] == "finished"


class _Unpriced(Agent):
    async def act(self, context: Any) -> AgentStatus:
        self.add_cost(None if context.get(ContextNames.REQUEST) == "unpriced" else 0.0)
        return AgentStatus.FINISH


def test_an_unknown_cost_is_unknown_everywhere_never_0(run_cli, tmp_path: Path) -> None:
    import asyncio

    from saucer.config import load_settings

    url = f"sqlite:///{tmp_path}/.saucer/saucer.db"
    settings = load_settings(overrides={"store.url": url, "logs.root": str(tmp_path / "logs")})
    session = Session(
        "llm",
        settings=settings,
        agents=_Unpriced("model"),
        session_id="unpriced",
        interactor=NonInteractiveInteractor(requests=["free", "unpriced"]),
    )
    asyncio.run(session.run())
    assert re.search(r"unpriced +llm +normal +finished +2 +2 +unknown ", run_cli("sessions", check=True).stdout)
    assert "cost unknown" in run_cli("show", "unpriced", check=True).stdout
    shown = json.loads(run_cli("show", "unpriced", "--json", check=True).stdout)
    assert shown["session"]["cost"] is None and shown["session"]["status"] == "finished"  # null in JSON, never 0
    assert shown["events"][-1]["summary"]["cost"] is None
    assert [e.get("cost", 0.0) for e in shown["events"] if e["kind"] == "step"] == [0.0, None]
    state = json.loads(run_cli("state", "unpriced", "--json", check=True).stdout)
    assert state["names"]["ROUND_COST"] == {"0": 0.0, "1": None}  # an entry per round: free, and unknown


def test_ctrl_c_prints_the_command_that_continues(tmp_path: Path) -> None:
    import pexpect

    plan = _plan(tmp_path, _shell("echo 0 >> log"), _shell("test -f go || sleep 20"))
    env = cli_env({"COLUMNS": "160", "TERM": "dumb"})
    child = pexpect.spawn(
        sys.executable,
        ["-m", "saucer", "run", "--plan", plan, "-w", "ws"],
        cwd=str(tmp_path),
        env=env,
        encoding="utf-8",
        timeout=30,
    )
    child.expect("round 1")
    time.sleep(0.5)
    child.sendintr()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130
    command = re.search(r"error: interrupted; continue with: (.+)", child.before).group(1).strip()  # type: ignore[union-attr]
    assert "Traceback" not in child.before
    (tmp_path / "ws" / "go").touch()
    done = _sh(command, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "finished" in done.stdout
