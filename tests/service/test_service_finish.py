"""A session's end and step records when they are projections of the event store: the long-poll answers the
end without waiting for the record's write, whatever is read after it sees it, and a failed write is logged."""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.support.fakes import FakeDispatcher
from tests.support.service import ALICE, FLEET

from saucer.config import load_settings
from saucer.service.device import DeviceClient
from saucer.service.engine_runner import EngineTaskRunner
from saucer.service.protocol import PlanCommand, PlanStep, TaskSpec
from saucer.service.records import MemorySessionRecordStore, SessionRecord, SqliteSessionRecordStore, StepRecord
from saucer.service.runner import StoreSessionRecorder
from saucer.service.server import ServiceConfig, running_server

pytestmark = pytest.mark.anyio

PLAN = {"task": "two steps", "steps": [{"commands": [{"tool_name": "echo", "parameters": {"i": i}}]} for i in (0, 1)]}


class _FailingEndStore(SqliteSessionRecordStore):
    """Refuses the write of a session's end when it is a projection (``derived``)."""

    async def update_session(self, session_id: str, *, derived: bool = False, **changes: Any) -> SessionRecord:
        if derived:
            raise RuntimeError("disk full")
        return await super().update_session(session_id, derived=derived, **changes)


async def _run_one(tmp_path: Path, store: SqliteSessionRecordStore) -> tuple[Any, dict[str, Any]]:
    config = ServiceConfig(
        port=0,
        tokens={"alice": ALICE, "fleet": FLEET},
        state_dir=tmp_path / "state",
        devices={"d1": {"principals": ["alice"]}},
        heartbeat_interval=0.5,
    )
    async with running_server(config, store=store) as server:
        stop = asyncio.Event()
        device = asyncio.create_task(DeviceClient(server.ws_url, FLEET, "d1", FakeDispatcher(), stop=stop).run())
        try:
            async with asyncio.timeout(20):
                while (d := server.state.hub.get("d1")) is None or not d.online:
                    await asyncio.sleep(0.01)
            async with httpx.AsyncClient(
                base_url=server.http_url, headers={"Authorization": f"Bearer {ALICE}"}
            ) as http:
                created = await http.post("/api/sessions", json={"device_id": "d1", "task": PLAN})
                assert created.status_code == 201, created.text
                sid = created.json()["session_id"]
                answer = (await http.get(f"/api/sessions/{sid}", params={"wait": 20})).json()
                # Read at once after the answer: the store has what the answer said.
                stored = await store.get_session(sid)
                steps = await store.steps(sid)
            return (stored, steps), answer
        finally:
            stop.set()
            await asyncio.wait_for(device, 10)


async def test_the_end_is_answered_with_the_record_the_store_then_holds(tmp_path: Path) -> None:
    store = SqliteSessionRecordStore(tmp_path / "records.sqlite3")
    try:
        (stored, steps), answer = await _run_one(tmp_path, store)
    finally:
        await store.close()
    assert answer["session"]["status"] == "finished", answer
    assert stored is not None and stored.model_dump(mode="json") == answer["session"]
    assert [s.index for s in steps] == [0, 1] and [s["index"] for s in answer["steps"]] == [0, 1]


async def test_a_failed_end_record_is_logged_and_the_end_still_answered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = _FailingEndStore(tmp_path / "records.sqlite3")
    with caplog.at_level(logging.ERROR, logger="saucer.service.server"):
        try:
            (stored, _), answer = await _run_one(tmp_path, store)
        finally:
            await store.close()
    assert answer["session"]["status"] == "finished", answer
    assert stored is not None and stored.status.value == "running"  # the event store holds the end: rehydrate
    assert any("could not record the end of session" in r.getMessage() for r in caplog.records)


class _RefusingRecorder(StoreSessionRecorder):
    """Refuses the record of step ``refuse``."""

    def __init__(self, store: MemorySessionRecordStore, session_id: str, refuse: int) -> None:
        super().__init__(store, session_id, fresh=True)
        self.refuse = refuse

    async def commit_step(self, step: StepRecord, *, derived: bool = False) -> None:
        await asyncio.sleep(0)  # written later than the engine goes on
        if step.index == self.refuse:
            raise RuntimeError("disk full")
        await super().commit_step(step, derived=derived)


async def test_a_step_projection_that_fails_is_logged_and_the_others_are_written_in_order(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runner = EngineTaskRunner(
        load_settings(overrides={"logs.enabled": False, "store.url": f"sqlite:///{tmp_path}/e.db"})
    )
    task = TaskSpec(
        task="three", steps=[PlanStep(commands=[PlanCommand(tool_name="echo", parameters={"i": i})]) for i in range(3)]
    )
    sid = uuid.uuid4().hex
    records = MemorySessionRecordStore()
    await records.create_session(SessionRecord(session_id=sid, owner="alice", device_id="d", task=task))
    try:
        with caplog.at_level(logging.WARNING, logger="saucer.service.engine"):
            outcome = await runner.run(sid, task, FakeDispatcher(), _RefusingRecorder(records, sid, refuse=1))
    finally:
        await runner.close()
    assert outcome.status == "completed", outcome.error
    assert [s.index for s in await records.steps(sid)] == [0, 2]
    assert [r["index"] for r in outcome.results] == [0, 2]
    assert any(f"session {sid}: step 1 is not in the session records" in r.getMessage() for r in caplog.records)


class _FailingCreateStore(SqliteSessionRecordStore):
    """Fails the write of a new session's record, after the runner has had time to start."""

    async def create_session(self, record: SessionRecord) -> None:
        await asyncio.sleep(0.5)
        raise RuntimeError("disk full")


async def test_a_session_whose_record_cannot_be_written_sends_nothing_to_its_device(tmp_path: Path) -> None:
    store = _FailingCreateStore(tmp_path / "records.sqlite3")
    config = ServiceConfig(
        port=0,
        tokens={"alice": ALICE, "fleet": FLEET},
        state_dir=tmp_path / "state",
        devices={"d1": {"principals": ["alice"]}},
    )
    dispatcher = FakeDispatcher()
    try:
        async with running_server(config, store=store) as server:
            stop = asyncio.Event()
            device = asyncio.create_task(DeviceClient(server.ws_url, FLEET, "d1", dispatcher, stop=stop).run())
            try:
                async with asyncio.timeout(20):
                    while (d := server.state.hub.get("d1")) is None or not d.online:
                        await asyncio.sleep(0.01)
                headers = {"Authorization": f"Bearer {ALICE}"}
                async with httpx.AsyncClient(base_url=server.http_url, headers=headers) as http:
                    created = await http.post("/api/sessions", json={"device_id": "d1", "task": PLAN})
                assert created.status_code == 500
                await asyncio.sleep(0.5)  # what a started runner would have sent by now
                assert dispatcher.ran == [] and server.state.sessions._active == {}
            finally:
                stop.set()
                await asyncio.wait_for(device, 10)
    finally:
        await store.close()
