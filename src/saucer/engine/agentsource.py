"""Which agents run a session's round: the follower for a plan's command steps, the request agents otherwise.

:class:`AgentSource` is the session's collaborator that makes each kind of
:class:`~saucer.engine.agent.AgentSet` once, when a round first needs it: the
follower named by ``agents.follower`` for a command step, and for requests
(and a plan's text steps) the agents the session was given, a provider called
with the session (a :class:`~saucer.engine.host.ProviderHost`) or ready agents,
routed by the session's transition graph when it has one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from saucer.engine.agent import Agent, AgentProvider, AgentSet, as_agent_set
from saucer.engine.components import new_follower
from saucer.engine.errors import LLMUnavailableError
from saucer.engine.plan import PlanStep

if TYPE_CHECKING:
    from saucer.config import SettingsModel
    from saucer.engine.evaluation import Evaluator
    from saucer.engine.host import ProviderHost
    from saucer.engine.routing import TransitionGraph

__all__ = ["AgentSource", "AgentsSpec"]

AgentsSpec = AgentProvider | AgentSet | Agent | Sequence[Agent]
"""What a session is given as its request agents: a provider, or the agents themselves."""


class AgentSource:
    """Makes and keeps a session's agent sets (see the module docs)."""

    def __init__(
        self, agents: AgentsSpec | None, graph: TransitionGraph | Mapping[str, Any] | None, settings: SettingsModel
    ) -> None:
        self._spec = agents
        self._graph = graph
        self._settings = settings
        self._follower_set: AgentSet | None = None
        self._request_set: AgentSet | None = None

    def for_step(self, step: PlanStep | str | None, host: ProviderHost, where: str) -> AgentSet:
        """The agents of a round that runs ``step`` (a command step, a text step, or None: a request).

        ``host`` is what a provider is called with; ``where`` names the round in the error
        raised when it needs LLM agents and the session has none.
        """
        if isinstance(step, PlanStep):
            if self._follower_set is None:
                self._follower_set = AgentSet([new_follower(self._settings)])
            return self._follower_set
        if self._request_set is None:
            spec = self._spec
            if spec is None:
                raise LLMUnavailableError(
                    f"{where} needs an LLM agent, and none is available to session {host.session_id!r}; "
                    "configure one ([llm] base_url, model, api_key) or use command steps"
                )
            made: object = spec
            if callable(spec) and not isinstance(spec, (Agent, AgentSet)):
                made = spec(host)
            agent_set = as_agent_set(made)
            if self._graph is not None:
                agent_set = AgentSet(list(agent_set.agents), agent_set.initial, self._graph, agent_set.evaluator)
            self._request_set = agent_set
        return self._request_set

    def evaluator(self) -> Evaluator | None:
        """The evaluator that came with the request agents, once they are made (else None)."""
        return self._request_set.evaluator if self._request_set is not None else None
