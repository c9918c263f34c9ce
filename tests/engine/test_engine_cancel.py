"""Cancelling a running session from outside (saucer.engine.cancel): the request in the log, refusals, and a
session that honours it between steps and while it waits for an approval."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from saucer.engine.approvals import pending_approvals, read_approvals
from saucer.engine.cancel import CANCEL_KIND, CANCEL_VAR, CancelError, NotAllowedToCancel, request_cancel
from saucer.engine.factory import SessionFactory
from saucer.engine.interactor import NonInteractiveInteractor
from saucer.engine.status import stored_status
from saucer.store.memory import MemoryStore


def _slow_plan(path: Path, steps: int = 30, seconds: float = 0.1) -> Path:
    command = {"tool_name": "shell.run", "parameters": {"command": f"sleep {seconds}"}}
    path.write_text(
        json.dumps({"task": "slow", "steps": [{"subtask": f"s{i}", "commands": [command]} for i in range(steps)]})
    )
    return path


def test_a_session_that_is_not_running_cannot_be_cancelled() -> None:
    store = MemoryStore()
    with pytest.raises(CancelError, match="no session 'nope'"):
        request_cancel(store, "nope", author="user:a")
    store.create_session("done", meta={"status": "running"})
    store.append("done", 0, [], author="system", meta={"kind": "session_end", "session_status": "finished"})
    with pytest.raises(CancelError, match=r"is not running \(finished\)"):
        request_cancel(store, "done", author="user:a")
    store.create_session("gone", meta={"status": "running"})  # no runner holds its lease: interrupted
    with pytest.raises(CancelError, match=r"is not running \(interrupted\)"):
        request_cancel(store, "gone", author="user:a")
    assert store.head("done") == 1 and store.head("gone") == 0  # nothing was written


def test_a_non_participant_may_not_cancel() -> None:
    store = MemoryStore()
    store.create_session("p", meta={"status": "running"}, participants=["user:alice"])
    store.acquire_lease("p", "runner", 30)
    with pytest.raises(NotAllowedToCancel):
        request_cancel(store, "p", author="user:mallory")
    request = request_cancel(store, "p", author="user:alice", reason="  wrong folder ")
    assert request.text() == "cancelled by user:alice: wrong folder"
    [event] = list(store.read("p"))
    assert event.author == "user:alice" and event.meta["kind"] == CANCEL_KIND
    [op] = event.ops  # an out-of-turn write of the cancel variable, as any participant's write
    assert op["var"] == CANCEL_VAR and op["value"]["by"] == "user:alice" and op["value"]["reason"] == "wrong folder"


def test_a_running_session_ends_cancelled_between_steps(make_settings: Any, tmp_path: Path) -> None:
    store = MemoryStore()
    factory = SessionFactory(make_settings(), store=store, interactor=NonInteractiveInteractor(), workspace=tmp_path)
    [session] = factory.create_session(
        "slow", "follower", plan=_slow_plan(tmp_path / "p.json", seconds=0.3), session_id="c1"
    )

    async def canceller() -> None:
        while not (store.exists("c1") and stored_status(store, "c1").holder and store.head("c1") > 3):
            await asyncio.sleep(0.02)
        await asyncio.to_thread(request_cancel, store, "c1", author="user:ops", reason="enough")

    async def main() -> Any:
        helper = asyncio.create_task(canceller())
        result = await session.run()
        await helper
        return result

    result = asyncio.run(main())
    assert result.status == "cancelled" and result.reason == "cancelled by user:ops: enough"
    assert 0 < result.steps < 30
    events = list(store.read("c1"))
    assert events[-1].meta["kind"] == "session_end" and events[-1].meta["session_status"] == "cancelled"
    [cancel] = [e for e in events if e.meta.get("kind") == CANCEL_KIND]
    assert cancel.author == "user:ops"
    # the step in flight when the cancel was written commits after it (ordered after it); no other step starts
    steps_after = [e for e in events if e.version > cancel.version and e.meta.get("kind") == "step"]
    assert len(steps_after) <= 1
    status = stored_status(store, "c1")
    assert status.status == "cancelled" and status.ended
    [row] = store.list_sessions()
    assert row.status == "cancelled"  # the listing agrees (not "interrupted")


def test_a_session_waiting_for_an_approval_stops_waiting(make_settings: Any, tmp_path: Path) -> None:
    store = MemoryStore()
    (tmp_path / "junk.txt").write_text("junk")
    plan = tmp_path / "rm.json"
    plan.write_text(
        '{"task": "tidy", "steps": [{"subtask": "rm", "commands": '
        '[{"tool_name": "shell.run", "parameters": {"command": "rm -f junk.txt"}}]}]}'
    )
    factory = SessionFactory(
        make_settings(**{"approvals.timeout": 600}),
        store=store,
        interactor=NonInteractiveInteractor(),
        workspace=tmp_path,
    )
    [session] = factory.create_session("tidy", "follower", plan=plan, session_id="w1")

    async def canceller() -> None:
        while not (store.exists("w1") and await asyncio.to_thread(pending_approvals, store, ["w1"])):
            await asyncio.sleep(0.05)
        await asyncio.to_thread(request_cancel, store, "w1", author="user:ops")

    async def main() -> Any:
        helper = asyncio.create_task(canceller())
        result = await asyncio.wait_for(session.run(), 60)
        await helper
        return result

    result = asyncio.run(main())
    assert result.status == "cancelled" and result.reason == "cancelled by user:ops"
    assert (tmp_path / "junk.txt").exists()  # the waiting command never ran
    [approval] = read_approvals(store, "w1")
    assert approval.status == "refused" and approval.decided_by == "user:ops"
