"""Agents and their states (UFO's Agent / AgentState / AgentStateManager).

An :class:`Agent` always has a current :class:`AgentState`. A round calls
``await agent.state.handle(agent, context)``, then asks the state for the next
state (``next_state(agent)``) and the next agent (``next_agent(agent)``).
A state whose ``is_round_end()`` is true ends the round before it is handled.

Each agent class has its own registry of states, keyed by the state's
``name()`` (a status such as ``CONTINUE``); a subclass sees its parents'
states and can replace them::

    class Reviewer(Agent):
        async def act(self, context):
            context.update_vars({"reviewed": True})
            return AgentStatus.FINISH

    @Reviewer.register_state
    class ReviewerContinue(ContinueState):
        def next_agent(self, agent):
            return agent.peers["writer"]      # hand the next step to the writer

The default ``CONTINUE`` state calls :meth:`Agent.act`, which returns the new
status (or sets ``agent.status``). Agents run commands with
:meth:`Agent.dispatch` (recorded in the step) and report model cost with
:meth:`Agent.add_cost`; the engine adds it to ``SESSION_COST`` and the round
ledger in the step's own commit, so cost and step land together.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import CoroutineType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from saucer.dispatch.messages import Command, Result
from saucer.engine.errors import DispatcherUnavailableError, UnknownStateError
from saucer.engine.interactor import UserChannel

if TYPE_CHECKING:
    from saucer.context import Context
    from saucer.engine.host import AgentHost, ProviderHost, RoundView
    from saucer.engine.logs import StepRecord
    from saucer.engine.routing import TransitionGraph

__all__ = [
    "AgentStatus",
    "AgentState",
    "StateRegistry",
    "Agent",
    "ContinueState",
    "FinishState",
    "ErrorState",
    "FailState",
    "NoActionState",
    "StopState",
    "PendingState",
    "ConfirmState",
    "AgentSet",
    "AgentProvider",
    "as_agent_set",
]


class AgentStatus(str, Enum):
    """What an agent reports after a step; the name of the state it goes to next."""

    CONTINUE = "CONTINUE"
    FINISH = "FINISH"
    ERROR = "ERROR"
    FAIL = "FAIL"
    PENDING = "PENDING"
    CONFIRM = "CONFIRM"
    #: The agent was asked to act and did nothing (e.g. a model answered in prose, never calling a tool).
    NO_ACTION = "NO_ACTION"
    #: A limit of the agent's own (e.g. a token budget) cut the session short: the round ends ``stopped``.
    STOP = "STOP"

    def __str__(self) -> str:
        return self.value


def _status_text(status: Any) -> str:
    return status.value if isinstance(status, Enum) else str(status)


class AgentState(ABC):
    """One state of an agent: what to do in a step, and where to go next."""

    #: The status this state stands for; ``name()`` returns it (default: the class name).
    status: ClassVar[str | None] = None

    @abstractmethod
    async def handle(self, agent: Agent, context: Context) -> None:
        """Do this state's work for one step (read and write ``context``, run commands)."""

    def next_state(self, agent: Agent) -> AgentState:
        """The state after this step: by default the agent's state named by ``agent.status``."""
        return agent.state_for(agent.status)

    def next_agent(self, agent: Agent) -> Agent:
        """The agent that takes the next step: by default ``agent.handoff`` if set, else ``agent``."""
        target = agent.handoff
        if target is None:
            return agent
        agent.handoff = None
        try:
            nxt = agent.peers[target]
        except KeyError:
            raise UnknownStateError(
                f"agent {agent.name!r} handed off to {target!r}, which is not an agent of this round "
                f"(agents: {', '.join(sorted(agent.peers)) or 'none'})"
            ) from None
        nxt.host = agent
        return nxt

    def is_round_end(self) -> bool:
        """True when reaching this state ends the round."""
        return False

    def is_subtask_end(self) -> bool:
        """True when reaching this state completes a subtask (counted in the round's ledger)."""
        return False

    @classmethod
    def name(cls) -> str:
        """The state's name (its status)."""
        return cls.status or cls.__name__

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name()}>"


class StateRegistry:
    """States of one agent class by name; falls back to the parent class's registry."""

    def __init__(self, owner: str, parent: StateRegistry | None = None) -> None:
        self.owner = owner
        self.parent = parent
        self._classes: dict[str, type[AgentState]] = {}
        self._instances: dict[str, AgentState] = {}

    def register(self, state_cls: type[AgentState]) -> type[AgentState]:
        """Register ``state_cls`` under ``state_cls.name()`` (usable as a decorator)."""
        if not (isinstance(state_cls, type) and issubclass(state_cls, AgentState)):
            raise TypeError(f"register needs an AgentState subclass, not {state_cls!r}")
        name = state_cls.name()
        self._classes[name] = state_cls
        self._instances.pop(name, None)
        return state_cls

    def get(self, name: Any) -> AgentState:
        """The (shared) state instance named ``name``; :class:`UnknownStateError` if none."""
        key = _status_text(name)
        state = self._instances.get(key)
        if state is not None:
            return state
        cls = self._lookup(key)
        if cls is None:
            raise UnknownStateError(
                f"agent class {self.owner} has no state {key!r}; registered: {', '.join(self.names())}"
            )
        state = self._instances[key] = cls()
        return state

    def _lookup(self, key: str) -> type[AgentState] | None:
        registry: StateRegistry | None = self
        while registry is not None:
            cls = registry._classes.get(key)
            if cls is not None:
                return cls
            registry = registry.parent
        return None

    def __contains__(self, name: Any) -> bool:
        return self._lookup(_status_text(name)) is not None

    def names(self) -> list[str]:
        """Every state name this registry resolves."""
        out: dict[str, None] = {}
        registry: StateRegistry | None = self
        while registry is not None:
            out.update(dict.fromkeys(registry._classes))
            registry = registry.parent
        return sorted(out)


S = TypeVar("S", bound=type[AgentState])

_NOBODY = UserChannel(None)


class Agent:
    """An agent: a name, a status, a current state, and the peers it can hand off to."""

    states: ClassVar[StateRegistry] = StateRegistry("Agent")
    #: The state an agent starts each round in.
    initial_status: ClassVar[str] = AgentStatus.CONTINUE.value
    #: True for an agent that saves what it sees of the desktop itself: ``system.save_ui_tree`` then
    #: takes no second look before its steps (the operator agent).
    looks_at_desktop: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        parent = next((b.states for b in cls.__mro__[1:] if issubclass(b, Agent) and "states" in b.__dict__), None)
        cls.states = StateRegistry(cls.__name__, parent)

    def __init__(self, name: str | None = None) -> None:
        self.name: str = name or type(self).__name__.lower()
        self.status: str = self.initial_status
        self.state: AgentState = self.state_for(self.initial_status)
        #: Other agents of the round, by name (set by the round).
        self.peers: dict[str, Agent] = {}
        #: The agent that handed control to this one (for ``RevertToInitiator``).
        self.host: Agent | None = None
        #: Set in a step to hand the next step to the peer of that name.
        self.handoff: str | None = None
        #: The record of the step being handled (set by the round).
        self.step: StepRecord | None = None
        #: The round being run (set by the round), as an agent may see it.
        self.round: RoundView | None = None
        #: The session of that round, as an agent may use it (set by the round).
        self.session: AgentHost | None = None
        #: Question for the ``PENDING`` state, action for the ``CONFIRM`` state.
        self.pending_question: str = ""
        self.pending_action: str = ""
        self.pending_target: str = ""
        #: Answers collected by the ``PENDING`` state.
        self.answers: list[str] = []
        #: Text the round stores as ``ROUND_RESULT`` when it ends.
        self.round_result: str | None = None

    # ---------------------------------------------------------------- states

    @classmethod
    def register_state(cls, state_cls: S) -> S:
        """Register a state for this agent class (a decorator)."""
        cls.states.register(state_cls)
        return state_cls

    def state_for(self, status: Any) -> AgentState:
        """This agent's state named ``status``."""
        return self.states.get(status)

    def set_state(self, state: AgentState) -> None:
        """Make ``state`` the current state."""
        self.state = state

    def reset(self) -> None:
        """Back to the initial state, before a round."""
        self.status = self.initial_status
        self.state = self.state_for(self.initial_status)
        self.handoff = None
        self.host = None

    async def handle(self, context: Context) -> None:
        """Handle one step in the current state (UFO's ``agent.handle``)."""
        await self.state.handle(self, context)

    # ----------------------------------------------------------- agent hooks

    async def act(self, context: Context) -> AgentStatus | str | None:
        """The work of one ``CONTINUE`` step; return the new status (None keeps ``self.status``)."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement act(context) or register its own CONTINUE state"
        )

    @property
    def user_channel(self) -> UserChannel:
        """The session's interactor (the non-interactive defaults outside a session)."""
        return self.session.user_channel if self.session is not None else _NOBODY

    def on_round_start(self, round: RoundView) -> None:
        """Called when a round that uses this agent starts (or is resumed)."""

    async def on_answer(self, context: Context, question: str, answer: str) -> None:
        """The user answered the ``PENDING`` question; default: keep the answer and continue."""
        self.answers.append(answer)
        self.status = AgentStatus.CONTINUE.value

    async def on_confirmed(self, context: Context, approved: bool) -> None:
        """The user decided on a sensitive step; default: continue if approved, else fail."""
        if approved:
            self.status = AgentStatus.CONTINUE.value
        else:
            self.status = AgentStatus.FAIL.value
            if self.step is not None:
                self.step.error = f"the user declined: {self.pending_action or 'sensitive step'}"

    # ---------------------------------------------------- step bookkeeping

    def add_cost(self, cost: float | None) -> None:
        """Add model cost to this step; None means "unknown" (reported as such, not as 0)."""
        step = self.step
        if step is None:
            return
        if cost is None or step.cost is None:
            step.cost = None
        else:
            step.cost += float(cost)

    def note(self, **fields: Any) -> None:
        """Add JSON fields to the step record (``extra``) and its structural log entry."""
        if self.step is not None:
            self.step.extra.update(fields)

    async def dispatch(
        self,
        context: Context,
        commands: Iterable[Command | Mapping[str, Any]],
        *,
        timeout: float | None = None,
    ) -> list[Result]:
        """Run ``commands`` through ``context.command_dispatcher``; one Result per command, in order.

        A dispatcher error becomes failure results (the step records them);
        only cancellation propagates. Commands and results are recorded in the step.
        """
        cmds = [c if isinstance(c, Command) else Command(**dict(c)) for c in commands]
        dispatcher = context.command_dispatcher
        if dispatcher is None:
            raise DispatcherUnavailableError(
                f"agent {self.name!r} has commands to run ({', '.join(c.tool_name for c in cmds)}) "
                "but no command dispatcher is attached to the Context"
            )
        try:
            if timeout is None:
                out = dispatcher.execute_commands(cmds)
            else:
                out = dispatcher.execute_commands(cmds, timeout=timeout)
            if inspect.isawaitable(out):
                out = await out
            results = [r if isinstance(r, Result) else Result.model_validate(r) for r in (out or [])]
        except Exception as exc:  # noqa: BLE001 - a tool error is a failed step, not a crash
            results = [Result.failure(c, f"dispatcher error: {type(exc).__name__}: {exc}") for c in cmds]
        if len(results) != len(cmds):
            got = len(results)
            results = results[: len(cmds)] + [
                Result.failure(c, f"the dispatcher returned {got} results for {len(cmds)} commands") for c in cmds[got:]
            ]
        step = self.step
        if step is not None:
            step.commands.extend(c.model_dump(mode="json") for c in cmds)
            step.results.extend(r.model_dump(mode="json", exclude_none=True) for r in results)
        return results

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} state={self.state.name()}>"


# ---------------------------------------------------------------- default states


@Agent.register_state
class ContinueState(AgentState):
    """Calls :meth:`Agent.act`; its return value (if any) becomes the status."""

    status = AgentStatus.CONTINUE.value

    async def handle(self, agent: Agent, context: Context) -> None:
        result: Any = agent.act(context)  # a subclass may define a plain ``act``
        if result.__class__ is CoroutineType or inspect.isawaitable(result):  # (an async act, most often)
            result = await result
        if result is not None:
            agent.status = _status_text(result)


@Agent.register_state
class FinishState(AgentState):
    """The agent is done: the round (and the current subtask) ends."""

    status = AgentStatus.FINISH.value

    async def handle(self, agent: Agent, context: Context) -> None:
        return None

    def is_round_end(self) -> bool:
        return True

    def is_subtask_end(self) -> bool:
        return True


@Agent.register_state
class ErrorState(AgentState):
    """The agent hit an error it cannot recover from: the round ends with an error."""

    status = AgentStatus.ERROR.value

    async def handle(self, agent: Agent, context: Context) -> None:
        return None

    def is_round_end(self) -> bool:
        return True


@Agent.register_state
class FailState(AgentState):
    """The agent gave up: the round ends as failed."""

    status = AgentStatus.FAIL.value

    async def handle(self, agent: Agent, context: Context) -> None:
        return None

    def is_round_end(self) -> bool:
        return True

    def is_subtask_end(self) -> bool:
        return True


@Agent.register_state
class NoActionState(AgentState):
    """The agent took no action where one was needed: the round ends ``no_action`` (never ``finished``)."""

    status = AgentStatus.NO_ACTION.value

    async def handle(self, agent: Agent, context: Context) -> None:
        return None

    def is_round_end(self) -> bool:
        return True


@Agent.register_state
class StopState(AgentState):
    """A limit cut the work short: the round, and so the session, end ``stopped`` (never ``finished``)."""

    status = AgentStatus.STOP.value

    async def handle(self, agent: Agent, context: Context) -> None:
        return None

    def is_round_end(self) -> bool:
        return True


@Agent.register_state
class PendingState(AgentState):
    """Ask the user ``agent.pending_question`` (the interactor's ``question_asker``), then continue."""

    status = AgentStatus.PENDING.value

    async def handle(self, agent: Agent, context: Context) -> None:
        question = agent.pending_question
        answer = await agent.user_channel.question_asker(question, len(agent.answers))
        agent.note(question=question, answer=answer)
        await agent.on_answer(context, question, answer)


@Agent.register_state
class ConfirmState(AgentState):
    """Ask before a sensitive step (``sensitive_step_asker``, default no); approved → continue."""

    status = AgentStatus.CONFIRM.value

    async def handle(self, agent: Agent, context: Context) -> None:
        approved = await agent.user_channel.sensitive_step_asker(agent.pending_action, agent.pending_target)
        agent.note(confirmed=approved, action=agent.pending_action)
        await agent.on_confirmed(context, approved)


# ------------------------------------------------------------ agent sets


@dataclass
class AgentSet:
    """The agents of a round: which one starts, and optionally a graph that routes between them."""

    agents: Sequence[Agent]
    initial: str | None = None
    graph: TransitionGraph | Mapping[str, Any] | None = None
    evaluator: Any = None
    by_name: dict[str, Agent] = field(init=False)

    def __post_init__(self) -> None:
        if not self.agents:
            raise ValueError("an AgentSet needs at least one agent")
        self.by_name = {}
        for agent in self.agents:
            if agent.name in self.by_name:
                raise ValueError(f"two agents are named {agent.name!r}; agent names must be unique in a round")
            self.by_name[agent.name] = agent
        for agent in self.agents:
            agent.peers = self.by_name
        if self.initial is None:
            self.initial = self.agents[0].name
        elif self.initial not in self.by_name:
            raise ValueError(f"initial agent {self.initial!r} is not one of {', '.join(self.by_name)}")


class AgentProvider(Protocol):
    """Makes the agents for a session's request-driven rounds (normal mode, text plan steps).

    A plain callable ``provider(session) -> AgentSet | Agent | list[Agent]``
    works too. ``saucer.agents.llm`` provides one via ``create_agent_provider(settings)``.
    """

    def __call__(self, session: ProviderHost) -> AgentSet | Agent | Sequence[Agent]: ...


def as_agent_set(value: Any) -> AgentSet:
    """An :class:`AgentSet` from what a provider returned."""
    if isinstance(value, AgentSet):
        return value
    if isinstance(value, Agent):
        return AgentSet([value])
    if isinstance(value, (list, tuple)) and all(isinstance(a, Agent) for a in value):
        return AgentSet(list(value))
    raise TypeError(f"an agent provider must return an AgentSet, an Agent or a list of Agents, not {value!r:.80}")
