"""The ask_user tool: the model asks the user a question (answered from the terminal's interactor); with no
terminal it waits as a pending question in the session (answered with ``decide``, as ``saucer answer`` and the
API do, or "no answer (timeout)"); with ``approvals.timeout = 0`` it reads "no one to ask" at once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from tests.support.fake_openai import FakeOpenAI
from tests.support.llm import llm_dispatcher, make_session

from saucer.agents.llm.ask import NO_ONE_TO_ASK
from saucer.agents.llm.client import ModelSettings
from saucer.engine.approvals import ApprovalError, decide, pending_approvals, read_approvals
from saucer.engine.interactor import NonInteractiveInteractor
from saucer.engine.logs import read_step_log


class Answering(NonInteractiveInteractor):
    """Someone at the terminal, answering questions."""

    interactive = True  # type: ignore[assignment]

    def __init__(self, answer: str) -> None:
        super().__init__()
        self.answer = answer
        self.questions: list[tuple[str, int]] = []

    def question_asker(self, question: str, index: int) -> str:
        self.questions.append((question, index))
        return self.answer


def _tool_messages(request: Any) -> list[dict[str, Any]]:
    return [m for m in request.messages if m["role"] == "tool"]


def test_the_model_asks_and_reads_the_users_answer(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    fake.push(
        fake.tool_calls(("ask_user", {"question": "Which file should I read?"}, "call_q")),
        fake.tool_calls(("files.read", {"path": "notes.txt"}, "call_read")),
        fake.text("Read notes.txt."),
    )
    interactor = Answering("notes.txt")
    dispatcher = llm_dispatcher()
    session = make_session(tmp_path, settings, request="read the file", dispatcher=dispatcher, interactor=interactor)
    result = asyncio.run(session.run())
    assert result.status == "finished", result
    assert "ask_user" in fake.requests[0].tool_names
    assert interactor.questions == [("Which file should I read?", 0)]
    assert _tool_messages(fake.requests[1])[-1] == {
        "role": "tool",
        "tool_call_id": "call_q",
        "content": "the user answered: notes.txt",
    }
    assert [c.tool_name for c in dispatcher.ran] == ["files.read"]  # the question is not a command
    first = next(iter(read_step_log(session.log_path)))
    assert first.extra["asked"] == [{"question": "Which file should I read?", "answer": "notes.txt"}]


def test_no_one_to_ask_is_said_at_once(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    for interactor in (NonInteractiveInteractor(), None):
        fake.reset()
        fake.push(
            fake.tool_calls(("ask_user", {"question": "Which file?"}, "call_q")),
            fake.text("I could not ask; reading nothing."),
        )
        session = make_session(tmp_path, settings, request="read the file", interactor=interactor)
        session.interactor = interactor
        session.settings.approvals.timeout = 0  # no waiting as a pending question: "no one to ask" at once
        asyncio.run(session.run())
        assert _tool_messages(fake.requests[1])[-1]["content"] == NO_ONE_TO_ASK
        assert NO_ONE_TO_ASK.startswith("no one to ask")


def test_ask_user_off_is_not_offered(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    fake.push(fake.tool_calls(("files.read", {"path": "a"}, "c1")), fake.text("done"))
    session = make_session(tmp_path, settings.model_copy(update={"ask_user": False}), request="read a")
    asyncio.run(session.run())
    assert "ask_user" not in fake.requests[0].tool_names


def test_the_host_agent_asks_without_counting_a_failed_assignment(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path
) -> None:
    host = settings.model_copy(update={"agent": "host", "max_consecutive_failures": 1})
    fake.push(fake.tool_calls(("ask_user", {"question": "Which folder?"}, "call_q")))
    fake.push(*[fake.text("Nothing to do in the end.")] * (1 + host.no_action_retries))
    interactor = Answering("none")
    session = make_session(tmp_path, host, request="tidy up", interactor=interactor)
    result = asyncio.run(session.run())
    assert interactor.questions == [("Which folder?", 0)]
    assert _tool_messages(fake.requests[1])[-1]["content"] == "the user answered: none"
    assert result.status != "error" and "invalid assignments" not in result.reason, (
        result
    )  # a question is no invalid assignment


def _with_a_person(session: Any, act: Any) -> Any:
    """Run ``session`` while a person waits for its pending question and calls ``act(store, question)``."""

    async def go() -> Any:
        async def person() -> None:
            while True:
                store = session.store
                waiting = (
                    pending_approvals(store, [session.session_id])
                    if store is not None and store.exists(session.session_id)
                    else []
                )
                if waiting:
                    act(store, waiting[0])
                    return
                await asyncio.sleep(0.02)

        helper = asyncio.create_task(person())
        result = await session.run()
        await asyncio.wait_for(helper, 5)
        return result

    return asyncio.run(go())


def test_with_no_terminal_the_question_waits_and_the_answer_is_an_event(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path
) -> None:
    fake.push(
        fake.tool_calls(("ask_user", {"question": "Which file should I read?"}, "call_q")),
        fake.tool_calls(("files.read", {"path": "notes.txt"}, "call_read")),
        fake.text("Read notes.txt."),
    )
    session = make_session(tmp_path, settings, request="read the file", interactor=NonInteractiveInteractor())
    seen: list[Any] = []

    def answer(store: Any, question: Any) -> None:
        seen.append((store, question))
        with pytest.raises(ApprovalError, match="is a question, not an approval"):
            decide(store, question.session_id, question.number, status="approved", author="user:ana")
        with pytest.raises(ApprovalError, match="must not be blank"):
            decide(store, question.session_id, question.number, status="answered", author="user:ana", note="  ")
        decide(store, question.session_id, question.number, status="answered", author="user:ana", note="notes.txt")

    result = _with_a_person(session, answer)
    assert result.status == "finished", result.reason
    [(store, question)] = seen
    assert (question.kind, question.detail, question.timeout) == ("question", "Which file should I read?", 300.0)
    assert _tool_messages(fake.requests[1])[-1]["content"] == "the user (user:ana) answered: notes.txt"
    [decided] = read_approvals(store, session.session_id)
    assert (decided.status, decided.answer, decided.decided_by) == ("answered", "notes.txt", "user:ana")
    first = next(iter(read_step_log(session.log_path)))
    assert first.extra["asked"] == [
        {
            "question": "Which file should I read?",
            "answer": "notes.txt",
            "number": question.number,
            "answered_by": "user:ana",
        }
    ]


def test_an_unanswered_question_times_out_into_no_answer(
    fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path
) -> None:
    fake.push(fake.tool_calls(("ask_user", {"question": "Which folder?"}, "call_q")), fake.text("Nothing done."))
    session = make_session(tmp_path, settings, request="tidy", interactor=NonInteractiveInteractor())
    session.settings.approvals.timeout = 0.3
    stores: list[Any] = []
    _with_a_person(session, lambda store, question: stores.append(store))  # sees it pending, does not answer
    content = _tool_messages(fake.requests[1])[-1]["content"]
    assert content.startswith("no answer (timeout): nobody answered question "), content
    assert content.endswith("within 0.3 s; decide without the answer, or finish and say what you need to know")
    [timed_out] = read_approvals(stores[0], session.session_id)
    assert (timed_out.status, timed_out.decided_by, timed_out.answer) == ("timed_out", "system", None)
    with pytest.raises(ApprovalError, match="was already timed out"):
        decide(stores[0], session.session_id, timed_out.number, status="answered", author="user:ana", note="late")
    assert json.dumps(timed_out.to_dict())  # listable as JSON
