"""Where a session's rounds come from: its :class:`Agenda`.

With a plan, round *i* runs plan step *i* (a command step through the
follower agent, offline; a text step through the LLM agents); otherwise
rounds come from requests (``request=``, then the interactor's
``first_request``/``new_request`` in normal mode). The agenda keeps the id of
the next round and the index of the next plan step (a resumed run continues
them from its cursor), gives the next request, and says whether work is left
when a limit stops the session. What it reads of the session is the
:class:`AgendaHost` protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from saucer.engine.errors import EngineError

if TYPE_CHECKING:
    from saucer.context import Context
    from saucer.engine.accounting import Limits
    from saucer.engine.cursor import Progress
    from saucer.engine.interactor import UserChannel
    from saucer.engine.plan import Plan, PlanStep

__all__ = ["Agenda", "AgendaHost", "NextRound"]

NextRound = tuple[int, "int | None", "PlanStep | str | None"]
"""The next round's id, its plan step's index and the step (None, None for a request-driven round)."""


class AgendaHost(Protocol):
    """What the agenda reads of its session (:class:`~saucer.engine.session.Session`)."""

    @property
    def session_id(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def request(self) -> str: ...
    @property
    def ask_new_requests(self) -> bool: ...
    @property
    def plan(self) -> Plan | None: ...
    @property
    def progress(self) -> Progress: ...
    @property
    def user_channel(self) -> UserChannel: ...
    @property
    def context(self) -> Context: ...


class Agenda:
    """The next round, the next request, and whether work is left (see the module docs)."""

    def __init__(self, host: AgendaHost) -> None:
        self._host = host
        #: The id of the next round.
        self.next_round_id = 0
        #: The index of the next plan step (a plan-driven session).
        self.next_plan_index = 0

    def next_round(self) -> NextRound:
        """The id, plan index and plan step of the round to open next."""
        plan = self._host.plan
        if plan is not None and plan.steps:
            return self.next_round_id, self.next_plan_index, plan.steps[self.next_plan_index]
        return self.next_round_id, None, None

    def step_at(self, plan_index: int | None) -> PlanStep | str | None:
        """Plan step ``plan_index`` (None when there is no plan or no index)."""
        plan = self._host.plan
        return plan.steps[plan_index] if plan is not None and plan_index is not None else None

    def where(self, step: PlanStep | str | None) -> str:
        """How an error names the round that runs ``step``."""
        return f"plan step {self.next_plan_index} ({step!r:.60})" if isinstance(step, str) else "this request"

    def opened(self, round_id: int, plan_index: int | None) -> None:
        """A round's start is committed: the next one comes after it."""
        self.next_round_id = round_id + 1
        if plan_index is not None:
            self.next_plan_index = plan_index + 1

    def continue_at(self, next_round_id: int | None, next_plan_index: int | None) -> None:
        """A resumed run: the next round and plan step are those its cursor says (None: unchanged)."""
        if next_round_id is not None:
            self.next_round_id = next_round_id
        if next_plan_index is not None:
            self.next_plan_index = next_plan_index

    def note_limits(self, limits: Limits, session_step: int) -> None:
        """A limit ended the session's loop: ``stopped`` when work was left, else just the reason (in its
        progress; nothing when it already ended otherwise)."""
        p = self._host.progress
        if p.error or p.stopped:
            return
        if limits.round_reached(p.rounds):
            limit = f"max_round ({limits.max_round}) reached"
        elif limits.step_reached(session_step):
            limit = f"max_step ({limits.max_step}) reached"
        else:
            return
        if self.work_left():
            p.stopped = limit
        else:
            p.reason = limit

    def work_left(self) -> bool:
        """Whether another round would run (without a limit)."""
        host = self._host
        plan = host.plan
        if plan is not None and plan.steps:
            return self.next_plan_index < len(plan.steps)
        if host.progress.requests == 0:
            return True
        # A request-driven session goes on while its user can give more requests.
        return host.ask_new_requests and host.user_channel.interactive(True)

    async def next_request(self) -> str | None:
        """The request of the next round, or None when there is no more work."""
        host = self._host
        plan = host.plan
        if plan is not None and plan.steps:
            index = self.next_plan_index
            if index >= len(plan.steps):
                return None
            return plan.step_text(index)
        if host.progress.requests == 0:
            request = host.request or (plan.task if plan is not None else "")
            if not request:
                if host.mode != "normal":
                    raise EngineError(
                        f"session {host.session_id!r} ({host.mode} mode) has no request and no plan steps"
                    )
                await host.context.acommit()  # what was deferred is written before waiting for a person
                request = await host.user_channel.first_request()
                if not request:
                    raise EngineError("no request was given (pass a request, or run with a terminal to type one)")
        elif host.ask_new_requests:
            await host.context.acommit()  # (as above)
            new = await host.user_channel.new_request()
            if new is None:
                return None
            request = new
        else:
            return None
        host.progress.requests += 1
        return request
