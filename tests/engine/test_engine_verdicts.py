"""Verdicts the engine can be trusted on: retry of a failed step, continuation of a stopped session,
a ledger entry per round with unknown costs as None, experience never saved against a "no",
one experience question per pool, plans checked against the tools before anything runs."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from tests.support.engine import ScriptedAgent, command_plan
from tests.support.fakes import FakeDispatcher

from saucer.context import Context, ContextNames
from saucer.dispatch.messages import Command
from saucer.engine import (
    Agent,
    AgentStatus,
    EngineError,
    NonInteractiveInteractor,
    PlanError,
    Session,
    SessionFactory,
    SessionPool,
)
from saucer.engine.plan import check_plan_tools, parse_plan
from saucer.engine.status import stored_status
from saucer.store.memory import MemoryStore

TOOLS = {
    "files.write": {
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        }
    },
    "files.read": {
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    },
    "shell.run": {
        "input_schema": {
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "expect_exit": {"type": "array", "items": {"type": "integer"}},
            },
            "required": ["command"],
        }
    },
}


def _ran(dispatcher: FakeDispatcher) -> list[int]:
    return [c.parameters["i"] for c in dispatcher.ran]


def test_retry_failed_runs_the_failed_step_again_and_keeps_the_failed_attempt(make_settings: Any) -> None:
    settings, store = make_settings(), MemoryStore()
    dispatcher = FakeDispatcher(fail=("broken",))
    first = Session(
        "retry", mode="follower", settings=settings, store=store, plan=command_plan(3, fail_at=1), dispatcher=dispatcher
    )
    failed = asyncio.run(first.run())
    assert (failed.status, failed.rounds, _ran(dispatcher)) == ("failed", 2, [0, 1])
    # A plain resume of a failed session only reports it.
    reported = asyncio.run(
        Session.resume(first.session_id, store=store, settings=settings, dispatcher=dispatcher).run()
    )
    assert reported.status == "failed" and _ran(dispatcher) == [0, 1]
    dispatcher.fail.clear()
    retried = asyncio.run(
        Session.resume(first.session_id, store=store, settings=settings, dispatcher=dispatcher, retry_failed=True).run()
    )
    assert (retried.status, retried.rounds) == ("finished", 3)
    assert _ran(dispatcher) == [0, 1, 1, 2]  # the failed step ran again, the good one did not
    events = list(store.read(first.session_id))
    steps = [e for e in events if e.meta.get("kind") == "step"]
    assert [(e.meta["status"], e.meta["results"][0]["status"]) for e in steps] == [
        ("FINISH", "success"),
        ("FAIL", "failure"),
        ("FINISH", "success"),
        ("FINISH", "success"),
    ]
    assert [e.meta.get("continues") for e in events if e.meta.get("kind") == "session_resume"] == ["retry_failed"]
    assert [e.meta["session_status"] for e in events if e.meta.get("kind") == "session_end"] == ["failed", "finished"]
    ctx = Context.open(store, first.session_id, create=False)
    assert ctx.get(ContextNames.PREVIOUS_SUBTASKS)[-2:] == [
        {"subtask": "step 1", "status": "finished"},
        {"subtask": "step 2", "status": "finished"},
    ]
    # A finished session has nothing to retry: it reports its result.
    again = asyncio.run(
        Session.resume(first.session_id, store=store, settings=settings, dispatcher=dispatcher, retry_failed=True).run()
    )
    assert again.status == "finished" and _ran(dispatcher) == [0, 1, 1, 2]


def test_retry_failed_without_a_failed_step_says_so(make_settings: Any) -> None:
    settings, store = make_settings(), MemoryStore()
    store.create_session("nostep", meta={"task": "t", "mode": "normal"})
    ctx = Context.open(store, "nostep", create=False)
    ctx.commit(
        meta={
            "kind": "session_end",
            "session_status": "failed",
            "cursor": {"phase": "end", "round": None, "plan_index": None},
        }
    )
    ctx.close()
    with pytest.raises(EngineError, match="no failed step to run again"):
        asyncio.run(
            Session.resume("nostep", store=store, settings=settings, retry_failed=True, agents=ScriptedAgent()).run()
        )
    assert store.head("nostep") == 1 and stored_status(store, "nostep").status == "failed"  # nothing was written
    assert store.lease_of("nostep").expires_at <= time.time()  # and the lease was given back


def test_a_stopped_session_continues_with_a_fresh_budget_each_time(make_settings: Any) -> None:
    settings, store = make_settings(**{"system.max_round": 1}), MemoryStore()
    dispatcher = FakeDispatcher()
    session = Session(
        "cont", mode="follower", settings=settings, store=store, plan=command_plan(3), dispatcher=dispatcher
    )
    results = [asyncio.run(session.run())]
    for _ in range(2):
        results.append(
            asyncio.run(Session.resume(session.session_id, store=store, settings=settings, dispatcher=dispatcher).run())
        )
    assert [(r.status, r.rounds) for r in results] == [("stopped", 1), ("stopped", 2), ("finished", 3)]
    assert results[0].reason == "max_round (1) reached"
    assert _ran(dispatcher) == [0, 1, 2]
    assert stored_status(store, session.session_id).status == "finished"


def test_a_session_stopped_inside_a_round_resumes_that_round(make_settings: Any) -> None:
    settings, store = make_settings(**{"system.max_step": 2}), MemoryStore()
    agent = ScriptedAgent("worker", steps=3)
    session = Session(
        "mid", settings=settings, store=store, agents=agent, interactor=NonInteractiveInteractor(requests=["a"])
    )
    stopped = asyncio.run(session.run())
    assert (stopped.status, stopped.steps, stopped.reason) == ("stopped", 2, "max_step (2) reached")
    resumed = Session.resume(
        session.session_id,
        store=store,
        settings=settings,
        agents=ScriptedAgent("worker", steps=1),
        interactor=NonInteractiveInteractor(),
    )
    done = asyncio.run(resumed.run())
    assert (done.status, done.steps, done.rounds) == ("finished", 3, 1)
    ctx = Context.open(store, session.session_id, create=False)
    assert ctx.get(ContextNames.ROUND_STEP) == {0: 3} and ctx.get(ContextNames.SESSION_STEP) == 3


def test_round_cost_has_an_entry_for_every_round_and_none_when_unknown(make_settings: Any) -> None:
    store = MemoryStore()

    class Mixed(Agent):
        """Round "free" costs nothing, "priced" 0.25, "unpriced" is unknown after a priced call."""

        async def act(self, context: Context) -> AgentStatus:
            request = context.get(ContextNames.REQUEST)
            if request == "priced":
                self.add_cost(0.25)
            elif request == "unpriced":
                self.add_cost(0.5)
                self.add_cost(None)
            return AgentStatus.FINISH

    session = Session(
        "costs",
        settings=make_settings(),
        store=store,
        agents=Mixed("m"),
        interactor=NonInteractiveInteractor(requests=["free", "priced", "unpriced"]),
    )
    result = asyncio.run(session.run())
    ctx = Context.open(store, session.session_id, create=False)
    assert ctx.get(ContextNames.ROUND_COST) == {0: 0.0, 1: 0.25, 2: None}
    assert result.cost.unknown and result.cost.total is None and result.cost.known == pytest.approx(0.25)
    assert result.cost.per_round == {0: 0.0, 1: 0.25, 2: None}
    assert result.cost.to_dict()["total"] is None and result.cost.render().startswith("cost: unknown")
    end = list(store.read(session.session_id))[-1]
    assert end.meta["summary"]["cost"] is None and end.meta["cost_summary"]["unknown"]
    assert "per_round" not in end.meta["cost_summary"]  # the rounds are in ROUND_COST, not again in the end event
    # A finished session's stored result (what a resume of it returns) has them all the same.
    again = asyncio.run(
        Session.resume(session.session_id, store=store, settings=make_settings(), agents=Mixed("m")).run()
    )
    assert again.cost.per_round == {0: 0.0, 1: 0.25, 2: None} and again.cost.unknown
    assert stored_status(store, session.session_id).summary["cost"] is None
    replayed = Context.open(store, session.session_id, create=False, at=end.version)
    assert replayed.get(ContextNames.ROUND_COST) == {0: 0.0, 1: 0.25, 2: None}


class FailsThenFinishes(Agent):
    """Runs a command that fails, then finishes anyway (as an LLM agent may)."""

    async def act(self, context: Context) -> AgentStatus:
        await self.dispatch(context, [Command(tool_name="broken", parameters={"i": 0})])
        return AgentStatus.FINISH


def test_experience_is_never_saved_when_the_results_say_no(make_settings: Any) -> None:
    settings = make_settings(**{"system.eva_session": True, "system.save_experience": "always"})
    result = asyncio.run(
        Session(
            "judged",
            settings=settings,
            agents=FailsThenFinishes("a"),
            request="x",
            dispatcher=FakeDispatcher(fail=("broken",)),
        ).run()
    )
    assert result.status == "finished"  # the agent finished its round...
    [verdict] = result.evaluations
    assert verdict.complete == "no" and verdict.evaluator == "rules" and "0/1 command(s) succeeded" in verdict.reason
    assert result.experience_path is None  # ...but a failed command is never saved as a good plan
    ok = asyncio.run(
        Session("fine", mode="follower", settings=settings, plan=command_plan(1), dispatcher=FakeDispatcher()).run()
    )
    assert ok.evaluations[0].complete == "yes" and ok.experience_path is not None


class CountingInteractor(NonInteractiveInteractor):
    def __init__(self, interactive: bool, answer: bool) -> None:
        super().__init__()
        self._interactive = interactive
        self.answer = answer
        self.asked: list[Any] = []

    @property
    def interactive(self) -> bool:  # type: ignore[override]
        return self._interactive

    def experience_asker(self) -> bool:
        self.asked.append("session")
        return self.answer

    def batch_experience_asker(self, count: int) -> bool:
        self.asked.append(("batch", count))
        return self.answer


@pytest.mark.parametrize("interactive, answer, saved", [(True, True, 3), (True, False, 0), (False, False, 3)])
def test_a_pool_asks_about_experience_once_or_saves_automatically(
    make_settings: Any, interactive: bool, answer: bool, saved: int
) -> None:
    settings = make_settings(**{"system.save_experience": "ask"})
    interactor = CountingInteractor(interactive, answer)
    sessions = [
        Session(
            f"p{i}",
            mode="follower",
            settings=settings,
            plan=command_plan(1),
            dispatcher=FakeDispatcher(),
            interactor=interactor,
        )
        for i in range(3)
    ]
    results = asyncio.run(SessionPool(sessions, 3).run_all())
    assert interactor.asked == ([("batch", 3)] if interactive else [])  # never once per session
    assert sum(r.experience_path is not None for r in results) == saved


def test_plans_are_checked_against_the_tools_before_anything_runs(make_settings: Any, tmp_path: Path) -> None:
    good = parse_plan(
        {
            "task": "t",
            "steps": [
                "a text step",
                {
                    "subtask": "s",
                    "commands": [
                        {"tool_name": "write", "parameters": {"path": "a", "content": "b"}},
                        {"tool_name": "shell.run", "parameters": {"command": "grep x y"}, "expect_exit": [0, 1]},
                    ],
                },
            ],
        }
    )
    check_plan_tools(good, TOOLS, "good.json")
    assert good.steps[1].commands[1].to_command().parameters == {"command": "grep x y", "expect_exit": [0, 1]}
    cases = [
        (
            {"tool_name": "frobnicate"},
            r"bad.json: steps\[0\].commands\[1\]: unknown tool 'frobnicate' \(known tools: files.read",
        ),
        ({"tool_name": "files.frobnicate"}, r"unknown tool 'files.frobnicate' \(closest: files.write, files.read\)"),
        (
            {"tool_name": "file.write", "parameters": {"path": "a", "content": "b"}},
            r"unknown tool 'file.write' \(closest: files.write",
        ),
        (
            {"tool_name": "files.write", "parameters": {"path": "a"}},
            r"invalid parameters for tool 'files.write': 'content' is a required property",
        ),
        (
            {"tool_name": "files.read", "expect_exit": [0]},
            r"invalid parameters for tool 'files.read': 'path' is a required property",
        ),
    ]
    for command, message in cases:
        plan = parse_plan(
            {
                "task": "t",
                "steps": [
                    {"subtask": "s", "commands": [{"tool_name": "shell.run", "parameters": {"command": "ls"}}, command]}
                ],
            }
        )
        with pytest.raises(PlanError, match=message):
            check_plan_tools(plan, TOOLS, "bad.json")
    # Through the factory: the first session keeps the dispatcher it listed the tools with; nothing was created.
    store = MemoryStore()

    class Listing(FakeDispatcher):
        def list_tools(self) -> dict[str, Any]:
            return TOOLS

    made: list[Any] = []

    def factory_fn(session: Any) -> Listing:
        made.append(Listing())
        return made[-1]

    factory = SessionFactory(make_settings(), store=store, dispatcher_factory=factory_fn)
    plan_file = tmp_path / "p.json"
    plan_file.write_text('{"task": "t", "steps": [{"subtask": "s", "commands": [{"tool_name": "frobnicate"}]}]}')
    sessions = factory.create_session("t", "follower", plan_file)
    with pytest.raises(PlanError, match=r"p.json: steps\[0\].commands\[0\]: unknown tool 'frobnicate'"):
        asyncio.run(factory.check_plans(sessions))
    assert store.sessions() == [] and len(made) == 1
    plan_file.write_text(
        '{"task": "t", "steps": [{"subtask": "s", "commands": [{"tool_name": "files.read", "parameters": {"path": "x"}}]}]}'
    )
    [session] = factory.create_session("t", "follower", plan_file)

    async def check_and_run() -> Any:
        await factory.check_plans([session])
        return await session.run()

    assert asyncio.run(check_and_run()).status == "finished" and len(made) == 2  # one dispatcher for check and run
