"""What an agent may use of the session and the round it runs in: the :class:`AgentHost` and :class:`RoundView` protocols.

An agent never holds the :class:`~saucer.engine.session.Session` or the
:class:`~saucer.engine.round.Round` themselves: the round gives each of its
agents ``agent.session`` (an :class:`AgentHost`, which the session provides)
and ``agent.round`` (a :class:`RoundView`), and an agent uses only what these
protocols name. They live here, below the agent, the round and the session,
so none of those modules needs to import another to name them (the engine's
modules import each other in one direction only, type-only imports included).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from saucer.config import SettingsModel
    from saucer.context import Context
    from saucer.engine.interactor import UserChannel
    from saucer.engine.plan import PlanStep
    from saucer.store import EventStore

__all__ = ["SessionRef", "AgentHost", "ProviderHost", "RoundView"]


class SessionRef(Protocol):
    """A running session as the pending approvals and questions see it: where to record and wait."""

    @property
    def session_id(self) -> str: ...

    @property
    def store(self) -> EventStore | None:
        """The session's store while it runs (None before and after)."""
        ...

    @property
    def context(self) -> Context: ...

    def cancelled_by(self) -> tuple[str, str] | None:
        """``(who cancelled this run, what its end says)`` from the session's Context as it is, or None."""
        ...


class AgentHost(SessionRef, Protocol):
    """What an agent may use of its session (``agent.session``, set by the round)."""

    @property
    def settings(self) -> SettingsModel: ...

    @property
    def user_channel(self) -> UserChannel:
        """The session's interactor, its methods resolved once (:class:`~saucer.engine.interactor.UserChannel`)."""
        ...


class ProviderHost(AgentHost, Protocol):
    """What an agent provider is called with (``provider(session)``): the session, whose settings it
    reads and which closes what the provider opens for it (e.g. a model client's connections)."""

    def add_closer(self, closer: Callable[[], Awaitable[Any]]) -> None: ...


class RoundView(Protocol):
    """What an agent may read of the round it runs in (``agent.round``, and ``on_round_start(round)``)."""

    @property
    def id(self) -> int: ...

    @property
    def request(self) -> str: ...

    @property
    def plan_index(self) -> int | None:
        """The plan step this round runs (None: a request-driven round)."""
        ...

    @property
    def plan_step(self) -> PlanStep | str | None: ...
