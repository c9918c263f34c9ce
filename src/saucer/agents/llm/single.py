"""The single-tier LLM agent: one agent carries out the whole request (UFO's LinuxAgent role).

It does an app agent's work, so the session names it ``app`` (the host/app vocabulary that the
two-tier agents of :mod:`saucer.agents.llm.host` use too).
"""

from __future__ import annotations

from saucer.agents.llm.agent import ToolUsingAgent
from saucer.agents.llm.client import ModelClient, ModelSettings

__all__ = ["LinuxAgent", "SINGLE_AGENT", "LEGACY_SINGLE_AGENT"]

#: The single-tier agent's name: it does an app agent's work on the whole request (UFO's HostAgent/AppAgent
#: vocabulary), so the session, its log and ``saucer show`` call it ``app``.
SINGLE_AGENT = "app"
#: Its name in sessions stored before 0.2 (``_llm.linux.*``): such a session resumes with that name.
LEGACY_SINGLE_AGENT = "linux"


class LinuxAgent(ToolUsingAgent):
    """The single-tier agent (UFO's LinuxAgent role), named ``app``: the whole request, tool call by tool
    call, until a final answer."""

    def __init__(self, name: str = SINGLE_AGENT, *, client: ModelClient, settings: ModelSettings | None = None) -> None:
        super().__init__(name, client=client, settings=settings)
