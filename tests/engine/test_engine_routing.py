"""Declarative routing: conditions on values written in the same step, the expression interpreter,
serialisation, and an unregistered condition failing only its own session."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any

import pytest
from tests.support.engine import ScriptedAgent
from tests.support.fakes import FakeDispatcher

from saucer.context import Context, ContextNames
from saucer.engine import (
    Agent,
    AgentSet,
    AgentStatus,
    AgentTarget,
    Always,
    Condition,
    ContextEquals,
    Expression,
    ExpressionError,
    FromAgent,
    GraphError,
    RevertToInitiator,
    RouteInput,
    Session,
    SessionPool,
    StayTarget,
    Terminate,
    ToolCalled,
    Transition,
    TransitionGraph,
    UnknownConditionError,
    register_condition,
)
from saucer.store.memory import MemoryStore


class Writer(Agent):
    """Each step writes phase/retries/status in the SAME step the graph then reads."""

    async def act(self, context: Context) -> AgentStatus:
        drafts = context.incr("drafts")
        if drafts < 3:
            context.update_vars({"status": "retry", "retries": drafts})
        else:
            context.update_vars({"phase": "review", "status": "ok"})
        return AgentStatus.CONTINUE


class Reviewer(Agent):
    async def act(self, context: Context) -> AgentStatus:
        context.update_vars({"reviewed": True})
        await self.dispatch(context, [{"tool_name": "files.write", "parameters": {"path": "review.md"}}])
        return AgentStatus.CONTINUE


def _graph() -> TransitionGraph:
    return TransitionGraph(
        initial_agent="writer",
        transitions=[
            Transition(ContextEquals("phase", "review"), AgentTarget("reviewer"), priority=10),
            Transition(Expression("${retries} < 3 and ${status} == 'retry'"), StayTarget()),
            Transition(ToolCalled("write"), Terminate("review written"), priority=20),
        ],
        default_target=Terminate("nothing matched"),
        max_turns=10,
    )


def _run(
    settings: Any, graph: Any, store: MemoryStore | None = None, agents: list[Agent] | None = None
) -> tuple[Any, Session]:
    store = store or MemoryStore()
    agent_set = AgentSet(agents or [Writer("writer"), Reviewer("reviewer")], graph=graph)
    session = Session(
        "route", settings=settings, store=store, request="draft", agents=agent_set, dispatcher=FakeDispatcher()
    )
    return asyncio.run(session.run()), session


def test_routing_by_context_equals_and_expression_on_values_of_the_same_step(settings: Any) -> None:
    store = MemoryStore()
    result, session = _run(settings, _graph(), store)
    assert result.status == "finished", result
    steps = [e for e in store.read(session.session_id) if e.meta.get("kind") == "step"]
    # writer writes retries=1,2 (Expression → stay), then phase=review (ContextEquals → reviewer),
    # the reviewer calls files.write (ToolCalled → Terminate).
    assert [e.author for e in steps] == ["writer", "writer", "writer", "reviewer"]
    assert [e.meta["next_agent"] for e in steps] == ["writer", "writer", "reviewer", "reviewer"]
    ctx = Context.open(store, session.session_id, create=False)
    assert ctx.get(ContextNames.ROUND_RESULT) == "review written"
    assert ctx.get_var("reviewed") is True


def test_graph_serialisation_round_trips_through_json(settings: Any) -> None:
    graph = _graph()
    data = json.loads(json.dumps(graph.to_dict()))
    again = TransitionGraph.from_dict(data)
    assert again.to_dict() == graph.to_dict()
    assert again == graph
    assert data["transitions"][1]["when"] == {"type": "expression", "text": "${retries} < 3 and ${status} == 'retry'"}
    # A serialised graph given to a session routes exactly like the object.
    store = MemoryStore()
    result, session = _run(settings, data, store)
    assert result.status == "finished"
    assert [e.author for e in store.read(session.session_id) if e.meta.get("kind") == "step"] == [
        "writer",
        "writer",
        "writer",
        "reviewer",
    ]


@register_condition("retries_at_least")
@dataclass(frozen=True)
class RetriesAtLeast(Condition):
    n: int

    def matches(self, inp: RouteInput) -> bool:
        return (inp.value("retries") or 0) >= self.n


def test_custom_condition_registers_and_round_trips() -> None:
    graph = TransitionGraph("writer", [Transition(RetriesAtLeast(2), Terminate("enough"))])
    data = graph.to_dict()
    assert data["transitions"][0]["when"] == {"type": "retries_at_least", "n": 2}
    assert TransitionGraph.from_dict(data) == graph


def test_an_unregistered_condition_fails_only_the_session_that_uses_it(settings: Any) -> None:
    bad = _graph().to_dict()
    bad["transitions"][0]["when"] = {"type": "sentiment_is", "value": "happy"}
    with pytest.raises(UnknownConditionError, match=r"transitions\[0\].when: unknown condition type 'sentiment_is'"):
        TransitionGraph.from_dict(bad)
    store = MemoryStore()
    sessions = [
        Session(
            f"route-{i}",
            settings=settings,
            store=store,
            request="draft",
            dispatcher=FakeDispatcher(),
            agents=AgentSet([Writer("writer"), Reviewer("reviewer")], graph=bad if i == 1 else _graph().to_dict()),
        )
        for i in range(3)
    ]
    results = asyncio.run(SessionPool(sessions, max_concurrency=3).run_all())
    assert [r.status for r in results] == ["finished", "error", "finished"]
    assert "unknown condition type 'sentiment_is'" in results[1].error
    assert "register_condition('sentiment_is')" in results[1].error


def test_targets_revert_to_initiator_stay_and_max_turns(settings: Any) -> None:
    class Pinger(Agent):
        async def act(self, context: Context) -> AgentStatus:
            context.incr("pings")
            return AgentStatus.CONTINUE

    graph = TransitionGraph(
        "a",
        [
            Transition(FromAgent("a"), AgentTarget("b")),
            Transition(FromAgent("b"), RevertToInitiator()),
        ],
        max_turns=5,
    )
    store = MemoryStore()
    result, session = _run(settings, graph, store, agents=[Pinger("a"), Pinger("b")])
    steps = [e for e in store.read(session.session_id) if e.meta.get("kind") == "step"]
    assert [e.author for e in steps] == ["a", "b", "a", "b", "a", "b"]
    assert result.status == "finished"
    ctx = Context.open(store, session.session_id, create=False)
    assert ctx.get(ContextNames.ROUND_RESULT) == "max_turns (5) reached"


def test_a_graph_naming_an_unknown_agent_is_a_session_error(settings: Any) -> None:
    graph = TransitionGraph("writer", [Transition(Always(), AgentTarget("ghost"))])
    result, _ = _run(settings, graph)
    assert result.status == "error" and "'ghost'" in result.error


# ----------------------------------------------------------- the interpreter

VALUES = {"retries": 2, "status": "ok", "tags": ["a", "b"], "name": "x", "ratio": 0.5, "nothing": None}


@pytest.mark.parametrize(
    "text, expected",
    [
        ("${retries} < 3 and ${status} == 'ok'", True),
        ("${retries} >= 3 or ${status} != 'ok'", False),
        ("not ${missing}", True),
        ("${missing} == None", True),
        ("${missing} < 3", False),  # None cannot be ordered: False, not an error
        ("'a' in ${tags} and 'z' not in ${tags}", True),
        ("len(${tags}) == 2 and len(${missing}) == 0", True),
        ("${retries} * 2 + 1 == 5", True),
        ("-${retries} + 10 / 4 == 0.5", True),
        ("(${retries} + 1) * 2 == 6", True),
        ("1 < ${retries} < 3", True),
        ("${status} in ['ok', 'done']", True),
        ('${name} + "y" == "xy"', True),
        ("true and not false and null == None", True),
        ("${ratio} > .25", True),
    ],
)
def test_expression_values(text: str, expected: bool) -> None:
    assert Expression(text).evaluate(VALUES) is expected or Expression(text).matches(RouteInput(VALUES)) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("${a} <", "unexpected end"),
        ("${a} == 1 )", "unexpected ')'"),
        ("__import__('os')", "unknown name '__import__'"),
        ("${a}.b", "unexpected character '.'"),
        ("len ${a}", "expected '('"),
        ("", "non-empty"),
    ],
)
def test_expression_parse_errors_are_clear(text: str, message: str) -> None:
    with pytest.raises(ExpressionError, match=re.escape(message)):
        Expression(text)


@pytest.mark.parametrize(
    "text, message",
    [
        ("${retries} / 0 == 1", "division by zero"),
        ("${status} - 1 == 0", "cannot apply - to str and int"),
        ("${missing} + 1", "cannot apply"),
    ],
)
def test_expression_runtime_errors_are_expression_errors(text: str, message: str) -> None:
    with pytest.raises(ExpressionError, match=message):
        Expression(text).evaluate(VALUES)


def test_expression_reads_typed_names_after_vars() -> None:
    ctx = Context()
    ctx.set(ContextNames.REQUEST, "open notes")
    ctx.update_vars({"REQUEST_COUNT": 1})
    assert Expression("${REQUEST} == 'open notes' and ${REQUEST_COUNT} == 1").matches(RouteInput(ctx))
    assert ContextEquals("absent").matches(RouteInput(ctx))  # missing key equals None


def test_malformed_graph_data_is_a_clear_error() -> None:
    with pytest.raises(GraphError, match="unknown target type 'teleport'"):
        TransitionGraph.from_dict(
            {"initial_agent": "a", "transitions": [{"when": {"type": "always"}, "then": {"type": "teleport"}}]}
        )
    with pytest.raises(GraphError, match=r"transitions\[0\]: a transition is an object"):
        TransitionGraph.from_dict({"initial_agent": "a", "transitions": [["always"]]})
    with pytest.raises(GraphError, match="unknown field"):
        TransitionGraph.from_dict({"initial_agent": "a", "edges": []})
    with pytest.raises(GraphError, match="bad condition 'context_equals'"):
        TransitionGraph.from_dict(
            {
                "initial_agent": "a",
                "transitions": [{"when": {"type": "context_equals", "nope": 1}, "then": {"type": "stay"}}],
            }
        )


def test_an_error_status_ends_the_round_whatever_the_graph_says(settings: Any) -> None:
    class Failing(Agent):
        async def act(self, context: Context) -> AgentStatus:
            context.update_vars({"tried": True})
            return AgentStatus.ERROR

    graph = TransitionGraph("a", [Transition(Always(), AgentTarget("b"))])
    store = MemoryStore()
    result, session = _run(settings, graph, store, agents=[Failing("a"), ScriptedAgent("b")])
    assert result.status == "error"
    assert [e.author for e in store.read(session.session_id) if e.meta.get("kind") == "step"] == ["a"]
