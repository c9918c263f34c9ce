"""Durable session records and the plan runner's resume-at-first-uncommitted-step rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from saucer.dispatch.messages import Command, Result, ResultStatus
from saucer.service.protocol import PlanCommand, PlanStep, TaskSpec
from saucer.service.records import (
    MemorySessionRecordStore,
    SessionRecord,
    SessionStatus,
    SqliteSessionRecordStore,
    StepAlreadyCommitted,
    StepRecord,
    UnknownSession,
)
from saucer.service.runner import PlanTaskRunner, StoreSessionRecorder, step_call_id

pytestmark = pytest.mark.anyio

TASK = TaskSpec(
    task="four steps",
    steps=[PlanStep(subtask=f"s{i}", commands=[PlanCommand(tool_name="echo", parameters={"i": i})]) for i in range(4)],
)


def _record(session_id: str, owner: str = "alice") -> SessionRecord:
    return SessionRecord(session_id=session_id, owner=owner, device_id="dev", task=TASK)


class RecordingDispatcher:
    """Answers every command; fails the ones whose ``i`` is in ``failing``."""

    def __init__(self, failing: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        self.batches: list[list[Command]] = []
        self.failing = failing

    async def execute_commands(self, commands: list[Command], timeout: float) -> list[Result]:
        self.batches.append(commands)
        return [
            Result.failure(c, "boom")
            if c.parameters.get("i") in self.failing
            else Result(status=ResultStatus.SUCCESS, result=c.parameters, call_id=c.call_id)
            for c in commands
        ]


async def test_sqlite_store_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "state" / "sessions.sqlite3"
    store = SqliteSessionRecordStore(path)
    await store.create_session(_record("s1"))
    await store.create_session(_record("s2", owner="bob"))
    await store.update_session("s1", status=SessionStatus.RUNNING, attempts=1)
    await store.commit_step("s1", StepRecord(index=0, subtask="a", status="completed"))
    assert await store.claim_device("dev", "fleet") == "fleet"
    await store.close()

    reopened = SqliteSessionRecordStore(path)
    try:
        record = await reopened.get_session("s1")
        assert record is not None and record.status == SessionStatus.RUNNING and record.attempts == 1
        assert record.task == TASK
        assert [s.index for s in await reopened.steps("s1")] == [0]
        assert [r.session_id for r in await reopened.list_sessions(owner="bob")] == ["s2"]
        assert [r.session_id for r in await reopened.list_sessions(active_only=True)] == ["s1", "s2"]
        await reopened.update_session("s2", status=SessionStatus.COMPLETED)
        assert [r.session_id for r in await reopened.list_sessions(active_only=True)] == ["s1"]
        # Device ownership is pinned durably: the first claim still wins.
        assert await reopened.claim_device("dev", "intruder") == "fleet"
        with pytest.raises(StepAlreadyCommitted):
            await reopened.commit_step("s1", StepRecord(index=0, status="completed"))
        with pytest.raises(UnknownSession):
            await reopened.commit_step("nope", StepRecord(index=0, status="completed"))
        with pytest.raises(ValueError, match="already exists"):
            await reopened.create_session(_record("s1"))
        with pytest.raises(ValueError, match="cannot update"):
            await reopened.update_session("s1", owner_typo="x")
    finally:
        await reopened.close()


async def test_memory_store_refuses_a_second_commit_of_a_step() -> None:
    store = MemorySessionRecordStore()
    await store.create_session(_record("s1"))
    await store.commit_step("s1", StepRecord(index=0, status="completed"))
    with pytest.raises(StepAlreadyCommitted):
        await store.commit_step("s1", StepRecord(index=0, status="completed"))


@pytest.mark.parametrize("store_kind", ["memory", "sqlite"])
async def test_plan_runner_resumes_at_first_uncommitted_step(store_kind: str, tmp_path: Path) -> None:
    store = MemorySessionRecordStore() if store_kind == "memory" else SqliteSessionRecordStore(tmp_path / "s.sqlite3")
    await store.create_session(_record("s1"))
    recorder = StoreSessionRecorder(store, "s1")
    # Steps 0 and 1 were committed by an earlier (crashed) attempt.
    for i in range(2):
        await recorder.commit_step(StepRecord(index=i, subtask=f"s{i}", status="completed"))
    dispatcher = RecordingDispatcher()
    outcome = await PlanTaskRunner().run("s1", TASK, dispatcher, recorder)
    assert outcome.status == "completed"
    assert [[c.parameters["i"] for c in batch] for batch in dispatcher.batches] == [[2], [3]]
    assert [c.call_id for batch in dispatcher.batches for c in batch] == [
        step_call_id("s1", 2, 0),
        step_call_id("s1", 3, 0),
    ]
    assert [s["index"] for s in outcome.results] == [0, 1, 2, 3]
    assert [s.index for s in await store.steps("s1")] == [0, 1, 2, 3]
    # Running again finds everything committed and runs nothing.
    again = RecordingDispatcher()
    assert (await PlanTaskRunner().run("s1", TASK, again, recorder)).status == "completed"
    assert again.batches == []
    await store.close()


async def test_plan_runner_stops_at_a_failed_step_and_never_reruns_it() -> None:
    store = MemorySessionRecordStore()
    await store.create_session(_record("s1"))
    recorder = StoreSessionRecorder(store, "s1")
    dispatcher = RecordingDispatcher(failing={1})
    outcome = await PlanTaskRunner().run("s1", TASK, dispatcher, recorder)
    assert outcome.status == "failed"
    assert outcome.error == "step 1 ('s1') failed: boom"
    assert len(dispatcher.batches) == 2  # steps 2 and 3 never ran
    resumed = RecordingDispatcher()
    outcome = await PlanTaskRunner().run("s1", TASK, resumed, recorder)
    assert outcome.status == "failed" and resumed.batches == []


async def test_plan_runner_refuses_a_plan_without_steps() -> None:
    with pytest.raises(ValueError, match="at least one step"):
        PlanTaskRunner().validate(TaskSpec(task="no steps"))


def test_the_service_says_finished_like_the_cli_and_reads_older_records() -> None:
    """One vocabulary (issue 33): the API's status of a session that ended well is the engine's word."""
    from saucer.engine.session import SessionStatus as EngineStatus
    from saucer.service.records import SessionRecord

    assert SessionStatus.COMPLETED.value == EngineStatus.FINISHED == "finished"
    old = SessionRecord.model_validate_json(
        '{"session_id": "a", "owner": "o", "device_id": "d", "task": {"task": "t", "steps": []}, "status": "completed"}'
    )
    assert old.status is SessionStatus.COMPLETED and old.status.terminal


async def test_a_derived_step_is_recorded_once_and_later_writes_wait_for_the_disk_again(tmp_path: Path) -> None:
    # A derived step (a projection of a durable log) is written without an fsync of its own; the
    # connection must be back at synchronous=FULL afterwards, also when the step is refused.
    path = tmp_path / "sessions.sqlite3"
    store = SqliteSessionRecordStore(path)
    try:
        await store.create_session(_record("s1"))
        await store.commit_step("s1", StepRecord(index=0, subtask="a", status="completed"), derived=True)
        with pytest.raises(StepAlreadyCommitted):
            await store.commit_step("s1", StepRecord(index=0, status="completed"), derived=True)
        synchronous = await store._call(lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0])
        assert synchronous == 2  # FULL
        await store.update_session("s1", status=SessionStatus.COMPLETED)
    finally:
        await store.close()
    reopened = SqliteSessionRecordStore(path)
    try:
        assert [(s.index, s.subtask) for s in await reopened.steps("s1")] == [(0, "a")]
    finally:
        await reopened.close()


async def test_writes_queued_together_share_one_transaction_and_a_refused_one_fails_alone(tmp_path: Path) -> None:
    import asyncio
    import threading

    path = tmp_path / "sessions.sqlite3"
    store = SqliteSessionRecordStore(path)
    try:
        await store.create_session(_record("s1"))
        before = store.transactions
        # Hold the worker thread, so that the writes below queue up behind it.
        gate = threading.Event()
        held = asyncio.ensure_future(store._call(lambda conn: gate.wait(30)))
        await asyncio.sleep(0.05)
        writes = [
            asyncio.ensure_future(store.create_session(_record("s2"))),
            asyncio.ensure_future(store.create_session(_record("s1"))),  # refused: it exists
            asyncio.ensure_future(store.commit_step("s1", StepRecord(index=0, status="completed"))),
            asyncio.ensure_future(store.commit_step("s1", StepRecord(index=0, status="completed"), derived=True)),
            asyncio.ensure_future(store.update_session("s1", status=SessionStatus.RUNNING, attempts=1)),
            asyncio.ensure_future(store.update_session("nope", status=SessionStatus.RUNNING)),  # refused
            asyncio.ensure_future(store.claim_device("dev", "fleet")),
        ]
        gate.set()
        await held
        outcomes = await asyncio.gather(*writes, return_exceptions=True)
        assert store.transactions == before + 1  # one transaction, one fsync, for all of them
        assert outcomes[0] is None
        assert isinstance(outcomes[1], ValueError) and "already exists" in str(outcomes[1])
        assert outcomes[2] is None and isinstance(outcomes[3], StepAlreadyCommitted)
        assert isinstance(outcomes[4], SessionRecord) and outcomes[4].attempts == 1
        assert isinstance(outcomes[5], UnknownSession)
        assert outcomes[6] == "fleet"
    finally:
        await store.close()
    reopened = SqliteSessionRecordStore(path)
    try:
        s1 = await reopened.get_session("s1")
        assert s1 is not None and s1.status == SessionStatus.RUNNING and s1.attempts == 1
        assert await reopened.get_session("s2") is not None
        assert [s.index for s in await reopened.steps("s1")] == [0]
        assert await reopened.claim_device("dev", "intruder") == "fleet"
    finally:
        await reopened.close()


async def test_a_write_after_close_fails_with_a_clear_error(tmp_path: Path) -> None:
    store = SqliteSessionRecordStore(tmp_path / "sessions.sqlite3")
    await store.close()
    with pytest.raises(RuntimeError, match="session record store .* is closed"):
        await store.create_session(_record("s1"))
