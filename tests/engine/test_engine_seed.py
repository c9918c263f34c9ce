"""What a session starts with (issue 26): initial context variables and participants, from
the factory, ``Session(...)`` and a plan; and the UFO calls of seed 003 as a UFO user writes them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tests.support.engine import ScriptedAgent, command_plan
from tests.support.fakes import FakeDispatcher

from saucer.context import Context, ContextNames
from saucer.engine import Session, SessionFactory
from saucer.store import NotParticipantError
from saucer.store.memory import MemoryStore


class ReadsVars(ScriptedAgent):
    """Records the context variables its first step sees."""

    seen: dict[str, Any] = {}

    async def act(self, context: Context) -> Any:
        ReadsVars.seen = dict(context.vars)
        return await super().act(context)


def test_a_session_starts_with_the_plan_vars_then_context_vars_over_them(settings: Any) -> None:
    store = MemoryStore()
    plan = {**command_plan(2), "vars": {"phase": "draft", "retries": 0}}
    factory = SessionFactory(settings, store=store, dispatcher_factory=lambda s: FakeDispatcher())
    [session] = factory.create_session(
        "seeded", "follower", plan, context_vars={"retries": 3, "owner": {"name": "ana"}}
    )
    result = asyncio.run(session.run())
    assert result.status == "finished"
    ctx = Context.open(store, session.session_id, create=False)
    assert dict(ctx.vars) == {"phase": "draft", "retries": 3, "owner": {"name": "ana"}}
    # Set in the session's first event (its start), before any step.
    start = next(iter(store.read(session.session_id)))
    assert start.meta["kind"] == "session_start" and {op.get("var") for op in start.ops} >= {
        "phase",
        "retries",
        "owner",
    }


def test_session_takes_context_vars_and_an_agent_reads_them_at_its_first_step(settings: Any) -> None:
    store = MemoryStore()
    session = Session(
        "t",
        settings=settings,
        store=store,
        request="go",
        agents=ReadsVars("a"),
        dispatcher=FakeDispatcher(),
        context_vars={"mood": "calm"},
    )
    assert asyncio.run(session.run()).status == "finished"
    assert ReadsVars.seen["mood"] == "calm"
    with pytest.raises(TypeError, match=r"vars\.bad"):
        Session("t", settings=settings, store=store, request="go", context_vars={"bad": {1, 2}})


def test_participants_of_a_session_the_engine_runs(settings: Any) -> None:
    store = MemoryStore()
    plan = {**command_plan(1), "participants": ["human:reviewer"]}
    factory = SessionFactory(settings, store=store, dispatcher_factory=lambda s: FakeDispatcher())
    [session] = factory.create_session("p", "follower", plan, participants=["human:bob"], user="user:ana")
    assert asyncio.run(session.run()).status == "finished"  # the engine's own agents always write
    sid = session.session_id
    assert store.session_info(sid).participants == {"human:reviewer", "human:bob", "user:ana"}
    for author in ("user:ana", "human:bob", "human:reviewer"):
        ctx = Context.open(store, sid, author=author, create=False)
        ctx.update_vars(set={author: True})
        ctx.commit()
    eve = Context.open(store, sid, author="human:eve", create=False)
    eve.update_vars(set={"eve": True})
    with pytest.raises(NotParticipantError, match=f"'human:eve' is not a participant of session '{sid}'"):
        eve.commit()
    # A session that names no participants stays open.
    [open_session] = factory.create_session("o", "follower", command_plan(1), user="user:ana")
    asyncio.run(open_session.run())
    assert store.session_info(open_session.session_id).participants is None


# ----------------------------------------------------------- seed 003 (UFO)


def test_create_session_with_an_empty_plan_is_no_plan_as_in_ufo(settings: Any) -> None:
    factory = SessionFactory(
        settings,
        store=MemoryStore(),
        agents=lambda s: ScriptedAgent("llm"),
        dispatcher_factory=lambda s: FakeDispatcher(),
    )
    sessions = factory.create_session("task", "normal", plan="", request="open notepad")
    assert len(sessions) == 1 and sessions[0].plan is None and sessions[0].request == "open notepad"
    assert asyncio.run(sessions[0].run()).status == "finished"


def test_create_service_session_has_ufos_shape(settings: Any) -> None:
    remote = FakeDispatcher()
    store = MemoryStore()
    factory = SessionFactory(settings, store=store, agents=lambda s: ScriptedAgent("llm"))
    session = factory.create_service_session(
        task="remote",
        should_evaluate=False,
        id="svc-1",
        request="list the notes",
        task_protocol=remote,
    )
    assert isinstance(session, Session) and session.session_id == "svc-1" and session.mode == "service"
    assert session.settings.system.eva_session is False
    assert asyncio.run(session.run()).status == "finished"
    assert Context.open(store, "svc-1", create=False).get(ContextNames.REQUEST) == "list the notes"
    evaluated = factory.create_service_session("remote", True, 7, "x", task_protocol=remote)
    assert evaluated.id == 7 and evaluated.settings.system.eva_session is True


def test_a_resumed_session_keeps_what_it_started_with(settings: Any) -> None:
    store = MemoryStore()
    session = Session(
        "t",
        session_id="r1",
        settings=settings,
        store=store,
        request="go",
        agents=ScriptedAgent("a"),
        dispatcher=FakeDispatcher(),
        context_vars={"v": 1},
    )
    asyncio.run(session.run())
    with pytest.raises(TypeError, match="Session.resume takes context_vars from the stored session"):
        Session.resume("r1", store=store, settings=settings, context_vars={"v": 2})
    with pytest.raises(TypeError, match="takes participants from the stored session"):
        Session.resume("r1", store=store, settings=settings, participants=["x"])
