"""The service's approval gate in one process: which commands wait (the device's own rules), what is
sent after a decision, and the device's side (it runs only what the server sent as approved)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from saucer.config import load_settings
from saucer.dispatch.local import LocalCommandDispatcher
from saucer.dispatch.messages import Command, Result, ResultStatus
from saucer.engine.approvals import decide, pending_approvals
from saucer.service.approvals import listed_reason
from saucer.service.device import server_approver
from saucer.service.engine_runner import EngineTaskRunner
from saucer.service.hub import DeviceState
from saucer.service.protocol import PlanCommand, PlanStep, TaskSpec
from saucer.service.records import MemorySessionRecordStore, SessionRecord
from saucer.service.runner import StoreSessionRecorder

pytestmark = pytest.mark.anyio

TOOLS = {
    "shell.run": {"sensitive": False, "sensitive_commands": ["rm *", "sudo *"]},
    "files.delete": {"sensitive": True, "sensitive_commands": ["rm *"]},
    "files.read": {"sensitive": False, "sensitive_commands": ["rm *"]},
}


class _Link:
    def __init__(self, info: dict[str, Any]) -> None:
        self.state = DeviceState(device_id="laptop", owner="alice", info=info)

    def get(self, device_id: str) -> DeviceState | None:
        return self.state if device_id == self.state.device_id else None


class Device:
    """A device as the server's dispatcher sees it: its registration info, and the batches it got."""

    def __init__(self, info: dict[str, Any]) -> None:
        self.link, self.device_id = _Link(info), "laptop"
        self.batches: list[tuple[list[str], list[str]]] = []

    async def execute_commands(
        self, commands: list[Command], timeout: float | None = None, *, approved: Any = ()
    ) -> list[Result]:
        self.batches.append(([str(c.parameters.get("command", c.tool_name)) for c in commands], list(approved)))
        return [Result(status=ResultStatus.SUCCESS, result={}, call_id=c.call_id) for c in commands]


def _task(*commands: tuple[str, dict[str, Any]]) -> TaskSpec:
    return TaskSpec(
        task="tidy",
        steps=[PlanStep(subtask="s", commands=[PlanCommand(tool_name=t, parameters=p) for t, p in commands])],
    )


async def _run(
    task: TaskSpec, device: Device, decision: str | None, timeout: float = 30
) -> tuple[Any, EngineTaskRunner, str]:
    runner = EngineTaskRunner(
        load_settings(overrides={"logs.enabled": False, "store.url": "memory://", "approvals.timeout": timeout})
    )
    sid = uuid.uuid4().hex
    records = MemorySessionRecordStore()
    await records.create_session(SessionRecord(session_id=sid, owner="alice", device_id="laptop", task=task))

    async def person() -> None:
        while decision is not None:
            waiting = (
                await asyncio.to_thread(pending_approvals, runner.store, [sid]) if runner.store.exists(sid) else []
            )
            if waiting:
                await asyncio.to_thread(decide, runner.store, sid, waiting[0].number, status=decision, author="alice")
                return
            await asyncio.sleep(0.02)

    helper = asyncio.create_task(person())
    outcome = await runner.run(sid, task, device, StoreSessionRecorder(records, sid))
    helper.cancel()
    return outcome, runner, sid


def test_the_listing_rules_are_the_devices() -> None:
    rm = {"command": "rm -f x"}
    assert (
        listed_reason(TOOLS, Command(tool_name="shell.run", parameters=rm))
        == "command 'rm -f x' matches sensitive pattern 'rm *'"
    )
    assert listed_reason(TOOLS, Command(tool_name="run", parameters=rm)) is not None  # a bare name its listing resolves
    assert (
        listed_reason(TOOLS, Command(tool_name="files.delete", parameters={"path": "x"}))
        == "tool 'files.delete' is marked sensitive"
    )
    assert listed_reason(TOOLS, Command(tool_name="shell.run", parameters={"command": "ls"})) is None
    assert (
        listed_reason(TOOLS, Command(tool_name="nosuch.tool", parameters=rm)) is None
    )  # the device decides for itself
    assert listed_reason({"a.x": {"sensitive_commands": ["re:("]}}, Command(tool_name="a.x", parameters=rm)) is None


async def test_a_refused_command_is_not_sent_and_the_rest_of_its_batch_is_skipped() -> None:
    device = Device({"tools": TOOLS})
    task = _task(
        ("shell.run", {"command": "ls"}),
        ("shell.run", {"command": "rm -f x"}),
        ("shell.run", {"command": "echo after"}),
    )
    outcome, runner, sid = await _run(task, device, "refused")
    assert outcome.status == "failed"
    assert device.batches == [(["ls"], [])]  # only what came before the refused one was sent
    results = outcome.results[0]["results"]
    assert [r["status"] for r in results] == ["success", "failure", "skipped"]
    assert results[1]["error"].startswith(
        "refused: tool 'shell.run' (command 'rm -f x' matches sensitive pattern 'rm *'): refused by alice"
    )
    assert results[2]["error"] == "not run: an earlier command of the batch was refused"


async def test_an_approved_command_is_sent_with_its_call_id_marked_approved() -> None:
    device = Device({"tools": TOOLS})
    task = _task(("shell.run", {"command": "ls"}), ("run", {"command": "rm -f x"}))
    outcome, runner, sid = await _run(task, device, "approved")
    assert outcome.status == "completed", outcome.error
    [(sent, approved)] = device.batches
    assert sent == ["ls", "rm -f x"] and approved == [f"{sid}.0.1"]


async def test_a_device_run_with_yes_or_a_zero_timeout_is_never_asked_for() -> None:
    task = _task(("shell.run", {"command": "rm -f x"}))
    for info, timeout in (({"tools": TOOLS, "assume_yes": True}, 30.0), ({"tools": TOOLS}, 0.0)):
        device = Device(info)
        outcome, runner, sid = await _run(task, device, None, timeout=timeout)
        assert outcome.status == "completed" and device.batches == [(["rm -f x"], [])]
        assert pending_approvals(runner.store, [sid]) == []


async def test_the_device_runs_a_sensitive_command_only_when_the_server_sent_it_as_approved(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("x")
    approved: set[str] = set()
    async with LocalCommandDispatcher.with_default_servers(tmp_path, approver=server_approver(approved)) as dispatcher:
        [refused] = await dispatcher.execute_commands(
            [Command(tool_name="shell.run", parameters={"command": "rm -f x"})]
        )
        assert refused.status == ResultStatus.FAILURE and (tmp_path / "x").exists()
        assert "the server did not send it as approved (run saucer device with --yes" in (refused.error or "")
        command = Command(tool_name="shell.run", parameters={"command": "rm -f x"})
        approved.add(command.call_id)
        [ran] = await dispatcher.execute_commands([command])
        assert ran.status == ResultStatus.SUCCESS and not (tmp_path / "x").exists()
