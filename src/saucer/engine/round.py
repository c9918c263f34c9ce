"""A round: one request, driven through the agents' state machine step by step.

Each step::

    [system.save_ui_tree: the desktop's UI tree and a screenshot, saved as the step's artifacts]
      →  handle (agent.state.handle)  →  choose next state and agent (states or graph)
      →  [save_ui_tree, the round's last step: the desktop once more, artifacts marked "after"]
      →  [a desktop session: APPLICATION_* from the focused window (saucer.engine.application)]
      →  ledger (SESSION_STEP, ROUND_STEP, cost, subtasks) + structural log entry
      →  ONE commit: the step's Context changes + its StepRecord + the cursor
      →  response.log line, observer.on_step

So after a crash either all of a step is in the store (its changes, its cost,
its record and where to continue) or none of it. The round ends when the
current state's ``is_round_end()`` holds, when the graph terminates, when
the session's ``max_step`` is reached, or on an error.

A round talks to its session only through :class:`RoundHost`, the session's
small public interface for rounds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from saucer.context.names import ContextNames
from saucer.engine.accounting import Limits
from saucer.engine.agent import Agent, AgentSet, AgentState, AgentStatus
from saucer.engine.errors import GraphError
from saucer.engine.host import AgentHost
from saucer.engine.logs import SessionLogs, StepRecord
from saucer.engine.summaries import summary_of
from saucer.engine.uitree import artifact_name, look

if TYPE_CHECKING:
    from saucer.engine.application import ApplicationWatch
    from saucer.engine.meta import CursorMeta
    from saucer.engine.plan import PlanStep
    from saucer.engine.routing import TransitionGraph

__all__ = ["Round", "RoundResult", "RoundStatus", "RoundHost"]

_SESSION_STEP = ContextNames.SESSION_STEP
_ROUND_STEP = ContextNames.CURRENT_ROUND_STEP
_SESSION_COST = ContextNames.SESSION_COST
_ROUND_COST = ContextNames.CURRENT_ROUND_COST
_ROUND_SUBTASKS = ContextNames.CURRENT_ROUND_SUBTASK_AMOUNT
_SUBTASK = ContextNames.SUBTASK
_perf = time.perf_counter
_now = time.time


class RoundStatus:
    """How a round ended."""

    FINISHED = "finished"
    FAILED = "failed"
    ERROR = "error"
    STOPPED = "stopped"  # a limit was reached: the session's max_step, or an agent's own (token budget)
    NO_ACTION = "no_action"  # the agent did nothing where an action was needed


@dataclass(slots=True)
class RoundResult:
    """The outcome of one round."""

    round_id: int
    status: str
    steps: int = 0
    cost: float | None = 0.0
    reason: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == RoundStatus.FINISHED

    def to_dict(self) -> dict[str, Any]:
        return {
            "round": self.round_id,
            "status": self.status,
            "steps": self.steps,
            "cost": self.cost,
            "reason": self.reason,
            "error": self.error,
        }


_STATUS_OF_STATE = {
    AgentStatus.FINISH.value: RoundStatus.FINISHED,
    AgentStatus.FAIL.value: RoundStatus.FAILED,
    AgentStatus.ERROR.value: RoundStatus.ERROR,
    AgentStatus.NO_ACTION.value: RoundStatus.NO_ACTION,
    AgentStatus.STOP.value: RoundStatus.STOPPED,
}


class RoundHost(AgentHost, Protocol):
    """What a round needs of its session (and, as :class:`~saucer.engine.host.AgentHost`, what it
    hands its agents); :class:`~saucer.engine.session.Session` provides it."""

    logs: SessionLogs
    limits: Limits
    #: Steps of the whole session committed so far.
    session_step: int
    #: Fill ``STRUCTURAL_LOGS`` with one entry per step.
    structural_logs: bool
    #: Settings that are on but cannot apply to this session -> why (:mod:`saucer.engine.defaults`).
    skipped: dict[str, str]
    #: Fills UFO's APPLICATION_* names after each step, in a session with a desktop (else None).
    application: ApplicationWatch | None

    def lease_checker(self) -> Callable[[], None]:
        """What to call before each step: it raises if this runner lost its lease on the session."""
        ...

    def step_cursor(self, round_id: int, plan_index: int | None, agent: str, state: str) -> CursorMeta:
        """The resume cursor a step's commit carries: the agent and state that act next."""
        ...

    def note_unknown_cost(self) -> None:
        """Some cost of this session could not be priced."""

    def step_committed(
        self, rnd: Round, agent: Agent, record: StepRecord, *, subtask_end: bool = False, failed: bool = False
    ) -> Awaitable[None] | None:
        """A step's commit is in the store: count it, log it; what tells the observer (to await), or None
        when it has no ``on_step`` (no coroutine made per step for nothing)."""


class Round:
    """One request's worth of steps. Created by :meth:`Session.create_new_round`."""

    def __init__(
        self,
        session: RoundHost,
        round_id: int,
        request: str,
        agents: AgentSet,
        *,
        plan_index: int | None = None,
        plan_step: PlanStep | str | None = None,
        start_agent: str | None = None,
        start_state: str | None = None,
    ) -> None:
        self.session = session
        self.id = round_id
        self.request = request
        self.agent_set = agents
        self.plan_index = plan_index
        self.plan_step = plan_step
        graph = agents.graph
        if graph is not None:  # routing is loaded only by the rounds that have a graph
            from saucer.engine.routing import TransitionGraph

            if not isinstance(graph, TransitionGraph):
                graph = TransitionGraph.from_dict(graph)  # UnknownConditionError fails this session only
        self.graph: TransitionGraph | None = graph
        self.turns = 0
        ctx = session.context
        #: The round's steps and cost so far (from its ledger entries when resumed); its cost is None
        #: once some of it is unknown.
        self.steps: int = ctx.get(ContextNames.ROUND_STEP).get(round_id, 0) if ctx is not None else 0
        ledger = ctx.get(ContextNames.ROUND_COST) if ctx is not None else {}
        self.cost: float | None = ledger.get(round_id, 0.0)
        self.terminated: str | None = None
        initial = start_agent or (graph.initial_agent if graph is not None else agents.initial)
        if initial not in agents.by_name:
            raise GraphError(f"round {round_id}: agent {initial!r} is not one of {', '.join(agents.by_name)}")
        for agent in agents.agents:
            agent.reset()
            agent.round = self
            agent.session = session
            agent.on_round_start(self)
        self.agent: Agent = agents.by_name[initial]
        if start_state is not None:
            self.agent.status = start_state
            self.agent.set_state(self.agent.state_for(start_state))

    @property
    def state(self) -> AgentState:
        return self.agent.state

    def is_finished(self) -> bool:
        """The current state ends the round, or the session's step limit is reached."""
        return self.agent.state.is_round_end() or self.session.limits.step_reached(self.session.session_step)

    # ------------------------------------------------------------------ run

    async def run(self) -> RoundResult:
        """Step until the round ends; return how it ended."""
        session = self.session
        limits = session.limits
        check_lease = session.lease_checker()
        sleep_time = session.settings.system.sleep_time
        save_ui_tree = session.settings.system.save_ui_tree and "save_ui_tree" not in session.skipped
        context = session.context
        commit_step = context.acommit_step
        agent = self.agent
        state = agent.state
        round_step = session.context.current_round_step
        subtask_index = session.context.current_round_subtask_amount
        while not state.is_round_end() and self.terminated is None:
            if limits.step_reached(session.session_step):
                return self._end(RoundStatus.STOPPED, f"max_step ({limits.max_step}) reached")
            cancelled = session.cancelled_by()
            if cancelled is not None:  # a person cancelled the session: no other step starts
                return self._end(RoundStatus.STOPPED, cancelled[1])
            check_lease()
            round_step += 1
            record = StepRecord(
                session.session_id,
                self.id,
                round_step,
                session.session_step + 1,
                agent.name,
                state.name(),
                subtask_index=subtask_index,
                plan_index=self.plan_index,
                started_at=_now(),
            )
            if save_ui_tree and not agent.looks_at_desktop:
                # What the step starts from, saved before it acts (an agent that looks itself saves its own).
                dispatcher = session.context.command_dispatcher
                view = await look(dispatcher, artifact_name(record.session_step))
                record.artifacts = view.artifacts()
            t0 = _perf()
            # The step (the agent's ``record`` while it acts), and who acts next, in which state:
            # inline (a coroutine of its own per step costs more than its body).
            agent.step = record
            try:
                try:
                    await state.handle(agent, context)
                    record.status = agent.status
                    if not record.subtask:
                        record.subtask = context.get(_SUBTASK)
                    next_agent, next_state = self._route(agent, state.next_state(agent), record)
                finally:
                    agent.step = None
                record.next_agent = next_agent.name
                record.next_state = next_state.name()
            except (asyncio.CancelledError, KeyboardInterrupt):
                raise
            except Exception as exc:  # noqa: BLE001 - one failed step fails this round, not the process
                return await self._step_failed(agent, record, exc, t0)
            if session.application is not None:  # the focused application, in this step's commit
                dispatcher = session.context.command_dispatcher
                await session.application.after_step(dispatcher, session.context, record.commands, record.results)
            t1 = _perf()
            if save_ui_tree and (next_state.is_round_end() or limits.step_reached(record.session_step)):
                # The state the round leaves behind: nothing else would capture it (UFO saves it too).
                dispatcher = session.context.command_dispatcher
                view = await look(dispatcher, artifact_name(record.session_step) + "-after")
                record.artifacts = [*record.artifacts, *({**entry, "after": True} for entry in view.artifacts())]
            subtask_end = next_state.is_subtask_end()
            self._charge(record, subtask_end)
            # ONE commit: the step's Context changes, its record and the cursor (who acts next).
            meta = self._step_meta(record, next_agent.name, record.next_state or "")
            if agent.round_result is not None:  # what the round's end says if a resume finds it ended here
                meta["round_result"] = agent.round_result
            t2 = _perf()
            record.version = await commit_step(
                author=agent.name, round=self.id, step=record.session_step, meta=meta, summary=summary_of(meta)
            )
            t3 = _perf()
            record.timings = {
                "handle_ms": (t1 - t0) * 1000.0,
                "commit_ms": (t3 - t2) * 1000.0,
                "total_ms": (t3 - t0) * 1000.0,
            }
            self.steps += 1
            told = session.step_committed(self, agent, record, subtask_end=subtask_end)
            if told is not None:  # an observer's on_step
                await told
            if subtask_end:
                subtask_index += 1
            # Apply the decision only now that it is committed.
            agent = self.agent = next_agent
            agent.set_state(next_state)
            state = next_state
            if sleep_time:
                await asyncio.sleep(sleep_time)
            elif not (record.session_step & 31):
                await asyncio.sleep(0)  # let other sessions of a pool run
        if self.terminated is not None:
            return self._end(RoundStatus.FINISHED, self.terminated)
        status = _STATUS_OF_STATE.get(state.name(), RoundStatus.FINISHED)
        reason = agent.round_result or (
            f"agent {agent.name!r} ended in state {state.name()}" if status != RoundStatus.FINISHED else ""
        )
        return self._end(status, reason)

    def _charge(self, record: StepRecord, subtask_end: bool) -> None:
        """The step's share of the ledger (steps, cost, subtasks, structural log), in its commit."""
        ctx = self.session.context
        increments: dict[ContextNames | str, int | float] = {_SESSION_STEP: 1, _ROUND_STEP: 1}
        cost = record.cost
        if cost is None:  # unknown: the round's ledger entry becomes None and stays so
            if self.cost is not None:
                ctx.update_dict(ContextNames.ROUND_COST, {self.id: None})
            self.cost = None
            self.session.note_unknown_cost()
        elif cost:
            increments[_SESSION_COST] = cost
            if self.cost is not None:
                increments[_ROUND_COST] = cost
                self.cost += cost
        if subtask_end:
            increments[_ROUND_SUBTASKS] = 1
        ctx.charge(increments, _structural_entry(record) if self.session.structural_logs else None)

    def _route(self, agent: Agent, next_state: AgentState, record: StepRecord) -> tuple[Agent, AgentState]:
        """The agent and state of the next step."""
        graph = self.graph
        if graph is None:
            nxt = agent.state.next_agent(agent)
            if nxt is agent:
                return agent, next_state
            name = next_state.name()
            return nxt, (next_state if nxt.states is agent.states else nxt.state_for(name))
        if next_state.is_round_end() and next_state.name() == AgentStatus.ERROR.value:
            return agent, next_state  # an error ends the round whatever the graph says
        from saucer.engine.routing import AgentTarget, RevertToInitiator, RouteInput, StayTarget, Terminate

        tools = tuple(c["tool_name"] for c in record.commands)
        # What other writers committed while the step ran (an observer's flag) counts for this decision.
        self.session.context.catch_up()
        target = graph.route(RouteInput(self.session.context, agent.name, tools, self.turns))
        self.turns += 1
        if isinstance(target, StayTarget):
            return agent, next_state
        if isinstance(target, Terminate):
            self.terminated = target.reason or "terminated by the transition graph"
            return agent, agent.state_for(AgentStatus.FINISH)
        if isinstance(target, AgentTarget):
            found = self.agent_set.by_name.get(target.name)
            if found is None:
                raise GraphError(
                    f"the transition graph routes to agent {target.name!r}, which is not one of "
                    f"{', '.join(self.agent_set.by_name)}"
                )
            nxt = found
        elif isinstance(target, RevertToInitiator):
            nxt = agent.host or self.agent_set.by_name[graph.initial_agent]
        else:
            raise GraphError(f"the round does not know how to go to target {target!r}")
        if nxt is agent:
            return agent, next_state
        nxt.host = agent
        nxt.status = nxt.initial_status
        return nxt, nxt.state_for(nxt.initial_status)

    async def _step_failed(self, agent: Agent, record: StepRecord, exc: BaseException, t0: float) -> RoundResult:
        """A step raised: discard its changes, commit a record of the failure, end the round with an error."""
        session = self.session
        ctx = session.context
        message = f"{type(exc).__name__}: {exc}"
        if ctx.store is not None and ctx.durability != "exit":
            ctx.rollback()  # in ``exit`` mode that would also drop the earlier, uncommitted steps
        record.status = AgentStatus.ERROR.value
        record.error = message
        ctx.incr(_SESSION_STEP)
        ctx.incr(_ROUND_STEP)
        error_state = agent.state_for(AgentStatus.ERROR)
        record.next_agent = agent.name
        record.next_state = error_state.name()
        meta = self._step_meta(record, agent.name, error_state.name())
        record.version = await ctx.acommit_step(
            author=agent.name, round=self.id, step=record.session_step, meta=meta, summary=summary_of(meta)
        )
        record.timings = {"total_ms": (_perf() - t0) * 1000.0}
        self.steps += 1
        agent.set_state(error_state)
        told = session.step_committed(self, agent, record, failed=True)
        if told is not None:
            await told
        return self._end(RoundStatus.ERROR, f"step {record.step} of agent {agent.name!r} failed", error=message)

    def _step_meta(self, record: StepRecord, next_agent: str, next_state: str) -> dict[str, Any]:
        """A step's commit meta: its record, and the cursor of the agent and state that act next."""
        # A StepMeta (engine.meta): the record's compact form, a new dict, completed in place.
        meta = cast("dict[str, Any]", record.to_meta())
        meta["kind"] = "step"
        meta["session_status"] = "running"
        meta["cursor"] = self.session.step_cursor(self.id, self.plan_index, next_agent, next_state)
        return meta

    def _end(self, status: str, reason: str, error: str | None = None) -> RoundResult:
        return RoundResult(self.id, status, self.steps, self.cost, reason, error)


def _structural_entry(record: StepRecord) -> dict[str, Any]:
    entry = {
        "Round": record.round,
        "SubtaskIndex": record.subtask_index,
        "Step": record.step,
        "Agent": record.agent,
        "State": record.state,
        "Status": record.status,
    }
    if record.cost != 0.0:
        entry["Cost"] = record.cost
    if record.subtask:
        entry["Subtask"] = record.subtask
    if record.commands:
        entry["Commands"] = [c["tool_name"] for c in record.commands]
        entry["Results"] = [r.get("status") for r in record.results]
    if record.extra:
        entry.update(record.extra)
    return entry
