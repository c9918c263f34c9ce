"""Agents, states and rounds: the three-agent state machine, registries, atomic steps, interactor states."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tests.support.engine import CrashingAgent, RecordingObserver, ScriptedAgent
from tests.support.fakes import FakeDispatcher

from saucer.context import Context, ContextNames
from saucer.engine import (
    Agent,
    AgentSet,
    AgentState,
    AgentStatus,
    ContinueState,
    NonInteractiveInteractor,
    Session,
    UnknownStateError,
)
from saucer.store.memory import MemoryStore


class Planner(Agent):
    async def act(self, context: Context) -> AgentStatus:
        context.update_vars({"plan": "draft, review, redraft"})
        context.append(ContextNames.HOST_MESSAGE, "write the draft")
        self.handoff = "worker"
        return AgentStatus.CONTINUE


class Worker(Agent):
    async def act(self, context: Context) -> AgentStatus:
        context.incr("drafts")
        self.handoff = "reviewer"
        return AgentStatus.CONTINUE


class Reviewer(Agent):
    async def act(self, context: Context) -> AgentStatus:
        if context.get_var("drafts") < 2:
            return "REWORK"
        self.round_result = f"approved after {context.get_var('drafts')} drafts"
        return AgentStatus.FINISH


@Reviewer.register_state
class ReworkState(ContinueState):
    """Only reviewers know REWORK: it sends the next step back to the worker."""

    status = "REWORK"

    async def handle(self, agent: Agent, context: Context) -> None:
        context.update_vars({"feedback": "tighten the intro"})
        agent.status = AgentStatus.CONTINUE.value

    def next_agent(self, agent: Agent) -> Agent:
        return agent.peers["worker"]


def _three_agents() -> AgentSet:
    return AgentSet([Planner("planner"), Worker("worker"), Reviewer("reviewer")])


def test_three_agent_state_machine(settings: Any) -> None:
    store = MemoryStore()
    observer = RecordingObserver()
    session = Session(
        "review", settings=settings, store=store, request="write a note", agents=_three_agents(), observer=observer
    )
    result = asyncio.run(session.run())
    assert result.status == "finished", result
    assert result.reason == "1 round(s) finished"
    steps = [e for e in store.read(session.session_id) if e.meta.get("kind") == "step"]
    # planner → worker → reviewer (REWORK) → reviewer's REWORK state → worker → reviewer (FINISH)
    assert [(e.author, e.meta["state"], e.meta["status"]) for e in steps] == [
        ("planner", "CONTINUE", "CONTINUE"),
        ("worker", "CONTINUE", "CONTINUE"),
        ("reviewer", "CONTINUE", "REWORK"),
        ("reviewer", "REWORK", "CONTINUE"),
        ("worker", "CONTINUE", "CONTINUE"),
        ("reviewer", "CONTINUE", "FINISH"),
    ]
    assert [e.meta["next_agent"] for e in steps] == ["worker", "reviewer", "reviewer", "worker", "reviewer", "reviewer"]
    assert [e.step for e in steps] == [1, 2, 3, 4, 5, 6]
    ctx = Context.open(store, session.session_id, create=False)
    assert ctx.get_var("drafts") == 2 and ctx.get_var("feedback") == "tighten the intro"
    assert ctx.get(ContextNames.SESSION_STEP) == 6
    assert ctx.get(ContextNames.ROUND_STEP) == {0: 6}
    assert ctx.get(ContextNames.ROUND_SUBTASK_AMOUNT) == {0: 1}  # FINISH ends the subtask
    assert ctx.get(ContextNames.ROUND_RESULT) == "approved after 2 drafts"
    assert ctx.get(ContextNames.HOST_MESSAGE) == ["write the draft"]
    kinds = [name for name, _ in observer.events]
    assert kinds == ["session_start", "round_start"] + ["step"] * 6 + ["round_end", "session_end"]


def test_state_registries_are_per_agent_class() -> None:
    assert "REWORK" in Reviewer.states and "REWORK" not in Worker.states and "REWORK" not in Agent.states
    assert "FINISH" in Worker.states  # inherited from Agent
    with pytest.raises(UnknownStateError, match="Worker has no state 'REWORK'"):
        Worker("w").state_for("REWORK")

    # A subclass can replace a state of its parent without touching the parent.
    class Quiet(Agent):
        pass

    @Quiet.register_state
    class QuietFinish(AgentState):
        status = "FINISH"

        async def handle(self, agent: Agent, context: Context) -> None:
            pass

        def is_round_end(self) -> bool:
            return True

    assert type(Quiet("q").state_for("FINISH")) is QuietFinish
    assert type(Agent.states.get("FINISH")).__name__ == "FinishState"
    assert set(AgentStatus.__members__) == {
        "CONTINUE",
        "FINISH",
        "ERROR",
        "FAIL",
        "PENDING",
        "CONFIRM",
        "NO_ACTION",
        "STOP",
    }


def test_step_is_one_atomic_event_with_its_record(settings: Any) -> None:
    store = MemoryStore()
    dispatcher = FakeDispatcher()

    class Tooling(Agent):
        async def act(self, context: Context) -> AgentStatus:
            context.update_vars({"note": "x"})
            await self.dispatch(context, [{"tool_name": "files.write", "parameters": {"path": "a"}}])
            self.add_cost(0.25)
            return AgentStatus.FINISH

    session = Session(
        "atomic", settings=settings, store=store, request="go", agents=Tooling("tool"), dispatcher=dispatcher
    )
    result = asyncio.run(session.run())
    assert result.ok and result.cost.steps == pytest.approx(0.25)
    [step] = [e for e in store.read(session.session_id) if e.meta.get("kind") == "step"]
    keys = step.keys()
    # The agent's write, the ledger and the structural log land in the step's own event.
    assert {
        "vars.note",
        "SESSION_STEP",
        "ROUND_STEP",
        "SESSION_COST",
        "ROUND_COST",
        "ROUND_SUBTASK_AMOUNT",
        "STRUCTURAL_LOGS",
    } <= set(keys)
    assert step.author == "tool" and step.round == 0 and step.step == 1
    assert step.meta["commands"][0]["tool_name"] == "files.write"
    assert step.meta["results"][0]["status"] == "success"
    assert step.meta["cost"] == 0.25
    assert step.meta["cursor"] == {
        "phase": "step",
        "round": 0,
        "plan_index": None,
        "agent": "tool",
        "state": "FINISH",
        "requests": 1,
    }
    ctx = Context.open(store, session.session_id, create=False)
    assert ctx.get(ContextNames.SESSION_COST) == pytest.approx(0.25)
    assert ctx.get(ContextNames.ROUND_COST) == {0: 0.25}
    assert ctx.get(ContextNames.TOOL_INFO)["files.write"]["description"] == "write a file"
    assert ctx.get(ContextNames.MODE) == "normal"


def test_a_crashing_step_commits_nothing_of_its_own_and_ends_the_session_in_error(settings: Any) -> None:
    store = MemoryStore()

    class HandOff(ScriptedAgent):
        async def act(self, context: Context) -> AgentStatus:
            await super().act(context)
            self.handoff = "crasher"
            return AgentStatus.CONTINUE

    agents = AgentSet([HandOff("first", writes={"kept": True}), CrashingAgent("crasher")])
    session = Session("crash", settings=settings, store=store, request="go", agents=agents)
    result = asyncio.run(session.run())
    assert result.status == "error"
    assert "RuntimeError: the agent crashed" in (result.error or "")
    ctx = Context.open(store, session.session_id, create=False)
    assert ctx.get_var("kept") is True
    assert ctx.get_var("half_written") is None  # the crashed step's write was discarded
    steps = [e for e in store.read(session.session_id) if e.meta.get("kind") == "step"]
    assert [e.meta["status"] for e in steps] == ["CONTINUE", "ERROR"]
    assert "the agent crashed" in steps[1].meta["error"]
    assert ctx.get(ContextNames.SESSION_STEP) == 2
    last = list(store.read(session.session_id))[-1]
    assert last.meta["session_status"] == "error" and last.meta["summary"]["status"] == "error"


class Asker(Agent):
    """Asks a question (PENDING), then asks to confirm a sensitive step (CONFIRM)."""

    def __init__(self) -> None:
        super().__init__("asker")
        self.phase = 0

    async def act(self, context: Context) -> AgentStatus:
        self.phase += 1
        if self.phase == 1:
            self.pending_question = "which file?"
            return AgentStatus.PENDING
        if self.phase == 2:
            context.update_vars({"answer": self.answers[-1]})
            self.pending_action, self.pending_target = "delete", "notes.txt"
            return AgentStatus.CONFIRM
        context.update_vars({"deleted": True})
        return AgentStatus.FINISH


class ScriptedInteractor:
    def __init__(self, approve: bool) -> None:
        self.approve = approve
        self.asked: list[Any] = []

    async def question_asker(self, question: str, index: int) -> str:
        self.asked.append(("question", question, index))
        return "notes.txt"

    def sensitive_step_asker(self, action: str, target: str) -> bool:
        self.asked.append(("sensitive", action, target))
        return self.approve


@pytest.mark.parametrize("approve", [True, False])
def test_pending_and_confirm_states_ask_the_interactor(settings: Any, approve: bool) -> None:
    store = MemoryStore()
    interactor = ScriptedInteractor(approve)
    session = Session("ask", settings=settings, store=store, request="go", agents=Asker(), interactor=interactor)
    result = asyncio.run(session.run())
    assert interactor.asked == [("question", "which file?", 0), ("sensitive", "delete", "notes.txt")]
    ctx = Context.open(store, session.session_id, create=False)
    assert ctx.get_var("answer") == "notes.txt"
    if approve:
        assert result.status == "finished" and ctx.get_var("deleted") is True
    else:
        assert result.status == "failed" and ctx.get_var("deleted") is None
        steps = [e for e in store.read(session.session_id) if e.meta.get("kind") == "step"]
        assert "the user declined: delete" in steps[-1].meta["error"]


def test_non_interactive_interactor_defaults() -> None:
    quiet = NonInteractiveInteractor()
    assert quiet.first_request() is None and quiet.new_request() == ("", True)  # UFO's (request, complete)
    assert quiet.experience_asker() is False and quiet.question_asker("q", 0) == ""
    assert quiet.sensitive_step_asker("rm", "x") is False
    assert NonInteractiveInteractor(assume_yes=True).sensitive_step_asker("rm", "x") is True
    queued = NonInteractiveInteractor(requests=["a", "b"])
    assert (queued.first_request(), queued.new_request(), queued.new_request()) == ("a", ("b", False), ("", True))


def test_normal_mode_takes_new_requests_until_the_user_is_done(settings: Any) -> None:
    store = MemoryStore()
    interactor = NonInteractiveInteractor(requests=["first", "second", "third"])
    agent = ScriptedAgent("doer", steps=2)
    session = Session("chat", settings=settings, store=store, agents=agent, interactor=interactor)
    result = asyncio.run(session.run())
    assert result.status == "finished" and result.rounds == 3 and result.steps == 6
    requests = [e.meta["request"] for e in store.read(session.session_id) if e.meta.get("kind") == "round_start"]
    assert requests == ["first", "second", "third"]
    ctx = Context.open(store, session.session_id, create=False)
    assert ctx.get(ContextNames.ROUND_STEP) == {0: 2, 1: 2, 2: 2}


def test_normal_mode_without_any_request_is_a_clear_error(settings: Any) -> None:
    session = Session("empty", settings=settings, agents=ScriptedAgent())
    result = asyncio.run(session.run())
    assert result.status == "error"
    assert "no request was given" in result.reason


def test_ufo_shapes_new_request_rounds_and_public_evaluation(settings: Any) -> None:
    """new_request answers (request, complete) as UFO's does (a plain string still works); Session.rounds is
    UFO's dict of round id -> Round; evaluation() is public and its verdict is kept with the session's end."""
    from saucer.engine import Round
    from saucer.engine.interactor import request_of

    assert request_of(("next", False)) == "next" and request_of(("ignored", True)) is None
    assert request_of("plain") == "plain" and request_of("n") is None and request_of(None) is None

    class Tupled:
        def __init__(self) -> None:
            self.answers = [("second", False), ("", True)]

        def first_request(self) -> str:
            return "first"

        def new_request(self) -> tuple[str, bool]:
            return self.answers.pop(0)

    verdicts: list[Any] = []

    class Judging(ScriptedAgent):
        async def act(self, context: Context) -> AgentStatus:
            verdicts.append(await session.evaluation())
            return await super().act(context)

    store = MemoryStore()
    session = Session("chat", settings=settings, store=store, agents=Judging("doer", steps=1), interactor=Tupled())
    result = asyncio.run(session.run())
    assert result.status == "finished" and result.rounds == 2
    assert sorted(session.rounds) == [0, 1] and all(isinstance(r, Round) for r in session.rounds.values())
    assert [r.request for r in session.rounds.values()] == ["first", "second"]
    assert len(verdicts) == 2 and verdicts[0].scope == "session"
    end = [e for e in store.read(session.session_id) if e.meta.get("kind") == "session_end"][0]
    assert len(end.meta["evaluations"]) == 2 + int(settings.system.eva_session)  # the two asked for, then eva_session's
    after = asyncio.run(session.evaluation())  # an ended session is judged, nothing recorded
    assert after.scope == "session" and len(session.result.evaluations) == len(end.meta["evaluations"])
