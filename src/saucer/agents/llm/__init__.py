"""LLM agents for normal mode, over any OpenAI-compatible endpoint.

    from saucer.agents.llm import create_agent_provider, require_model_settings

    require_model_settings(settings)              # ModelNotConfiguredError says what to set
    provider = create_agent_provider(settings)    # provider(session) -> AgentSet
    Session(task, mode="normal", agents=provider, ...)

``[llm] agent = "single"`` (default) gives one :class:`LinuxAgent`, named ``app``;
``"host"`` gives a :class:`HostAgent` that hands subtasks to an
:class:`AppAgent`. Either way the set carries an :class:`LLMEvaluator`, used
when ``system.eva_round`` / ``system.eva_session`` are on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from saucer.agents.llm.agent import SUBTASK_FINISH, LLMAgent, ToolUsingAgent, interactor_approver
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
from saucer.agents.llm.single import LEGACY_SINGLE_AGENT, SINGLE_AGENT, LinuxAgent
from saucer.agents.llm.tools import ToolSet
from saucer.engine.agent import AgentSet

if TYPE_CHECKING:
    from saucer.engine.host import ProviderHost

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


def build_agent_set(settings: ModelSettings, client: ModelClient, *, single_name: str = SINGLE_AGENT) -> AgentSet:
    """The agents for ``settings.agent`` (``single`` or ``host``) sharing ``client``, with the LLM judge.

    The single agent is named ``single_name`` (``app``; a session stored
    under the old name keeps it, see :func:`create_agent_provider`).
    """
    if settings.agent == "host":
        agents: list[Any] = [HostAgent(client=client, settings=settings), AppAgent(client=client, settings=settings)]
    else:
        agents = [LinuxAgent(single_name, client=client, settings=settings)]
    return AgentSet(agents, evaluator=LLMEvaluator(client, settings))


def _single_agent_name(session: ProviderHost) -> str:
    """``app``, or ``linux`` for a session whose stored conversation (and cursor) name the agent so."""
    context = session.context  # None until the session's run opens it
    if context is not None and context.get_var(f"_llm.{LEGACY_SINGLE_AGENT}.meta") is not None:
        return LEGACY_SINGLE_AGENT
    return SINGLE_AGENT


def create_agent_provider(
    settings: Any = None,
    *,
    env: Mapping[str, str] | None = None,
    client_factory: Callable[[ModelSettings], ModelClient] | None = None,
) -> Callable[[ProviderHost], AgentSet]:
    """A provider for :class:`~saucer.engine.session.Session` (``agents=``) in normal mode.

    ``settings`` is the app's :class:`~saucer.config.Settings` (its ``llm``
    section is used), an ``[llm]`` mapping or a :class:`ModelSettings`; None
    means "the session's own settings". A given ``settings`` is checked now
    (:class:`ModelNotConfiguredError` naming what to set); otherwise when the
    first round needs the agents. One :class:`ModelClient` per session.
    """
    resolved = require_model_settings(settings, env) if settings is not None else None
    make_client = client_factory or ModelClient

    def provider(session: ProviderHost) -> AgentSet:
        model_settings = resolved or require_model_settings(session.settings, env)
        client = make_client(model_settings)
        session.add_closer(client.aclose)
        return build_agent_set(model_settings, client, single_name=_single_agent_name(session))

    return provider
