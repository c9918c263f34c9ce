"""Logs: the schema read back, one folder per run, structural logs, markdown, request/evaluation logs."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from tests.support.engine import ScriptedAgent, command_plan
from tests.support.fakes import FakeDispatcher

from saucer.context import Context, ContextNames
from saucer.engine import (
    Agent,
    AgentStatus,
    EvaluationLogEntry,
    RequestLogEntry,
    Session,
    StepRecord,
    read_evaluation_log,
    read_request_log,
    read_step_log,
)
from saucer.engine.step_format import STEP_FORMAT
from saucer.store.memory import MemoryStore


def test_response_log_reads_back_with_the_same_schema_as_the_events(make_settings: Any) -> None:
    settings = make_settings(**{"system.eva_round": True, "system.log_to_markdown": True})
    store = MemoryStore()
    session = Session(
        "logs", mode="follower", settings=settings, store=store, plan=command_plan(3), dispatcher=FakeDispatcher()
    )
    result = asyncio.run(session.run())
    path = Path(result.log_path)
    assert path == settings.logs.root.resolve() / "logs" / session.session_id
    assert path.is_absolute()
    records = list(read_step_log(path))
    assert len(records) == 3 and all(isinstance(r, StepRecord) for r in records)
    assert [(r.round, r.step, r.session_step, r.agent, r.state, r.status) for r in records] == [
        (0, 1, 1, "follower", "CONTINUE", "FINISH"),
        (1, 1, 2, "follower", "CONTINUE", "FINISH"),
        (2, 1, 3, "follower", "CONTINUE", "FINISH"),
    ]
    first = records[0]
    assert first.commands[0]["tool_name"] == "files.write" and first.commands[0]["parameters"] == {"i": 0}
    assert first.results[0]["status"] == "success"
    assert set(first.timings) == {"handle_ms", "commit_ms", "total_ms"} and first.timings["total_ms"] >= 0
    assert first.session_id == session.session_id and first.subtask == "step 0" and first.plan_index == 0
    # The event meta of each step is the same record (compact), readable by the same schema.
    events = [e for e in store.read(session.session_id) if e.meta.get("kind") == "step"]
    for record, event in zip(records, events, strict=False):
        from_meta = StepRecord.from_dict(event.meta)
        assert from_meta.commands == record.commands and from_meta.results == record.results
        assert (from_meta.round, from_meta.step, from_meta.agent, from_meta.status) == (
            record.round,
            record.step,
            record.agent,
            record.status,
        )
        assert record.version == event.version
    # Every line is plain JSON with the schema's field names, and its step format.
    line = json.loads((path / "response.log").read_text().splitlines()[0])
    assert list(line) == [*StepRecord.__dataclass_fields__, "step_format"] and line["step_format"] == STEP_FORMAT
    assert all(e.meta["step_format"] == STEP_FORMAT for e in events)
    # evaluation.log: one verdict per round, then the session's (eva_session is on by default), readable through its schema.
    verdicts = list(read_evaluation_log(path))
    assert [(v.scope, v.round, v.complete) for v in verdicts] == [
        ("round", 0, "yes"),
        ("round", 1, "yes"),
        ("round", 2, "yes"),
        ("session", None, "yes"),
    ]
    markdown = (path / "output.md").read_text()
    assert "## Round 2" in markdown and "`files.write`" in markdown and "status: finished" in markdown


def test_structural_logs_are_filled_with_round_and_subtask_keys(settings: Any) -> None:
    store = MemoryStore()
    session = Session(
        "structural", mode="follower", settings=settings, store=store, plan=command_plan(2), dispatcher=FakeDispatcher()
    )
    asyncio.run(session.run())
    ctx = Context.open(store, session.session_id, create=False)
    logs = ctx.get(ContextNames.STRUCTURAL_LOGS)
    assert sorted(logs) == [0, 1] and all(sorted(v) == [0] for v in logs.values())
    assert ctx.filter_structural_logs(1, 0, "Commands") == [["files.write"]]
    assert ctx.filter_structural_logs(0, 0, ["Round", "SubtaskIndex", "Agent", "Status", "Subtask"]) == [
        {"Round": 0, "SubtaskIndex": 0, "Agent": "follower", "Status": "FINISH", "Subtask": "step 0"}
    ]
    # Survives a JSON round trip of the Context (int keys stay ints).
    again = Context.from_dict(json.loads(json.dumps(ctx.to_dict(ensure_serializable=True))))
    assert again.filter_structural_logs(1, 0, "Results") == [["success"]]


def test_each_run_gets_its_own_folder_and_resume_continues_its_own(make_settings: Any) -> None:
    settings = make_settings()
    store = MemoryStore()
    a = asyncio.run(
        Session(
            "same", settings=settings, store=store, request="x", agents=ScriptedAgent(steps=2), session_id="same-1"
        ).run()
    )
    # A new session that happens to reuse an id (another store) never writes into the old folder.
    b = asyncio.run(
        Session(
            "same",
            settings=settings,
            store=MemoryStore(),
            request="x",
            agents=ScriptedAgent(steps=2),
            session_id="same-1",
        ).run()
    )
    assert a.log_path != b.log_path and b.log_path.endswith("same-1-2")
    assert len(list(read_step_log(a.log_path))) == 2 and len(list(read_step_log(b.log_path))) == 2


def test_request_logger_and_text_logger_reach_their_files(settings: Any) -> None:
    class Talker(Agent):
        async def act(self, context: Context) -> AgentStatus:
            entry = RequestLogEntry(
                round=0,
                step=1,
                agent="talker",
                model="m",
                prompt=[{"role": "user", "content": "hi"}],
                response="hello",
                prompt_tokens=3,
                completion_tokens=1,
                cost=0.001,
                latency_ms=12.5,
            )
            context.get(ContextNames.REQUEST_LOGGER).info(entry.model_dump_json())
            context.get(ContextNames.LOGGER).warning("talked once")
            return AgentStatus.FINISH

    result = asyncio.run(Session("talk", settings=settings, request="hi", agents=Talker()).run())
    [entry] = list(read_request_log(result.log_path))
    assert entry.model == "m" and entry.prompt_tokens == 3 and entry.cost == 0.001
    text = (Path(result.log_path) / "session.log").read_text()
    assert text == "WARNING talked once\n"
    # Session loggers are not registered globally (1,000 sessions must not leak 3,000 loggers).
    assert not any(name.startswith("saucer.session") for name in logging.root.manager.loggerDict)


def test_logs_can_be_turned_off(make_settings: Any) -> None:
    result = asyncio.run(
        Session("quiet", settings=make_settings(**{"logs.enabled": False}), request="x", agents=ScriptedAgent()).run()
    )
    assert result.ok and result.log_path is None
    assert not (Path.cwd() / "logs").exists() or not any((Path.cwd() / "logs").rglob("response.log"))


def test_log_schema_errors_name_the_line(tmp_path: Path) -> None:
    (tmp_path / "response.log").write_text('{"session_id": "s"}\n')
    with pytest.raises(ValueError, match="response.log:1: not a step record"):
        list(read_step_log(tmp_path))
    assert EvaluationLogEntry(scope="session").complete == "unsure"


def test_output_md_renders_the_lines_as_written_without_reading_them_back(tmp_path: Path) -> None:
    from saucer.engine.logs import RESPONSE_LOG, SessionLogs, read_step_log

    secret = "sk-" + "a1b2c3d4e5" * 4
    record = StepRecord(
        session_id="s",
        round=0,
        step=1,
        session_step=1,
        agent="follower",
        state="CONTINUE",
        commands=[{"tool_name": "shell.run", "parameters": {"cmd": f"echo {secret}"}}],
        results=[{"status": "success", "result": {"api_key": secret}}],
    )
    fresh = SessionLogs.create(tmp_path, "task", "s")
    fresh.write_step(record)
    fresh.write_step({**record.to_dict(), "session_step": 2, "step": 2})
    assert fresh.path is not None
    written = list(read_step_log(fresh.path))
    (fresh.path / RESPONSE_LOG).unlink()  # what output.md renders is kept as written, not read back
    assert fresh.step_records() == written
    assert secret not in repr(written) and [r.session_step for r in written] == [1, 2]
    fresh.close()
    # A reopened folder (a resumed run) holds lines of an earlier run: they are read from the file.
    again = SessionLogs.create(tmp_path, "task", "t")
    again.write_step(record)
    again.close()
    assert again.path is not None
    reopened = SessionLogs.reopen(again.path)
    reopened.write_step({**record.to_dict(), "session_step": 2, "step": 2})
    assert [r.session_step for r in reopened.step_records()] == [1, 2]
    reopened.close()
    assert SessionLogs.disabled().step_records() == []
