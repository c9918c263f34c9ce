"""Real processes: a queued session's sensitive step waits on its ``saucer worker`` as a pending
approval (nobody is at a worker's terminal), and runs once someone approves it from another process; a queued
request's question (the model's ask_user) waits the same way until `saucer answer`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.support.queueing import status_json, wait_until

pytestmark = [pytest.mark.postgres]


def test_a_queued_sensitive_step_waits_on_its_worker_until_approved(
    qdir: Path, pg_url: str, saucer: Any, workers: Any
) -> None:
    (qdir / "saucer.toml").write_text('[system]\nsave_experience = "always_not"\nlog_to_markdown = false\n')
    workspace = qdir / "ws"
    workspace.mkdir()
    (workspace / "junk.txt").write_text("junk")
    plan = {
        "task": "cleanup",
        "steps": [
            {
                "subtask": "remove junk",
                "commands": [{"tool_name": "shell.run", "parameters": {"command": "rm -f junk.txt"}}],
            }
        ],
    }
    (qdir / "plan.json").write_text(json.dumps(plan))
    queued = saucer("run", "--plan", "plan.json", "--queue", "--workspace", str(workspace))
    assert queued.returncode == 0, queued.stderr
    workers("--concurrency", "1")

    listed = saucer("approvals", "--wait", "90", "--json", timeout=120)
    assert listed.returncode == 0, listed.stderr
    [approval] = json.loads(listed.stdout)
    assert approval["status"] == "pending" and "rm -f junk.txt" in approval["detail"]
    assert (workspace / "junk.txt").exists()
    done = saucer("approve", approval["session_id"], str(approval["number"]), "--author", "user:ops")
    assert done.returncode == 0, done.stderr

    def ended() -> Any:
        jobs = status_json(saucer)["jobs"]
        return jobs if jobs and all(j["state"] in ("done", "failed") for j in jobs) else None

    [job] = wait_until(ended, 90, "the queued session to end")
    assert job["state"] == "done" and job["session"] == "finished", job
    assert not (workspace / "junk.txt").exists()


def test_a_queued_sessions_question_waits_on_its_worker_until_answered(
    qdir: Path, pg_url: str, saucer: Any, workers: Any
) -> None:

    from tests.support.fake_openai import FakeOpenAI

    with FakeOpenAI() as fake:
        fake.push(
            fake.tool_calls(("ask_user", {"question": "Which file?"}, "call_q")),
            fake.tool_calls(("files.read", {"path": "notes.txt"}, "call_read")),
            fake.text("Read it."),
        )
        (qdir / "saucer.toml").write_text(
            '[system]\nsave_experience = "always_not"\nlog_to_markdown = false\neva_session = false\nsave_ui_tree = false\n'
            f'[llm]\nbase_url = "{fake.base_url}"\nmodel = "gpt-4o-mini"\napi_key = "unused-locally"\n'
        )
        workspace = qdir / "ws"
        workspace.mkdir()
        (workspace / "notes.txt").write_text("buy milk\n")
        queued = saucer("run", "--request", "read my notes", "--queue", "--workspace", str(workspace))
        assert queued.returncode == 0, queued.stderr
        workers("--concurrency", "1")

        listed = saucer("approvals", "--wait", "90", "--json", timeout=120)
        assert listed.returncode == 0, listed.stderr
        [question] = json.loads(listed.stdout)
        assert (question["kind"], question["status"], question["detail"]) == ("question", "pending", "Which file?")
        done = saucer("answer", question["session_id"], str(question["number"]), "notes.txt", "--author", "user:ops")
        assert done.returncode == 0, done.stderr

        def ended() -> Any:
            jobs = status_json(saucer)["jobs"]
            return jobs if jobs and all(j["state"] in ("done", "failed") for j in jobs) else None

        [job] = wait_until(ended, 90, "the queued session to end")
        assert job["state"] == "done" and job["session"] == "finished", job
        [message] = [m for m in fake.requests[1].json["messages"] if m.get("tool_call_id") == "call_q"]
        assert message["content"] == "the user (user:ops) answered: notes.txt"
