"""The session's collaborators and written contracts, each on its own: the interactor's
:class:`UserChannel`, the observers' :class:`ObserverCaller`, the :class:`Resumer`'s
continuation, the :class:`Agenda`'s limits, and what an agent sees of its session."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from tests.support.engine import command_plan
from tests.support.fakes import FakeDispatcher

from saucer.config import load_settings
from saucer.engine import Agent, AgentStatus, Session
from saucer.engine.accounting import Limits
from saucer.engine.cursor import Progress, ResumePoint
from saucer.engine.interactor import NonInteractiveInteractor, UserChannel, interactor_approver, nobody_to_ask
from saucer.engine.notify import CompositeObserver, ObserverCaller
from saucer.engine.resume import Resumer


class _OnlyQuestions:
    """An interactor with one method: every other one is the non-interactive default."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []

    async def question_asker(self, question: str, index: int) -> str:
        self.asked.append((question, index))
        return "blue"


class _Blocking:
    blocking = True
    interactive = True

    def __init__(self) -> None:
        self.threads: list[str] = []

    def sensitive_step_asker(self, action: str, target: str) -> bool:
        self.threads.append(threading.current_thread().name)
        return True

    def refusal_reason(self) -> str | None:
        return "never asked"


def test_a_partial_interactor_gets_the_documented_defaults() -> None:
    person = _OnlyQuestions()
    channel = UserChannel(person)

    async def go() -> tuple[Any, ...]:
        return (
            await channel.question_asker("colour?", 0),
            await channel.first_request(),
            await channel.new_request(),
            await channel.experience_asker(),
            await channel.sensitive_step_asker("run shell.run", "{}"),
        )

    assert asyncio.run(go()) == ("blue", "", None, False, False)
    assert person.asked == [("colour?", 0)]
    assert channel.present and not channel.assume_yes and channel.refusal_reason() is None
    assert channel.interactive(True) is True and channel.interactive(False) is False  # it says nothing


def test_no_interactor_is_nobody() -> None:
    channel = UserChannel(None)
    assert not channel.present
    assert nobody_to_ask(channel) and nobody_to_ask(None)
    assert asyncio.run(channel.question_asker("?", 0)) == ""


def test_a_blocking_interactor_is_asked_in_a_worker_thread_and_its_refusal_reason_is_kept() -> None:
    person = _Blocking()
    channel = UserChannel(person)
    assert asyncio.run(channel.sensitive_step_asker("a", "b")) is True
    assert person.threads and person.threads[0] != threading.main_thread().name
    assert channel.refusal_reason() == "never asked"
    assert nobody_to_ask(person)  # it would refuse without asking anyone


def test_the_approver_says_the_refusal_reason() -> None:
    class Refuses(_Blocking):
        def sensitive_step_asker(self, action: str, target: str) -> bool:
            return False

    approve = interactor_approver(Refuses())
    command = type("C", (), {"tool_name": "shell.run", "parameters": {"command": "rm x"}})()
    assert asyncio.run(approve(command)) == "never asked"
    assert asyncio.run(interactor_approver(NonInteractiveInteractor(assume_yes=True))(command)) is True


def test_a_pool_asks_the_single_question_when_there_is_no_batch_one() -> None:
    class Single:
        def experience_asker(self) -> bool:
            return True

    assert asyncio.run(UserChannel(Single()).batch_experience_asker(3)) is True
    assert asyncio.run(UserChannel(NonInteractiveInteractor()).batch_experience_asker(3)) is False


def test_an_observer_s_hooks_are_found_once_and_a_failing_one_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[str] = []

    class Partial:
        async def on_step(self, session: Any, record: Any) -> None:
            seen.append(f"step {record}")

        def on_round_end(self, session: Any, round: Any, result: Any) -> None:
            raise RuntimeError("observer bug")

    caller = ObserverCaller(Partial())
    assert caller.has("on_step") and caller.has("on_round_end") and not caller.has("on_session_start")

    async def go() -> None:
        await caller.session_start(None)  # it has no such hook: nothing happens
        await caller.step(None, 1)
        await caller.round_end(None, None, None)
        await caller.round_end(None, None, None)

    with caplog.at_level(logging.WARNING, logger="saucer.engine"):
        asyncio.run(go())
    assert seen == ["step 1"]
    assert sum("observer bug" in r.getMessage() for r in caplog.records) == 1


def test_a_composite_observer_forwards_to_each_in_order() -> None:
    seen: list[str] = []

    class A:
        def on_session_start(self, session: Any) -> None:
            seen.append("a")

    class B:
        async def on_session_start(self, session: Any) -> None:
            seen.append("b")

    asyncio.run(ObserverCaller(CompositeObserver([A(), None, B()])).session_start(None))
    assert seen == ["a", "b"]


@pytest.mark.parametrize(
    ("point", "reopen", "pending", "next_ids"),
    [
        (ResumePoint("start"), None, None, (None, None)),
        (
            ResumePoint("step", round=2, plan_index=4, agent="a", state="CONTINUE"),
            (2, 4, "a", "CONTINUE"),
            None,
            (3, 5),
        ),
        (ResumePoint("round_end", round=1, evaluated=False), None, 1, (2, None)),
        (ResumePoint("round_end", round=1, evaluated=True), None, None, (2, None)),
    ],
)
def test_a_cursor_s_continuation(
    point: ResumePoint, reopen: Any, pending: int | None, next_ids: tuple[int | None, int | None]
) -> None:
    then = Resumer.continuation(point, Limits(5, 3), eva_round=True)
    assert then.reopen == reopen and then.pending_round_eval == pending
    assert (then.next_round_id, then.next_plan_index) == next_ids
    assert then.phase == point.phase and then.progress is point.progress


def test_a_continued_stopped_session_counts_its_limits_from_the_cursor() -> None:
    point = ResumePoint("step", round=0, limit_base=(7, 2), progress=Progress(rounds=2))
    then = Resumer.continuation(point, Limits(5, 3), eva_round=False)
    assert then.limits == Limits(5, 3, 7, 2)
    assert not then.limits.step_reached(11) and then.limits.step_reached(12)


def test_a_round_limit_with_work_left_stops_the_session(tmp_path: Path) -> None:
    settings = load_settings(overrides={"system.max_round": 1, "logs.root": str(tmp_path / "logs")})
    store = f"sqlite:///{tmp_path}/s.db"
    session = Session(
        "limits", mode="follower", plan=command_plan(3), settings=settings, store=store, dispatcher=FakeDispatcher()
    )
    result = asyncio.run(session.run())
    assert result.status == "stopped" and result.reason == "max_round (1) reached"
    assert session._agenda.work_left()


def test_an_agent_sees_its_session_through_the_agent_host(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    class Asker(Agent):
        async def act(self, context: Any) -> AgentStatus:
            assert self.session is not None and self.round is not None
            seen["session_id"] = self.session.session_id
            seen["answer"] = await self.user_channel.question_asker("colour?", 0)
            seen["request"] = self.round.request
            return AgentStatus.FINISH

    settings = load_settings(overrides={"logs.root": str(tmp_path / "logs")})
    store = f"sqlite:///{tmp_path}/s.db"
    person = _OnlyQuestions()
    session = Session(
        "host",
        request="paint",
        settings=settings,
        store=store,
        agents=Asker(),
        interactor=person,
        ask_new_requests=False,
    )
    assert asyncio.run(session.run()).status == "finished"
    assert seen == {"session_id": session.session_id, "answer": "blue", "request": "paint"}
    assert asyncio.run(Asker().user_channel.question_asker("?", 0)) == ""  # outside a session: nobody
