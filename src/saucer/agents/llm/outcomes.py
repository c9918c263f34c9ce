"""What an LLM agent's round (or subtask) result says when the work was not done, and the
``PREVIOUS_SUBTASKS`` entry both tiers write: one wording for the single agent, the host and the app.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from saucer.context.names import ContextNames

if TYPE_CHECKING:
    from saucer.context import Context

__all__ = ["nothing_done_reason", "no_action_reason", "previous_subtask_entry"]


def _said(content: str, limit: int = 300) -> str:
    """A model's answer inside a one-line reason (the whole answer is in the conversation and the step log)."""
    text = " ".join(content.split())
    if not text:
        return "(an empty reply)"
    return repr(text if len(text) <= limit else text[:limit] + "...")


def nothing_done_reason(who: str, content: str) -> str:
    """The round (or subtask) result of an agent whose every tool call failed or was refused."""
    return f"nothing was done (every tool call failed or was refused); the {who} said: {_said(content)}"


def no_action_reason(retries: int, content: str) -> str:
    """The round result of an agent that never called a tool."""
    asked = f", even after {retries} reminder(s)" if retries else ""
    return f"no action: the model answered without calling a tool{asked}: {_said(content)}"


def previous_subtask_entry(context: Context, subtask: str, status: str, result: str, agent: str) -> Mapping[str, Any]:
    """One ``PREVIOUS_SUBTASKS`` entry (the schema both tiers write and the prompts read)."""
    return {
        "subtask": subtask,
        "status": status,
        "result": result,
        "round": context.get(ContextNames.CURRENT_ROUND_ID),
        "agent": agent,
    }
