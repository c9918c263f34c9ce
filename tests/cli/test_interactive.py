"""The interactive prompts, driven through a pseudo-terminal (pexpect)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pexpect
from tests.support.fake_openai import FakeOpenAI

from saucer.context import Context

SENSITIVE_PLAN = {
    "task": "cleanup",
    "steps": [
        {
            "subtask": "remove junk",
            "commands": [{"tool_name": "shell.run", "parameters": {"command": "rm -f junk.txt"}}],
        },
    ],
}


def _spawn(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> pexpect.spawn:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")}
    base.update({"COLUMNS": "160", "NO_COLOR": "1", "TERM": "dumb"})
    base.update(env or {})
    return pexpect.spawn(sys.executable, ["-m", "saucer", *args], cwd=str(cwd), env=base, encoding="utf-8", timeout=30)


def _finish(child: pexpect.spawn) -> int:
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus


def _prepare(tmp_path: Path) -> Path:
    (tmp_path / "plan.json").write_text(json.dumps(SENSITIVE_PLAN))
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "junk.txt").write_text("junk")
    return workspace


def test_sensitive_step_refused_at_the_prompt(tmp_path: Path) -> None:
    workspace = _prepare(tmp_path)
    child = _spawn(["run", "--plan", "plan.json", "--workspace", "ws"], tmp_path)
    child.expect("Run it")
    child.sendline("n")
    assert _finish(child) == 1
    assert (workspace / "junk.txt").exists()


def test_sensitive_step_approved_at_the_prompt(tmp_path: Path) -> None:
    workspace = _prepare(tmp_path)
    child = _spawn(["run", "--plan", "plan.json", "--workspace", "ws"], tmp_path)
    child.expect("Run it")
    child.sendline("y")
    child.expect("replayable plan")  # the experience asker, after a successful session
    child.sendline("y")
    assert _finish(child) == 0
    assert not (workspace / "junk.txt").exists()
    assert list(tmp_path.glob("logs/cleanup/*/experience.json"))


def test_without_a_terminal_sensitive_steps_are_refused_unless_yes(run_cli, tmp_path: Path) -> None:
    workspace = _prepare(tmp_path)
    # approvals.timeout = 0: refused at once instead of waiting as a pending approval (tests/cli/test_approvals.py).
    refused = run_cli("run", "--plan", "plan.json", "--workspace", "ws", env={"SAUCER_APPROVALS__TIMEOUT": "0"})
    assert refused.returncode == 1 and "refused" in refused.stdout
    # Nobody was asked, so it does not say "refused by the user": it says how to approve.
    assert "refused by the user" not in refused.stdout
    assert "there is no terminal to ask for approval; run it again with --yes" in refused.stdout
    assert (workspace / "junk.txt").exists()
    run_cli("run", "--plan", "plan.json", "--workspace", "ws", "--yes", check=True)
    assert not (workspace / "junk.txt").exists()


def test_delete_asks_and_defaults_to_no(tmp_path: Path) -> None:
    ctx = Context.open(f"sqlite:///{tmp_path}/.saucer/saucer.db", "s1")
    ctx.update_vars(set={"a": 1})
    ctx.close()
    child = _spawn(["store", "delete", "s1"], tmp_path)
    child.expect(r"delete session s1")
    child.sendline("")
    assert _finish(child) == 1
    child = _spawn(["store", "delete", "s1"], tmp_path)
    child.expect(r"delete session s1")
    child.sendline("y")
    assert _finish(child) == 0
    assert "deleted session s1" in (child.before or "")


def test_normal_mode_asks_for_requests_and_n_finishes(tmp_path: Path) -> None:
    with FakeOpenAI() as fake:
        # each round acts once, then answers (an answer with no action would end the round no_action)
        look = lambda: fake.tool_calls(("files.list", {"path": "."}))  # noqa: E731
        fake.push(look(), fake.text("Hello! Nothing to do."), look(), fake.text("Still nothing to do."))
        env = {
            "SAUCER_LLM_BASE_URL": fake.base_url,
            "SAUCER_LLM_MODEL": "fake-model",
            "SAUCER_LLM_API_KEY": "sk-test",
        }
        child = _spawn(["run", "--mode", "normal", "--workspace", "ws"], tmp_path, env)
        child.expect("What should the agents do")
        child.sendline("say hello")
        child.expect("or N to finish")
        child.sendline("say it again")
        child.expect("or N to finish")
        child.sendline("N")
        child.expect("replayable plan")
        child.sendline("n")
        assert _finish(child) == 0
        assert not list(tmp_path.glob("logs/*/*/experience.json"))
        sent = [r.messages[-1]["content"] for r in fake.requests]
    assert any("say hello" in m for m in sent[:1]) and any("say it again" in m for m in sent[2:3])
