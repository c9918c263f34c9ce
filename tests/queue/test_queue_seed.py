"""A queued session starts with the context variables and participants it was queued with
(issue 26): the job carries them, the worker's SessionRunner gives them to the new session.
Runs on the memory store: no PostgreSQL needed to make and run a job's session."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from saucer.config import load_settings
from saucer.context import Context
from saucer.dispatch.messages import Command, Result, ResultStatus
from saucer.queue.client import plan_jobs, request_job
from saucer.queue.jobs import SessionRunner
from saucer.store.memory import MemoryStore


class _Tools:
    async def execute_commands(self, commands: list[Command], timeout: float | None = None) -> list[Result]:
        return [Result(status=ResultStatus.SUCCESS, result={}, call_id=c.call_id) for c in commands]

    def list_tools(self) -> list[dict[str, Any]]:
        return [{"name": "shell.run", "description": "run"}]


def test_a_queued_plan_session_starts_with_its_vars_and_participants(tmp_path: Path) -> None:
    plan = {
        "task": "q",
        "vars": {"phase": "draft"},
        "steps": [{"subtask": "a", "commands": [{"tool_name": "shell.run", "parameters": {"command": "true"}}]}],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    [spec] = plan_jobs(
        tmp_path / "plan.json",
        workspace=tmp_path,
        yes=True,
        context_vars={"retries": 2},
        participants=["human:bob"],
        user="user:ana",
    )
    assert (
        spec.args["vars"] == {"retries": 2}
        and spec.args["participants"] == ["human:bob"]
        and spec.args["user"] == "user:ana"
    )
    store = MemoryStore()
    settings = load_settings(overrides={"logs.enabled": False, "store.url": "memory://"})
    runner = SessionRunner(settings, store, dispatcher_factory=lambda session: _Tools())
    result = asyncio.run(runner.run_session(json.loads(json.dumps(spec.args))))  # as the job's JSON
    assert result.status == "finished", result
    sid = spec.session_id
    assert dict(Context.open(store, sid, create=False).vars) == {"phase": "draft", "retries": 2}
    assert store.session_info(sid).participants == {"human:bob", "user:ana"}


def test_a_queued_request_refuses_vars_that_cannot_be_stored() -> None:
    with pytest.raises(TypeError, match=r"vars\.x"):
        request_job("hello", context_vars={"x": {1, 2}})
    spec = request_job("hello", context_vars={"x": [1, 2]}, user="user:ana")
    assert spec.args["vars"] == {"x": [1, 2]} and "participants" not in spec.args


class _DiesBeforeTheStart(_Tools):
    """The worker is killed once it created the session, before its first commit."""

    def __init__(self, store: MemoryStore, sid: str) -> None:
        self.store, self.sid = store, sid

    def list_tools(self) -> list[dict[str, Any]]:
        if self.store.exists(self.sid):
            raise asyncio.CancelledError
        return super().list_tools()  # the plan's check, before the session is created


def test_a_job_whose_worker_died_before_the_session_started_starts_it_with_its_vars(tmp_path: Path) -> None:
    plan = {
        "task": "q",
        "vars": {"phase": "draft"},
        "steps": [{"subtask": "a", "commands": [{"tool_name": "shell.run", "parameters": {"command": "true"}}]}],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    [spec] = plan_jobs(tmp_path / "plan.json", workspace=tmp_path, yes=True, context_vars={"retries": 2})
    args = json.loads(json.dumps(spec.args))
    store = MemoryStore()
    settings = load_settings(overrides={"logs.enabled": False, "store.url": "memory://"})
    sid = spec.session_id
    dying = SessionRunner(settings, store, dispatcher_factory=lambda session: _DiesBeforeTheStart(store, sid))
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(dying.run_session(args))
    assert store.exists(sid) and not [e for e in store.read(sid) if e.meta.get("kind")]
    runner = SessionRunner(settings, store, dispatcher_factory=lambda session: _Tools())
    result = asyncio.run(runner.run_session(args))  # the job, taken again by another worker
    assert result.status == "finished", result
    kinds = [e.meta.get("kind") for e in store.read(sid)]
    assert kinds.count("session_start") == 1 and "session_resume" not in kinds, kinds
    assert dict(Context.open(store, sid, create=False).vars) == {"phase": "draft", "retries": 2}
