"""EngineTaskRunner in one process: engine sessions over an event store, resume, projection, ends."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from saucer.config import load_settings
from saucer.context import Context, ContextNames
from saucer.dispatch.messages import Command, Result, ResultStatus
from saucer.engine.agent import Agent, AgentSet, AgentStatus
from saucer.service.engine_runner import EngineTaskRunner, server_identity
from saucer.service.protocol import PlanCommand, PlanStep, TaskSpec
from saucer.service.records import MemorySessionRecordStore, SessionRecord
from saucer.service.runner import StoreSessionRecorder, TaskOutcome

pytestmark = pytest.mark.anyio

TASK = TaskSpec(
    task="three steps",
    timeout=7.0,
    steps=[
        PlanStep(subtask="a", commands=[PlanCommand(tool_name="echo", parameters={"i": 0})]),
        PlanStep(
            subtask="b",
            commands=[PlanCommand(tool_name="echo", parameters={"i": 1}), PlanCommand(tool_name="echo")],
            timeout=3.0,
        ),
        PlanStep(subtask="c", commands=[PlanCommand(tool_name="echo", parameters={"i": 2})]),
    ],
)


@pytest.fixture(autouse=True)
def _no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SAUCER_LLM_MODEL", "SAUCER_LLM_BASE_URL", "SAUCER_LLM_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)


def _settings(**overrides: Any) -> Any:
    return load_settings(overrides={"logs.enabled": False, "store.url": "memory://", **overrides})


class Device:
    """Answers every command; fails ``i`` in ``failing``; blocks forever on ``i`` in ``hang``."""

    def __init__(self, failing: set[int] | None = None, hang: set[int] | None = None) -> None:
        self.batches: list[tuple[list[Command], float | None]] = []
        self.failing = failing or set()
        self.hang = hang or set()

    async def execute_commands(self, commands: list[Command], timeout: float | None = None) -> list[Result]:
        self.batches.append(([c.model_copy() for c in commands], timeout))
        if any(c.parameters.get("i") in self.hang for c in commands):
            await asyncio.Event().wait()
        return [
            Result.failure(c, "boom")
            if c.parameters.get("i") in self.failing
            else Result(status=ResultStatus.SUCCESS, result=c.parameters, call_id=c.call_id)
            for c in commands
        ]


async def _records(session_id: str, task: TaskSpec = TASK) -> tuple[MemorySessionRecordStore, StoreSessionRecorder]:
    records = MemorySessionRecordStore()
    await records.create_session(SessionRecord(session_id=session_id, owner="alice", device_id="d", task=task))
    return records, StoreSessionRecorder(records, session_id)


def _kinds(runner: EngineTaskRunner, session_id: str) -> list[str]:
    return [e.meta.get("kind", "") for e in runner.store.read(session_id)]


async def test_a_plan_runs_as_an_engine_session_with_deterministic_call_ids_and_step_timeouts() -> None:
    runner = EngineTaskRunner(_settings(), default_step_timeout=11.0)
    sid = uuid.uuid4().hex
    records, recorder = await _records(sid)
    device = Device()
    outcome = await runner.run(sid, TASK, device, recorder)
    assert outcome.status == "completed", outcome.error
    assert [[c.call_id for c in batch] for batch, _ in device.batches] == [
        [f"{sid}.0.0"],
        [f"{sid}.1.0", f"{sid}.1.1"],
        [f"{sid}.2.0"],
    ]
    assert [timeout for _, timeout in device.batches] == [7.0, 3.0, 7.0]  # step's, else the task's
    steps = await records.steps(sid)
    assert [(s.index, s.subtask, s.status) for s in steps] == [
        (0, "a", "completed"),
        (1, "b", "completed"),
        (2, "c", "completed"),
    ]
    assert outcome.results == [s.model_dump(mode="json") for s in steps]
    # The Context is durable in the event store under the service session id.
    ctx = Context.open(runner.store, sid, create=False)
    assert ctx.get(ContextNames.MODE) == "service"
    assert ctx.get(ContextNames.SESSION_STEP) == 3
    assert [s["subtask"] for s in ctx.get(ContextNames.PREVIOUS_SUBTASKS)] == ["a", "b", "c"]
    step_events = [e for e in runner.store.read(sid) if e.meta.get("kind") == "step"]
    # The recorded commands carry the ids the device saw.
    assert [[c["call_id"] for c in e.meta["commands"]] for e in step_events] == [
        [f"{sid}.0.0"],
        [f"{sid}.1.0", f"{sid}.1.1"],
        [f"{sid}.2.0"],
    ]
    assert _kinds(runner, sid)[-1] == "session_end"
    await runner.close()


async def test_a_failed_step_fails_the_session_naming_the_step_and_the_error() -> None:
    runner = EngineTaskRunner(_settings())
    sid = uuid.uuid4().hex
    records, recorder = await _records(sid)
    outcome = await runner.run(sid, TASK, Device(failing={1}), recorder)
    assert outcome.status == "failed"
    assert outcome.error == "step 1 ('b') failed: boom"
    assert [(s.index, s.status) for s in await records.steps(sid)] == [(0, "completed"), (1, "failed")]
    assert [e.meta.get("session_status") for e in runner.store.read(sid)][-1] == "failed"


async def test_an_interrupted_session_resumes_at_its_first_uncommitted_step_with_the_same_call_ids(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    sid = uuid.uuid4().hex
    records, recorder = await _records(sid)
    first = EngineTaskRunner(_settings(), store=url, owner="saucer-serve:one")
    stuck = Device(hang={1})
    run = asyncio.create_task(first.run(sid, TASK, stuck, recorder))
    async with asyncio.timeout(10):
        while len(stuck.batches) < 2:
            await asyncio.sleep(0.01)
    run.cancel()  # the server stops mid-step 1
    with pytest.raises(asyncio.CancelledError):
        await run
    await first.close()
    assert [s.index for s in await records.steps(sid)] == [0]

    second = EngineTaskRunner(_settings(), store=url, owner="saucer-serve:two")
    device = Device()
    outcome = await second.run(sid, TASK, device, recorder)
    assert outcome.status == "completed", outcome.error
    # Step 0 was not asked again; step 1 was asked again with the very same call_ids.
    assert [[c.call_id for c in batch] for batch, _ in device.batches] == [[f"{sid}.1.0", f"{sid}.1.1"], [f"{sid}.2.0"]]
    assert [c.call_id for c in stuck.batches[1][0]] == [f"{sid}.1.0", f"{sid}.1.1"]
    kinds = _kinds(second, sid)
    assert kinds.count("session_start") == 1 and kinds.count("session_resume") == 1
    assert [e.meta["plan_index"] for e in second.store.read(sid) if e.meta.get("kind") == "step"] == [0, 1, 2]
    await second.close()


async def test_a_restarted_server_takes_its_sessions_leases_back_at_once(tmp_path: Path) -> None:
    state = tmp_path / "state"
    identity = server_identity(state)
    assert server_identity(state) == identity != server_identity(tmp_path / "other")
    url = f"sqlite:///{tmp_path / 'events.db'}"
    sid = uuid.uuid4().hex
    records, recorder = await _records(sid)
    dead = EngineTaskRunner(_settings(), store=url, owner=identity)
    stuck = Device(hang={0})
    run = asyncio.create_task(dead.run(sid, TASK, stuck, recorder))
    async with asyncio.timeout(10):
        while not stuck.batches:
            await asyncio.sleep(0.01)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    # As after a SIGKILL, when nothing is released: the dead server's lease runs for another minute.
    dead.store.acquire_lease(sid, identity, 60.0)

    stranger = EngineTaskRunner(_settings(), store=url, owner="saucer-serve:someone-else", lease_wait=0.1)
    refused = await stranger.run(sid, TASK, Device(), recorder)
    assert refused.status == "failed" and identity in (refused.error or "")
    await stranger.close()

    restarted = EngineTaskRunner(_settings(), store=url, owner=server_identity(state), lease_wait=0.1)
    outcome = await restarted.run(sid, TASK, Device(), recorder)
    assert outcome.status == "completed", outcome.error
    await restarted.close()
    await dead.close()


async def test_sync_steps_rebuilds_step_records_the_event_store_has() -> None:
    runner = EngineTaskRunner(_settings())
    sid = uuid.uuid4().hex
    records, recorder = await _records(sid)
    assert (await runner.run(sid, TASK, Device(), recorder)).status == "completed"
    # A server that died between an event and its projection: the records lag behind.
    fresh, fresh_recorder = await _records(sid)
    assert await runner.sync_steps(sid, fresh_recorder) == 3
    assert await runner.sync_steps(sid, fresh_recorder) == 0
    rebuilt = [s.model_dump(exclude={"committed_at"}) for s in await fresh.steps(sid)]
    assert rebuilt == [s.model_dump(exclude={"committed_at"}) for s in await records.steps(sid)]


async def test_a_cancelled_session_ends_in_the_event_store_too() -> None:
    runner = EngineTaskRunner(_settings())
    sid = uuid.uuid4().hex
    records, recorder = await _records(sid)
    stuck = Device(hang={1})
    run = asyncio.create_task(runner.run(sid, TASK, stuck, recorder))
    async with asyncio.timeout(10):
        while len(stuck.batches) < 2:
            await asyncio.sleep(0.01)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    cancelled = TaskOutcome(status="cancelled", error="cancelled by its owner")
    await runner.record_end(sid, cancelled)
    await runner.record_end(sid, cancelled)  # once only
    ends = [e.meta for e in runner.store.read(sid) if e.meta.get("kind") == "session_end"]
    assert [(m["session_status"], m["error"]) for m in ends] == [("cancelled", "cancelled by its owner")]
    # Resuming an ended session runs nothing and reports how it ended.
    device = Device()
    again = await runner.run(sid, TASK, device, recorder)
    assert (again.status, again.error, device.batches) == ("cancelled", "cancelled by its owner", [])


async def test_a_request_without_a_model_fails_with_what_to_configure() -> None:
    runner = EngineTaskRunner(_settings())
    sid = uuid.uuid4().hex
    task = TaskSpec(task="tidy my notes")
    records, recorder = await _records(sid, task)
    outcome = await runner.run(sid, task, Device(), recorder)
    assert outcome.status == "failed"
    assert "SAUCER_LLM_MODEL" in (outcome.error or ""), outcome.error
    end = list(runner.store.read(sid))[-1].meta
    assert end["kind"] == "session_end" and end["session_status"] == "error" and "SAUCER_LLM_MODEL" in end["error"]


class EchoAgent(Agent):
    """Runs one command echoing the request, then finishes."""

    async def act(self, context: Context) -> AgentStatus:
        await self.dispatch(
            context, [Command(tool_name="echo", parameters={"request": context.get(ContextNames.REQUEST)})]
        )
        return AgentStatus.FINISH


async def test_a_request_runs_through_the_agent_provider() -> None:
    runner = EngineTaskRunner(_settings(), agents=AgentSet([EchoAgent("echo-agent")]))
    sid = uuid.uuid4().hex
    task = TaskSpec(task="say hello")
    records, recorder = await _records(sid, task)
    device = Device()
    outcome = await runner.run(sid, task, device, recorder)
    assert outcome.status == "completed", outcome.error
    assert [[(c.parameters, c.call_id) for c in batch] for batch, _ in device.batches] == [
        [({"request": "say hello"}, f"{sid}.0.0.0.0")]
    ]
    assert [s.results[0].result for s in await records.steps(sid)] == [{"request": "say hello"}]


async def test_steps_without_commands_are_refused() -> None:
    runner = EngineTaskRunner(_settings())
    with pytest.raises(ValueError, match="task.steps.1: a step needs at least one command"):
        runner.validate(TaskSpec(task="x", steps=[TASK.steps[0], PlanStep(subtask="empty")]))


async def test_a_session_whose_event_store_is_gone_is_not_started_over() -> None:
    first = EngineTaskRunner(_settings())
    sid = uuid.uuid4().hex
    records, recorder = await _records(sid)
    assert (await first.run(sid, TASK, Device(failing={2}), recorder)).status == "failed"
    other = EngineTaskRunner(_settings())  # another (empty) event store, e.g. a restart with another --store
    device = Device()
    outcome = await other.run(sid, TASK, device, recorder)
    assert outcome.status == "failed" and "3 committed step(s) but no engine session" in (outcome.error or "")
    assert device.batches == []


async def test_sessions_resume_over_postgresql_too() -> None:
    url = os.environ.get("SAUCER_TEST_POSTGRES_URL")
    if not url:
        hint = "set SAUCER_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:5432/test to run the PostgreSQL tests"
        if os.environ.get("CI") == "true":
            pytest.fail(f"SAUCER_TEST_POSTGRES_URL is not set under CI=true; {hint}")
        pytest.skip(hint)
    import psycopg
    from psycopg import sql

    schema = "svc_" + uuid.uuid4().hex[:12]
    store_url = f"{url}{'&' if '?' in url else '?'}schema={schema}"
    try:
        sid = uuid.uuid4().hex
        records, recorder = await _records(sid)
        first = EngineTaskRunner(_settings(), store=store_url)
        stuck = Device(hang={1})
        run = asyncio.create_task(first.run(sid, TASK, stuck, recorder))
        async with asyncio.timeout(20):
            while len(stuck.batches) < 2:
                await asyncio.sleep(0.01)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        await first.close()
        second = EngineTaskRunner(_settings(), store=store_url)
        device = Device()
        assert (await second.run(sid, TASK, device, recorder)).status == "completed"
        assert [[c.call_id for c in batch] for batch, _ in device.batches] == [
            [f"{sid}.1.0", f"{sid}.1.1"],
            [f"{sid}.2.0"],
        ]
        assert [e.meta["plan_index"] for e in second.store.read(sid) if e.meta.get("kind") == "step"] == [0, 1, 2]
        await second.close()
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


class _FlagRecorder(StoreSessionRecorder):
    """Notes how each step was committed (``derived`` or not)."""

    def __init__(self, records: MemorySessionRecordStore, session_id: str) -> None:
        super().__init__(records, session_id)
        self.flags: list[bool] = []

    async def commit_step(self, step: Any, *, derived: bool = False) -> None:
        self.flags.append(derived)
        await super().commit_step(step, derived=derived)


@pytest.mark.parametrize("durable", [True, False])
async def test_the_step_projection_waits_for_the_disk_only_when_the_event_store_cannot_rebuild_it(
    tmp_path: Path, durable: bool
) -> None:
    # A projected step need not be fsync'd when the event store outlives the process (sync_steps
    # rebuilds it); over a memory:// event store the records are the only durable copy.
    url = f"sqlite:///{tmp_path / 'events.db'}" if durable else "memory://"
    runner = EngineTaskRunner(_settings(**{"store.url": url}))
    sid = uuid.uuid4().hex
    records, _ = await _records(sid)
    recorder = _FlagRecorder(records, sid)
    try:
        outcome = await runner.run(sid, TASK, Device(), recorder)
    finally:
        await runner.close()
    assert outcome.status == "completed", outcome.error
    assert recorder.flags == [durable] * 3
    assert [s.index for s in await records.steps(sid)] == [0, 1, 2]


async def test_record_end_reads_nothing_after_a_run_that_committed_its_end() -> None:
    runner = EngineTaskRunner(_settings())
    heads: list[list[str]] = []
    original = runner.store.session_heads

    def counted(ids: Any, *args: Any, **kwargs: Any) -> Any:
        heads.append(list(ids))
        return original(ids, *args, **kwargs)

    runner.store.session_heads = counted  # type: ignore[method-assign]
    sid = uuid.uuid4().hex
    _, recorder = await _records(sid)
    outcome = await runner.run(sid, TASK, Device(), recorder)
    assert outcome.status == "completed", outcome.error
    await runner.record_end(sid, outcome)
    assert heads == []  # the engine committed the end: nothing to read, nothing to add
    assert _kinds(runner, sid).count("session_end") == 1
    # Asked again (the id was forgotten), it reads the log, finds the end and adds none.
    await runner.record_end(sid, outcome)
    assert heads == [[sid]] and _kinds(runner, sid).count("session_end") == 1
    # (a run that did not end it, e.g. cancelled: test_a_cancelled_session_ends_in_the_event_store_too)


async def test_a_fresh_session_is_run_without_looking_for_an_earlier_run() -> None:
    runner = EngineTaskRunner(_settings())
    looked: list[str] = []
    exists = runner.store.exists

    def counted(session_id: str) -> bool:
        looked.append(session_id)
        return exists(session_id)

    runner.store.exists = counted  # type: ignore[method-assign]

    async def first_run(fresh: bool) -> tuple[int, list[str], MemorySessionRecordStore, StoreSessionRecorder]:
        sid = uuid.uuid4().hex
        records, _ = await _records(sid)
        reads: list[str] = []
        steps = records.steps

        async def counted_steps(session_id: str) -> Any:
            reads.append(session_id)
            return await steps(session_id)

        records.steps = counted_steps  # type: ignore[method-assign]
        recorder = StoreSessionRecorder(records, sid, fresh=fresh)
        before = len(looked)
        outcome = await runner.run(sid, TASK, Device(), recorder)
        assert outcome.status == "completed", outcome.error
        records.steps = steps  # type: ignore[method-assign]
        return len(looked) - before, reads, records, recorder

    looks, reads, records, fresh = await first_run(True)
    other_looks, other_reads, _, _ = await first_run(False)
    # Neither the event store (the runner's check) nor the step records were asked.
    assert (looks, reads) == (other_looks - 1, []) and len(other_reads) == 1
    sid = fresh.session_id
    stored = await records.steps(sid)
    assert [s.model_dump() for s in await fresh.completed_steps()] == [s.model_dump() for s in stored]
    assert [s.index for s in stored] == [0, 1, 2]
    # Run again (after a restart: not fresh), it finds the session ended and runs nothing.
    device = Device()
    again = await runner.run(sid, TASK, device, StoreSessionRecorder(records, sid))
    assert again.status == "completed" and device.batches == []


@pytest.mark.parametrize(
    ("session_logs", "plan_folder", "request_folder"),
    [("auto", False, True), (True, True, True), (False, False, False)],
)
async def test_session_logs_says_which_sessions_write_a_log_folder(
    tmp_path: Path, session_logs: Any, plan_folder: bool, request_folder: bool
) -> None:
    settings = _settings(**{"logs.enabled": True, "logs.root": str(tmp_path / "logs")})
    runner = EngineTaskRunner(settings, agents=AgentSet([EchoAgent("echo-agent")]), session_logs=session_logs)
    for task, wanted in ((TASK, plan_folder), (TaskSpec(task="say hello"), request_folder)):
        sid = uuid.uuid4().hex
        _, recorder = await _records(sid, task)
        outcome = await runner.run(sid, task, Device(), recorder)
        assert outcome.status == "completed", outcome.error
        folders = list((tmp_path / "logs").glob(f"*/{sid}"))
        assert bool(folders) is wanted, (task.task, folders)
        if wanted:
            assert (folders[0] / "response.log").is_file() and (folders[0] / "output.md").is_file()
        # A session without a folder does not say that output.md was skipped: it was not asked for.
        end = list(runner.store.read(sid))[-1].meta
        assert "log_to_markdown" not in (end.get("skipped") or {})


@pytest.mark.parametrize("durable", [True, False])
async def test_record_end_says_whether_a_durable_log_holds_the_end(tmp_path: Path, durable: bool) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}" if durable else "memory://"
    runner = EngineTaskRunner(_settings(**{"store.url": url}))
    try:
        sid = uuid.uuid4().hex
        assert not await runner.has_ended(sid)  # no such session
        _, recorder = await _records(sid)
        outcome = await runner.run(sid, TASK, Device(), recorder)
        assert await runner.has_ended(sid)
        # The run committed its end; only a log that outlives the process lets the end record skip the disk.
        assert await runner.record_end(sid, outcome) is durable
        assert await runner.record_end(sid, outcome) is durable  # asked again: read, found
        hung = uuid.uuid4().hex
        _, recorder = await _records(hung)
        device = Device(hang={0})
        task = asyncio.create_task(runner.run(hung, TASK, device, recorder))
        for _ in range(600):  # until the device holds the first command (the session has started), at most 30 s
            if device.batches:
                break
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not await runner.has_ended(hung)
        assert await runner.record_end(hung, TaskOutcome(status="cancelled", error="stop")) is durable
        assert await runner.has_ended(hung)
        assert not await runner.record_end(uuid.uuid4().hex, TaskOutcome(status="failed"))  # never ran: nothing
    finally:
        await runner.close()
