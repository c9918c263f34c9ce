"""A service task's initial context variables and participants (issue 26): the submitted
``vars`` are in the engine session from its start; its ``participants``, with the submitting
principal among them, are the only authors besides the runner that may write to it."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from saucer.config import load_settings
from saucer.context import Context
from saucer.dispatch.messages import Command, Result, ResultStatus
from saucer.service.api import _SubmitRequest
from saucer.service.engine_runner import EngineTaskRunner
from saucer.service.protocol import PlanCommand, PlanStep, TaskSpec
from saucer.service.records import MemorySessionRecordStore, SessionRecord
from saucer.service.runner import StoreSessionRecorder
from saucer.store import NotParticipantError

pytestmark = pytest.mark.anyio


class Device:
    async def execute_commands(self, commands: list[Command], timeout: float | None = None) -> list[Result]:
        return [Result(status=ResultStatus.SUCCESS, result={}, call_id=c.call_id) for c in commands]


def test_the_submit_body_takes_vars_and_participants_and_the_owner_joins_them() -> None:
    body = {"device_id": "d", "task": {"task": "t", "steps": [], "vars": {"phase": "draft"}, "participants": ["bob"]}}
    task = _SubmitRequest.model_validate(body).task
    assert task.vars == {"phase": "draft"}
    assert task.submitted_by("alice").participants == ["bob", "alice"]
    assert task.submitted_by("bob").participants == ["bob"]
    open_task = TaskSpec(task="t")
    assert open_task.submitted_by("alice").participants == []  # names none: stays open


async def test_an_engine_service_session_starts_with_the_task_vars_and_participants() -> None:
    runner = EngineTaskRunner(load_settings(overrides={"logs.enabled": False, "store.url": "memory://"}))
    sid = uuid.uuid4().hex
    task = TaskSpec(
        task="seeded",
        steps=[PlanStep(subtask="a", commands=[PlanCommand(tool_name="echo")])],
        vars={"phase": "draft", "limits": {"n": 2}},
        participants=["bob"],
    ).submitted_by("alice")
    records = MemorySessionRecordStore()
    await records.create_session(SessionRecord(session_id=sid, owner="alice", device_id="d", task=task))
    outcome = await runner.run(sid, task, Device(), StoreSessionRecorder(records, sid))
    assert outcome.status == "completed", outcome.error
    ctx = Context.open(runner.store, sid, create=False)
    assert dict(ctx.vars) == {"phase": "draft", "limits": {"n": 2}}
    assert runner.store.session_info(sid).participants == {"alice", "bob"}
    eve = Context.open(runner.store, sid, author="eve", create=False)
    eve.update_vars(set={"x": 1})
    with pytest.raises(NotParticipantError):
        eve.commit()
    alice = Context.open(runner.store, sid, author="alice", create=False)
    alice.update_vars(set={"x": 1})
    alice.commit()
    await runner.close()


def test_a_task_whose_vars_cannot_be_stored_is_refused() -> None:
    runner = EngineTaskRunner(load_settings(overrides={"logs.enabled": False, "store.url": "memory://"}))
    bad: Any = TaskSpec(task="t", vars={"x": 1}).model_copy(update={"vars": {"x": float("nan")}})
    with pytest.raises(ValueError, match=r"task\.vars: value for vars\.x cannot be stored"):
        runner.validate(bad)
