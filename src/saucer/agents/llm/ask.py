"""The ``ask_user`` tool: the model asks the user a question and reads the answer (UFO's ASK_QUESTION).

Offered to saucer's LLM agents when ``[llm] ask_user`` is on (the default).
The question goes to the session's interactor (``question_asker``: a panel
on the terminal in ``saucer run``). When no one can answer -- no terminal, a
service session, a queue worker -- the model reads :data:`NO_ONE_TO_ASK`
at once, so it decides without the answer instead of waiting. Each question
and its answer are kept in the step's record (``asked``).
"""

from __future__ import annotations

from typing import Any

from saucer.agents.llm.client import ToolCall
from saucer.agents.llm.tools import ToolSpec
from saucer.engine.agent import Agent
from saucer.engine.interactor import ask

__all__ = ["ASK_USER_TOOL", "NO_ONE_TO_ASK", "ask_user_spec", "ask_the_user"]

ASK_USER_TOOL = "ask_user"
#: What the model reads when nobody can answer.
NO_ONE_TO_ASK = (
    "no one to ask: this session has no user at a terminal to answer questions (it runs without a terminal, "
    "as a service or on a worker); decide without the answer, or finish and say what you need to know"
)
_MAX_QUESTION = 2000


def ask_user_spec() -> ToolSpec:
    """The ``ask_user`` tool the model may call."""
    return ToolSpec(
        name=f"agent.{ASK_USER_TOOL}",
        function_name=ASK_USER_TOOL,
        description="Ask the user a question when the request is ambiguous or you need information only the user "
        "has; returns the user's answer. Ask only what you cannot find out with the other tools.",
        parameters={"type": "object", "properties": {"question": {"type": "string"}}, "required": ["question"]},
    )


async def ask_the_user(agent: Agent, interactor: Any, call: ToolCall) -> str:
    """The tool message for ``call``: the user's answer, or why there is none."""
    question = call.arguments.get("question") if isinstance(call.arguments, dict) else None
    if call.error or not isinstance(question, str) or not question.strip():
        return "error: ask_user needs a non-empty 'question' string; nothing was asked"
    question = question.strip()[:_MAX_QUESTION]
    asked: list[dict[str, str]] = agent.step.extra.setdefault("asked", []) if agent.step is not None else []
    if interactor is None or not getattr(interactor, "interactive", False):
        asked.append({"question": question, "answer": None, "why": "no one to ask"})  # type: ignore[dict-item]
        return NO_ONE_TO_ASK
    answer = await ask(interactor, "question_asker", question, len(agent.answers))
    answer = answer.strip() if isinstance(answer, str) else ""
    agent.answers.append(answer)
    asked.append({"question": question, "answer": answer})
    return f"the user answered: {answer}" if answer else "the user gave no answer"
