"""The ask_user tool: the model asks the user a question (answered from the terminal's interactor), or reads
"no one to ask" at once when nobody can answer (no terminal, service, worker)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fake_openai import FakeOpenAI
from llm_helpers import FakeDispatcher, make_session

from saucer.agents.llm.ask import NO_ONE_TO_ASK
from saucer.agents.llm.client import ModelSettings
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
    dispatcher = FakeDispatcher()
    session = make_session(tmp_path, settings, request="read the file", dispatcher=dispatcher, interactor=interactor)
    result = asyncio.run(session.run())
    assert result.status == "finished", result
    assert "ask_user" in fake.requests[0].tool_names
    assert interactor.questions == [("Which file should I read?", 0)]
    assert _tool_messages(fake.requests[1])[-1] == {"role": "tool", "tool_call_id": "call_q", "content": "the user answered: notes.txt"}
    assert [c.tool_name for c in dispatcher.commands] == ["files.read"]  # the question is not a command
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
        asyncio.run(session.run())
        assert _tool_messages(fake.requests[1])[-1]["content"] == NO_ONE_TO_ASK
        assert NO_ONE_TO_ASK.startswith("no one to ask")


def test_ask_user_off_is_not_offered(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    fake.push(fake.tool_calls(("files.read", {"path": "a"}, "c1")), fake.text("done"))
    session = make_session(tmp_path, settings.model_copy(update={"ask_user": False}), request="read a")
    asyncio.run(session.run())
    assert "ask_user" not in fake.requests[0].tool_names


def test_the_host_agent_asks_without_counting_a_failed_assignment(fake: FakeOpenAI, settings: ModelSettings, tmp_path: Path) -> None:
    host = settings.model_copy(update={"agent": "host", "max_consecutive_failures": 1})
    fake.push(fake.tool_calls(("ask_user", {"question": "Which folder?"}, "call_q")))
    fake.push(*[fake.text("Nothing to do in the end.")] * (1 + host.no_action_retries))
    interactor = Answering("none")
    session = make_session(tmp_path, host, request="tidy up", interactor=interactor)
    result = asyncio.run(session.run())
    assert interactor.questions == [("Which folder?", 0)]
    assert _tool_messages(fake.requests[1])[-1]["content"] == "the user answered: none"
    assert result.status != "error" and "invalid assignments" not in result.reason, result  # a question is no invalid assignment

