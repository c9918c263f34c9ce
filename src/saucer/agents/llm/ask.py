"""The ``ask_user`` tool: the model asks the user a question and reads the answer (UFO's ASK_QUESTION).

Offered to saucer's LLM agents when ``[llm] ask_user`` is on (the default).
The question goes to the session's interactor (``question_asker``: a panel
on the terminal in ``saucer run``). When no one at a terminal can answer --
``--no-input``, a service session, a queue worker -- it waits as a *pending
question* stored in the session (:func:`saucer.engine.approvals.pending_question`,
the mechanism of pending approvals), answered with ``saucer answer`` or the
service's API; after ``[approvals] timeout`` seconds the model reads
"no answer (timeout)". With no store or a timeout of 0 the model reads
:data:`NO_ONE_TO_ASK` at once. Each question and its answer are kept in the
step's record (``asked``).
"""

from __future__ import annotations

from typing import Any

from saucer.agents.llm.client import ToolCall
from saucer.agents.llm.tools import ToolSpec
from saucer.engine.agent import Agent
from saucer.engine.approvals import QUESTION_TIMED_OUT, pending_question
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
    asked: list[dict[str, Any]] = agent.step.extra.setdefault("asked", []) if agent.step is not None else []
    if interactor is None or not getattr(interactor, "interactive", False):
        rnd = agent.round
        session = getattr(rnd, "session", None) if rnd is not None else None
        settings = getattr(session, "settings", None)
        timeout = float(getattr(getattr(settings, "approvals", None), "timeout", 0) or 0)
        decided = (
            await pending_question(session, interactor, question, timeout=timeout, author=agent.name)
            if session
            else None
        )
        if decided is None:
            asked.append({"question": question, "answer": None, "why": "no one to ask"})
            return NO_ONE_TO_ASK
        entry: dict[str, Any] = {"question": question, "answer": decided.answer, "number": decided.number}
        if decided.answer is not None:
            entry["answered_by"] = decided.decided_by
            agent.answers.append(decided.answer)
        else:
            entry["why"] = QUESTION_TIMED_OUT
        asked.append(entry)
        return decided.reply()
    answer = await ask(interactor, "question_asker", question, len(agent.answers))
    answer = answer.strip() if isinstance(answer, str) else ""
    agent.answers.append(answer)
    asked.append({"question": question, "answer": answer})
    return f"the user answered: {answer}" if answer else "the user gave no answer"
