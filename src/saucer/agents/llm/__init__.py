"""LLM agents for normal mode, over any OpenAI-compatible endpoint.

    from saucer.agents.llm import create_agent_provider, require_model_settings

    require_model_settings(settings)              # ModelNotConfiguredError says what to set
    provider = create_agent_provider(settings)    # provider(session) -> AgentSet
    Session(task, mode="normal", agents=provider, ...)

``[llm] agent = "single"`` (default) gives one :class:`LinuxAgent`;
``"host"`` gives a :class:`HostAgent` that hands subtasks to an
:class:`AppAgent`. Either way the set carries an :class:`LLMEvaluator`, used
when ``system.eva_round`` / ``system.eva_session`` are on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from saucer.agents.llm.agent import SUBTASK_FINISH, LLMAgent, interactor_approver
from saucer.agents.llm.client import (
    ENV_API_KEY,
    ENV_BASE_URL,
    ENV_MODEL,
    ModelCallError,
    ModelClient,
    ModelNotConfiguredError,
    ModelReply,
    ModelSettings,
    ToolCall,
    Usage,
    require_model_settings,
)
from saucer.agents.llm.evaluator import LLMEvaluator
from saucer.agents.llm.host import AppAgent, HostAgent
from saucer.agents.llm.logs import RequestLogger
from saucer.agents.llm.pricing import PriceFileError, PriceTable, format_cost
from saucer.agents.llm.prompts import render_template
from saucer.agents.llm.tool_agent import LinuxAgent, ToolUsingAgent
from saucer.agents.llm.tools import ToolSet
from saucer.engine.agent import AgentSet

if TYPE_CHECKING:
    from saucer.engine.session import Session

__all__ = [
    "create_agent_provider",
    "build_agent_set",
    "require_model_settings",
    "ModelNotConfiguredError",
    "ModelCallError",
    "ModelClient",
    "ModelSettings",
    "ModelReply",
    "ToolCall",
    "Usage",
    "PriceTable",
    "PriceFileError",
    "format_cost",
    "RequestLogger",
    "ToolSet",
    "LLMAgent",
    "ToolUsingAgent",
    "LinuxAgent",
    "HostAgent",
    "AppAgent",
    "LLMEvaluator",
    "SUBTASK_FINISH",
    "interactor_approver",
    "render_template",
    "ENV_BASE_URL",
    "ENV_API_KEY",
    "ENV_MODEL",
]


def build_agent_set(settings: ModelSettings, client: ModelClient) -> AgentSet:
    """The agents for ``settings.agent`` (``single`` or ``host``) sharing ``client``, with the LLM judge."""
    if settings.agent == "host":
        agents: list[Any] = [HostAgent(client=client, settings=settings), AppAgent(client=client, settings=settings)]
    else:
        agents = [LinuxAgent(client=client, settings=settings)]
    return AgentSet(agents, evaluator=LLMEvaluator(client, settings))


def create_agent_provider(
    settings: Any = None,
    *,
    env: Mapping[str, str] | None = None,
    client_factory: Callable[[ModelSettings], ModelClient] | None = None,
) -> Callable[[Session], AgentSet]:
    """A provider for :class:`~saucer.engine.session.Session` (``agents=``) in normal mode.

    ``settings`` is the app's :class:`~saucer.config.Settings` (its ``llm``
    section is used), an ``[llm]`` mapping or a :class:`ModelSettings`; None
    means "the session's own settings". A given ``settings`` is checked now
    (:class:`ModelNotConfiguredError` naming what to set); otherwise when the
    first round needs the agents. One :class:`ModelClient` per session.
    """
    resolved = require_model_settings(settings, env) if settings is not None else None
    make_client = client_factory or ModelClient

    def provider(session: Session) -> AgentSet:
        model_settings = resolved or require_model_settings(getattr(session, "settings", None), env)
        client = make_client(model_settings)
        session.add_closer(client.aclose)
        return build_agent_set(model_settings, client)

    return provider
