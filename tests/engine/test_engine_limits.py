"""The max_step / max_round matrix, for plan-driven (follower) and request-driven (normal) sessions."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tests.support.engine import ScriptedAgent, command_plan
from tests.support.fakes import FakeDispatcher

from saucer.context import Context, ContextNames
from saucer.engine import NonInteractiveInteractor, Session
from saucer.store.memory import MemoryStore


@pytest.mark.parametrize(
    "max_step, max_round, rounds, steps, status, reason",
    [
        (50, None, 4, 4, "finished", "4 round(s) finished"),  # default max_round: every plan step runs
        (2, None, 2, 2, "stopped", "max_step (2) reached"),  # steps remain: stopped
        (4, None, 4, 4, "finished", "max_step (4) reached"),  # the limit falls on the last step: nothing left
        (50, 3, 3, 3, "stopped", "max_round (3) reached"),  # plan steps left: any limit stops, never "finished"
        (2, 3, 2, 2, "stopped", "max_step (2) reached"),
        (3, 2, 2, 2, "stopped", "max_round (2) reached"),
        (50, 4, 4, 4, "finished", "max_round (4) reached"),
    ],
)
def test_follower_limits(
    make_settings: Any, max_step: int, max_round: int | None, rounds: int, steps: int, status: str, reason: str
) -> None:
    settings = make_settings(**{"system.max_step": max_step, "system.max_round": max_round})
    store = MemoryStore()
    dispatcher = FakeDispatcher()
    session = Session(
        "limits", mode="follower", settings=settings, store=store, plan=command_plan(4), dispatcher=dispatcher
    )
    result = asyncio.run(session.run())
    assert (result.rounds, result.steps, result.status, result.reason) == (rounds, steps, status, reason)
    assert [c.parameters["i"] for c in dispatcher.ran] == list(range(steps))
    ctx = Context.open(store, session.session_id, create=False)
    assert ctx.get(ContextNames.SESSION_STEP) == steps
    assert sorted(ctx.get(ContextNames.ROUND_STEP)) == list(range(rounds))


@pytest.mark.parametrize(
    "requests, max_step, max_round, rounds, steps, status, round_steps, last_round",
    [
        ("abc", 50, None, 3, 9, "finished", {0: 3, 1: 3, 2: 3}, "finished"),
        ("abc", 5, None, 2, 5, "stopped", {0: 3, 1: 2}, "stopped"),  # stops inside round 1
        ("abc", 6, None, 2, 6, "stopped", {0: 3, 1: 3}, "finished"),  # at a round's end, with a request left
        ("ab", 6, None, 2, 6, "finished", {0: 3, 1: 3}, "finished"),  # at a round's end, nothing left
        ("abc", 50, 2, 2, 6, "stopped", {0: 3, 1: 3}, "finished"),
        ("ab", 50, 2, 2, 6, "finished", {0: 3, 1: 3}, "finished"),
        ("abc", 5, 1, 1, 3, "stopped", {0: 3}, "finished"),
        ("abc", 2, 1, 1, 2, "stopped", {0: 2}, "stopped"),
    ],
)
def test_normal_mode_limits(
    make_settings: Any,
    requests: str,
    max_step: int,
    max_round: int | None,
    rounds: int,
    steps: int,
    status: str,
    round_steps: dict[int, int],
    last_round: str,
) -> None:
    settings = make_settings(**{"system.max_step": max_step, "system.max_round": max_round})
    store = MemoryStore()
    session = Session(
        "limits",
        settings=settings,
        store=store,
        agents=ScriptedAgent("worker", steps=3),
        interactor=NonInteractiveInteractor(requests=list(requests)),
    )
    result = asyncio.run(session.run())
    assert (result.rounds, result.steps, result.status) == (rounds, steps, status), result
    if status == "stopped":
        assert result.reason.startswith(("max_step", "max_round")) and result.reason.endswith("reached")
    ctx = Context.open(store, session.session_id, create=False)
    assert ctx.get(ContextNames.ROUND_STEP) == round_steps
    ends = [e.meta["round_status"] for e in store.read(session.session_id) if e.meta.get("kind") == "round_end"]
    assert ends[-1] == last_round


def test_a_failed_follower_step_stops_the_session_as_failed(make_settings: Any) -> None:
    store = MemoryStore()
    dispatcher = FakeDispatcher(fail=("broken",))
    session = Session(
        "fails",
        mode="follower",
        settings=make_settings(),
        store=store,
        plan=command_plan(4, fail_at=1),
        dispatcher=dispatcher,
    )
    result = asyncio.run(session.run())
    assert result.status == "failed" and result.rounds == 2
    assert result.reason == "round 1 failed: broken failure: broken broke"
    ctx = Context.open(store, session.session_id, create=False)
    assert ctx.get(ContextNames.PREVIOUS_SUBTASKS) == [
        {"subtask": "step 0", "status": "finished"},
        {"subtask": "step 1", "status": "failed"},
    ]


@pytest.mark.parametrize(
    "status, round_status, session_status, reason, rounds",
    [
        # the next request still runs (like a failed round in normal mode); the session is failed
        ("NO_ACTION", "no_action", "failed", "round 0 no_action: answered in prose", 2),
        # a limit: the session stops there
        ("STOP", "stopped", "stopped", "answered in prose", 1),
    ],
)
def test_an_agent_can_end_a_round_no_action_or_stopped(
    make_settings: Any, status: str, round_status: str, session_status: str, reason: str, rounds: int
) -> None:
    """NO_ACTION and STOP end the round; neither is ever reported as finished."""
    from saucer.engine import Agent

    class Ends(Agent):
        async def act(self, context: Context) -> str:
            self.round_result = "answered in prose"
            return status

    store = MemoryStore()
    session = Session(
        "ends",
        settings=make_settings(),
        store=store,
        agents=Ends("ends"),
        interactor=NonInteractiveInteractor(requests=["a request", "another request"]),
    )
    result = asyncio.run(session.run())
    assert (result.status, result.reason, result.ok, result.rounds) == (session_status, reason, False, rounds), result
    ends = [e.meta for e in store.read(session.session_id) if e.meta.get("kind") == "round_end"]
    assert ends[0]["round_status"] == round_status and ends[0]["reason"] == "answered in prose"
