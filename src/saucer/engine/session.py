"""A session: rounds of requests over one durable Context, run under a lease, resumable.

::

    session = Session("tidy notes", mode="follower", plan=load_plan("plan.json"),
                      store="sqlite:///.saucer/saucer.db", dispatcher=my_dispatcher)
    result = await session.run()            # SessionResult
    ...
    result = await Session.resume(session.session_id, store=url, dispatcher=d).run()

This module is the session's lifecycle: start, the loop of rounds, the end.
Its other concerns are collaborators it composes, each in its module and each
seeing only what it needs of the session: where rounds come from
(:mod:`~saucer.engine.agenda`), which agents run them
(:mod:`~saucer.engine.agentsource`), where a resumed run continues and what a
committed step means for it (:mod:`~saucer.engine.resume`, over the cursor of
:mod:`~saucer.engine.cursor`), the store, lease and dispatcher a run holds
(:mod:`~saucer.engine.resources`), and the verdicts, end and result
(:mod:`~saucer.engine.outcome`). A :class:`~saucer.engine.round.Round` sees the
session through :class:`~saucer.engine.round.RoundHost`, an agent through
:class:`~saucer.engine.host.AgentHost`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Self, cast, runtime_checkable

from saucer.config import SettingsModel, load_settings
from saucer.context import Context, ContextNames
from saucer.engine.accounting import CostSummary, Limits
from saucer.engine.agenda import Agenda
from saucer.engine.agent import Agent, AgentSet
from saucer.engine.agentsource import AgentSource, AgentsSpec
from saucer.engine.application import ApplicationWatch
from saucer.engine.cancel import CancelWatch
from saucer.engine.cursor import Progress, cursor_meta
from saucer.engine.defaults import inapplicable, say_once
from saucer.engine.errors import LeaseLostError
from saucer.engine.evaluation import Evaluation, Evaluator, Scope, judge
from saucer.engine.interactor import Interactor, UserChannel
from saucer.engine.lease import lease_owner
from saucer.engine.logs import SessionLogs, StepRecord, new_session_id
from saucer.engine.notify import CompositeObserver, ObserverCaller
from saucer.engine.outcome import ExperienceSaver, OutcomeRecorder
from saucer.engine.plan import Plan, PlanStep, declared_participants, initial_vars, parse_plan
from saucer.engine.resources import RunResources
from saucer.engine.result import SessionResult, SessionStatus
from saucer.engine.resume import Resumer, StartPoint, StoredPlan, creation_meta, open_session_logs, resume_arguments
from saucer.engine.round import Round, RoundResult
from saucer.engine.summaries import summary_of
from saucer.store import EventStore, SessionNotFoundError, StoreError
from saucer.store.base import Lease

if TYPE_CHECKING:
    from saucer.dispatch.base import BasicCommandDispatcher
    from saucer.engine.meta import CursorMeta, RoundStartMeta
    from saucer.engine.routing import TransitionGraph

__all__ = ["Session", "SessionObserver", "SessionResult", "SessionStatus", "new_session_id", "lease_owner"]

_log = logging.getLogger("saucer.engine")


@runtime_checkable
class SessionObserver(Protocol):
    """Hooks for live progress (:mod:`saucer.engine.observer`); all optional, plain or async."""

    def on_session_start(self, session: Session) -> Any: ...
    def on_round_start(self, session: Session, round: Round) -> Any: ...
    def on_step(self, session: Session, record: StepRecord) -> Any: ...
    def on_round_end(self, session: Session, round: Round, result: RoundResult) -> Any: ...
    def on_session_end(self, session: Session, result: SessionResult) -> Any: ...


class Session:
    """One conversation: rounds of steps over a durable Context. See the module docs.

    Its collaborators: a :class:`~saucer.engine.resume.Resumer` (where a run
    continues), an :class:`~saucer.engine.outcome.OutcomeRecorder` (verdicts,
    status, the end and the result), a lease keeper, a dispatcher holder.
    """

    def __init__(
        self,
        task: str,
        *,
        mode: str = "normal",
        settings: SettingsModel | None = None,
        store: EventStore | str | None = None,
        session_id: str | None = None,
        request: str = "",
        plan: Plan | Mapping[str, Any] | None = None,
        plan_file: str | None = None,
        agents: AgentsSpec | None = None,
        graph: TransitionGraph | Mapping[str, Any] | None = None,
        dispatcher: BasicCommandDispatcher | None = None,
        dispatcher_factory: Callable[[Session], Any] | None = None,
        interactor: Interactor | None = None,
        observer: SessionObserver | None = None,
        evaluator: Evaluator | None = None,
        experience_saver: ExperienceSaver | None = None,
        platform: str = "linux",
        id: int = 0,
        lease_wait: float = 0.0,
        stop_on_failure: bool | None = None,
        ask_new_requests: bool | None = None,
        workspace: str | Path | None = None,
        context_vars: Mapping[str, Any] | None = None,
        participants: Iterable[str] | None = None,
        user: str | None = None,
    ) -> None:
        if not isinstance(task, str) or not task.strip():
            raise ValueError("a session needs a task name")
        self.task = task
        self.mode = mode
        self.settings = settings if settings is not None else load_settings()
        self.session_id = session_id or new_session_id(task)
        self.request = request or ""
        self.plan_file = plan_file
        parsed = parse_plan(plan, plan_file or "plan") if plan is not None else None
        self._plan = StoredPlan(parsed, plan_file)
        #: Context variables a new session starts with (the plan's ``vars``, then ``context_vars``).
        self.context_vars = initial_vars(parsed, context_vars)
        #: Who may write to it besides its runner (None: everyone), declared when it is created:
        #: the plan's ``participants`` and ``participants``, and ``user`` (who submitted it) with them.
        self.participants = declared_participants(parsed, participants, user)
        self.platform = platform
        #: The directory the built-in tools act in; stored so a resumed session uses the same one.
        self.workspace: str | None = str(Path(workspace).resolve()) if workspace else None
        self.id = id
        #: The session's interactor, its methods resolved once (what the engine and the agents call).
        self.user_channel = UserChannel(interactor)
        self.observer = observer
        self.lease_wait = lease_wait
        #: Overrides ``system.save_experience`` for this session (a pool decides once for all its sessions).
        self.save_experience: str | None = None
        self.limits = Limits(self.settings.system.max_step, self.settings.system.max_round)
        #: Stop after a failed round (default: yes, except in normal mode).
        self.stop_on_failure = stop_on_failure if stop_on_failure is not None else mode != "normal"
        #: Ask the interactor for more requests after the first (default: normal mode only).
        self.ask_new_requests = ask_new_requests if ask_new_requests is not None else mode == "normal"
        #: Fill ``STRUCTURAL_LOGS`` with one entry per step.
        self.structural_logs = True
        #: Settings that are on but cannot apply to this session -> why; in its start and end events.
        self.skipped: dict[str, str] = {}
        #: Fills UFO's APPLICATION_* names after each step when the session's tools include a desktop.
        self.application: ApplicationWatch | None = None
        #: Called as ``hook(session, round, agent)`` after a step that ends a subtask.
        self.subtask_end_hook: Callable[..., Any] | None = None
        #: The session's counters and verdict so far (carried by every resume cursor).
        self.progress = Progress()
        #: Steps of the whole session committed so far.
        self.session_step = 0
        self.owner = lease_owner()
        self.context: Context = None  # type: ignore[assignment]  # set by run()
        self._cancel = CancelWatch()  # whether a person cancelled this run (saucer cancel, the viewer, the API)
        self.logs: SessionLogs = SessionLogs.disabled()
        self.result: SessionResult | None = None
        self._agents = AgentSource(agents, graph, self.settings)
        self._held = RunResources(self.session_id, self.settings, store, dispatcher, dispatcher_factory)
        self._notify = ObserverCaller(observer)
        self._resumer = Resumer(self.session_id)
        self._outcome = OutcomeRecorder(
            self, evaluator=evaluator, fallback_evaluator=self._agents.evaluator, experience_saver=experience_saver
        )
        self._start_hooks: list[Callable[..., Any]] = []
        self._end_hooks: list[Callable[..., Any]] = []
        self._agenda = Agenda(self)
        self._round: Round | None = None
        self._rounds: dict[int, Round] = {}
        self._pending_round_eval: int | None = None
        self.work_done = False  #: the agenda has no more work (the loop's end is a finish, not a stop)
        self._phase = "new"

    @classmethod
    def resume(
        cls,
        session_id: str,
        *,
        store: EventStore | str | None = None,
        settings: SettingsModel | None = None,
        retry_failed: bool = False,
        **kwargs: Any,
    ) -> Self:
        """A Session that continues ``session_id`` at its first uncommitted step when :meth:`run`.

        Task, mode, request and plan come from the stored session; pass the
        same kind of ``agents``/``dispatcher`` the first run had.
        ``lease_wait=SECONDS`` waits that long for a dead runner's lease to expire.

        A session that a limit stopped continues where the limit cut it, with
        a fresh budget of ``max_step`` steps and ``max_round`` rounds. A
        finished session only reports its result; so does a failed one,
        unless ``retry_failed``: then its failed step runs again (the failed
        attempt stays in the log) and the session goes on from there.
        """
        settings = settings if settings is not None else load_settings()
        spec = store if store is not None else settings.store.url
        arguments, plan_holder = resume_arguments(spec, settings, session_id, kwargs)
        session = cls(**arguments)
        session._plan.stored_in(plan_holder)  # read when a step of it is first needed
        session._resumer = Resumer(session_id, resuming=True, retry_failed=retry_failed)
        return session

    @property
    def plan(self) -> Plan | None:
        """The session's plan (None: none); a resumed session's is read from its store when first needed."""
        return self._plan.get(self.store if self.store is not None else self._held.spec, self.settings)

    @plan.setter
    def plan(self, value: Plan | None) -> None:
        self._plan.set(value)

    @property
    def interactor(self) -> Interactor | None:
        """The session's interactor as given (setting it makes a new :attr:`user_channel`)."""
        return cast("Interactor | None", self.user_channel.interactor)  # the object given, as typed here

    @interactor.setter
    def interactor(self, value: Interactor | None) -> None:
        self.user_channel = UserChannel(value)

    @property
    def evaluator(self) -> Any:
        """The evaluator given to the session (or made for it once it judged: ``agents.evaluator``)."""
        return self._outcome.evaluator

    @property
    def experience_saver(self) -> ExperienceSaver | None:
        """Saves the session's experience plan its own way, when given (``saver(session, plan, path)``)."""
        return self._outcome.experience_saver

    @property
    def resumed(self) -> bool:
        """True for a session made by :meth:`resume` (it continues a stored session)."""
        return self._resumer.resuming

    @property
    def rounds(self) -> dict[int, Round]:
        """UFO's ``Session.rounds``: round id -> :class:`Round`, for the rounds this run opened (a resumed
        session's earlier rounds are in its store: ``saucer show``, :mod:`saucer.context` queries)."""
        return self._rounds

    @property
    def lease(self) -> Lease | None:
        """This runner's lease on the session while it runs."""
        return self._held.lease

    @property
    def store(self) -> EventStore | None:
        """The session's store while it runs (a store given as a URL is closed when the run ends)."""
        return self._held.store

    @property
    def log_path(self) -> Path | None:
        """``logs/<task>/<session_id>/`` (None when logs are off)."""
        return self.logs.path

    # ================================================================= hooks

    def add_start_hook(self, hook: Callable[[Session], Any]) -> None:
        """Call ``hook(session)`` once the session has started (its start is committed)."""
        self._start_hooks.append(hook)

    def add_end_hook(self, hook: Callable[[Session, SessionResult], Any]) -> None:
        """Call ``hook(session, result)`` when the session ends, before ``on_session_end``."""
        self._end_hooks.append(hook)

    def add_closer(self, closer: Callable[[], Awaitable[Any]]) -> None:
        """Await ``closer()`` when the session closes, e.g. to close a model client's connections."""
        self._held.add_closer(closer)

    def add_observers(self, *observers: object) -> None:
        """Tell ``observers`` too (after the session's own observer) what happens in this session."""
        self._notify = ObserverCaller(CompositeObserver([self.observer, *observers]))

    async def notify(self, hook: str, *args: Any) -> None:
        """Call ``hook(*args)`` of the session's observers (a failing observer is logged once, never raised)."""
        await self._notify(hook, *args)

    # ============================================================== outcome

    async def evaluation(self, scope: Scope = "session", round_id: int | None = None) -> Evaluation:
        """UFO's ``Session.evaluation()``: the session's evaluator judges the session (or round
        ``round_id``) now. While the session runs the verdict is kept as ``system.eva_session``'s is
        (``evaluation.log``, its cost in ``SESSION_COST`` with the next commit, listed by the session's
        end); a session that has ended is judged on its final Context and nothing is recorded."""
        if self.result is not None or self.context is None:
            return await judge(self._outcome.resolve_evaluator(), self.context, scope, round_id)
        return await self._outcome.judge(scope, round_id)

    def cost_summary(self) -> CostSummary:
        """Steps, evaluation and experience cost so far."""
        return self._outcome.cost_summary()

    def experience_plan(self) -> Plan:
        """This session's successful commands as a plan follower mode can replay."""
        return self._outcome.experience_plan()

    def cursor(
        self,
        phase: str,
        round_id: int | None,
        plan_index: int | None,
        *,
        agent: str | None = None,
        state: str | None = None,
        evaluated: bool | None = None,
    ) -> CursorMeta:
        """The resume cursor a commit of this session carries: where it is (the ``agent`` and ``state``
        that act next) and its counters (``evaluated``: whether a round's end has its evaluation)."""
        return cursor_meta(phase, round_id, plan_index, agent, state, self.progress, self.limits, evaluated=evaluated)

    async def _ended(self, result: SessionResult) -> None:
        self.result = result
        for hook in self._end_hooks:
            hook(self, result)
        await self._notify.session_end(self, result)

    # =================================================================== run

    async def run(self) -> SessionResult:
        """Run (or continue) the session to its end; return its result. Never raises for agent errors."""
        if self.result is not None:
            return self.result
        clean = False
        try:
            await self._start()
            if self.result is None:
                await self._notify.session_start(self)
                if self._pending_round_eval is not None:
                    await self._outcome.evaluate("round", self._pending_round_eval)
                    self._pending_round_eval = None
                if self._round is not None:  # resumed in the middle of a round
                    await self._notify.round_start(self, self._round)
                evaluated = self._phase == "session_eval"
                if not evaluated:
                    await self._loop()
                await self._ended(await self._outcome.finish(evaluated))
            clean = True
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - reported in the result
            if self.context is None:
                raise  # it never started (unknown session, lease held by another runner...)
            await self._ended(await self._outcome.fail(exc))
            # After a store or lease failure the pending changes cannot be committed: drop them.
            clean = not isinstance(exc, (StoreError, LeaseLostError))
        finally:
            await self._held.close(self.context, self.logs, clean=clean)
        assert self.result is not None
        return self.result  # type: ignore[unreachable]  # mypy keeps the None of run()'s first check across _ended()

    def cancelled_by(self) -> tuple[str, str] | None:
        """``(who cancelled this run, what its end says)``, or None (:class:`~saucer.engine.cancel.CancelWatch`)."""
        return self._cancel.by(self.context)

    def is_finished(self) -> bool:
        """Finish flag, error, ``max_step`` or ``max_round`` reached."""
        p = self.progress
        return (
            self.work_done
            or p.error is not None
            or p.stopped is not None
            or self.limits.step_reached(self.session_step)
            or self.limits.round_reached(p.rounds)
        )

    async def _loop(self) -> None:
        while True:
            if self._round is None:
                if (cancelled := self.cancelled_by()) is not None:  # a person cancelled it: no other round starts
                    self.progress.stopped = cancelled[1]
                    return
                if self.is_finished():
                    if not self.work_done:
                        self._agenda.note_limits(self.limits, self.session_step)
                    return
                request = await self.next_request()
                if request is None:
                    self.work_done = True
                    return
                self._round = await self._acreate_new_round(request)
                await self._notify.round_start(self, self._round)
            rnd = self._round
            result = await rnd.run()
            await self._end_round(rnd, result)
            self._round = None
            if self._outcome.ends_session(rnd.id, result, stop_on_failure=self.stop_on_failure):
                return

    async def next_request(self) -> str | None:
        """The request of the next round, or None when there is no more work."""
        return await self._agenda.next_request()

    # ================================================================ rounds

    def create_new_round(self, request: str) -> Round:
        """Start the next round for ``request`` (commits its start)."""
        rnd, meta = self._open_round(request)
        self.context.commit_step(author="system", round=rnd.id, meta=dict(meta), summary=summary_of(meta))
        return self._round_opened(rnd)

    async def _acreate_new_round(self, request: str) -> Round:
        """:meth:`create_new_round`, committing with the pool's other sessions (``acommit``)."""
        rnd, meta = self._open_round(request)
        await self.context.acommit_step(author="system", round=rnd.id, meta=dict(meta), summary=summary_of(meta))
        return self._round_opened(rnd)

    def _open_round(self, request: str) -> tuple[Round, RoundStartMeta]:
        """The next round and the meta of its start; its Context changes are pending."""
        ctx = self.context
        round_id, plan_index, step = self._agenda.next_round()
        agents = self._agents_for(step)
        ctx.set(ContextNames.CURRENT_ROUND_ID, round_id)
        ctx.set(ContextNames.CURRENT_ROUND_COST, 0.0)  # every round that runs has a ledger entry, even a free one
        ctx.set(ContextNames.REQUEST, request)
        ctx.set(ContextNames.SUBTASK, "")
        rnd = Round(self, round_id, request, agents, plan_index=plan_index, plan_step=step)
        meta: RoundStartMeta = {
            "kind": "round_start",
            "request": request,
            "plan_index": plan_index,
            "session_status": SessionStatus.RUNNING,
            "cursor": self.cursor(
                "round_start", round_id, plan_index, agent=rnd.agent.name, state=rnd.agent.state.name()
            ),
        }
        return rnd, meta

    def _round_opened(self, rnd: Round) -> Round:
        """Count a round whose start is committed."""
        self._agenda.opened(rnd.id, rnd.plan_index)
        self._rounds[rnd.id] = rnd
        self._outcome.round_opened(rnd.request)
        return rnd

    def _agents_for(self, step: PlanStep | str | None) -> AgentSet:
        return self._agents.for_step(step, self, self._agenda.where(step))

    async def _end_round(self, rnd: Round, result: RoundResult) -> None:
        await self._outcome.round_ended(rnd.id, rnd.plan_index, result)
        await self._notify.round_end(self, rnd, result)
        if self.settings.system.eva_round:
            await self._outcome.evaluate("round", rnd.id, rnd.plan_index)

    # ====================================================== for the rounds (RoundHost)

    def lease_checker(self) -> Callable[[], None]:
        """What a round calls before each step, bound once to this run's lease keeper: it raises
        :class:`LeaseLostError` if this runner lost its lease, and renews it when due."""
        return self._held.lease_checker()

    def step_cursor(self, round_id: int, plan_index: int | None, agent: str, state: str) -> CursorMeta:
        """The resume cursor of a step's commit: the agent and state that act next."""
        return cursor_meta("step", round_id, plan_index, agent, state, self.progress, self.limits)

    def note_unknown_cost(self) -> None:
        """Some cost could not be priced: the session's total is unknown, never a number."""
        self.progress.unknown_cost = True

    def step_committed(
        self, rnd: Round, agent: Agent, record: StepRecord, *, subtask_end: bool = False, failed: bool = False
    ) -> Awaitable[None] | None:
        """A step of ``rnd`` is committed: count it, run the subtask hook, log it; return what tells the
        observer (to await), or None when it has no ``on_step``."""
        self.session_step = record.session_step
        if not failed:
            if subtask_end and self.subtask_end_hook is not None:
                self.subtask_end_hook(self, rnd, agent)
            self._outcome.step_done(record)
        if self.logs.path is not None:
            self.logs.write_step(record)
        if self._notify.has("on_step"):  # (no coroutine to make per step for an observer without the hook)
            return self._notify.step(self, record)
        return None

    # ================================================================ start

    async def _start(self) -> None:
        store = self._held.open_store()
        sid = self.session_id
        resumer = self._resumer
        # Every read and write of the store here runs in a thread: the loop's other sessions run meanwhile.
        if resumer.resuming:
            if not await asyncio.to_thread(store.exists, sid):  # (never parses the meta: it may hold a whole plan)
                raise SessionNotFoundError(sid)
            opened = None
            lease = await self._held.take_lease(self.owner, self._new_fence, self.lease_wait)
            # Where to continue, read under the lease and before anything is written
            # (a session with no failed step to retry is an error that changes nothing).
            start = await asyncio.to_thread(resumer.locate, store)
        else:
            meta = creation_meta(
                self.task, self.mode, self.request, self.platform, self.workspace, self.plan, self.plan_file
            )
            # The row and this runner's lease at once (one transaction on PostgreSQL), and its Context.
            lease, opened = await self._held.create_leased(self.owner, self._new_fence, dict(meta), self.participants)
            start = resumer.locate(store)  # a new session: nothing to read
        if start.never_started:  # this run is its start: the plan's variables, then context_vars
            self.context_vars = initial_vars(self.plan, self.context_vars)
        elif resumer.resuming and not start.over:
            _ = self.plan  # a stored plan that no longer parses is a PlanError here, before anything is written
        self.context = ctx = opened if opened is not None else await self._held.open_context(lease.token)
        self._cancel.opened(ctx)
        if start.over:
            self.result = self._outcome.stored_result(start.meta)
            return
        self.logs = open_session_logs(
            self.settings.logs, ctx, resuming=resumer.resuming, task=self.task, session_id=sid, store=store
        )
        ctx.attach_command_dispatcher(await self.open_dispatcher())
        tool_info = await self._held.dispatcher.tool_info(sid)
        if start.point is not None:
            self._continue_at(start)
        self.session_step = ctx.get(ContextNames.SESSION_STEP)
        if start.continued == "stopped":  # a fresh budget, counted from here
            self.limits = self.limits.from_here(self.session_step, self.progress.rounds)
        if self.logs.path is not None:
            ctx.set(ContextNames.LOG_PATH, str(self.logs.path))
        if tool_info:
            ctx.set(ContextNames.TOOL_INFO, tool_info)
        device_info = await self._held.dispatcher.device_info(sid)
        if device_info and device_info != ctx.get(ContextNames.DEVICE_INFO):
            ctx.set(ContextNames.DEVICE_INFO, device_info)
        if self.context_vars and not resumer.resuming:
            ctx.update_vars(set=self.context_vars)
        self.skipped = inapplicable(self.settings, tools=tool_info, logs_on=self.logs.path is not None)
        say_once(self.skipped)
        if ApplicationWatch.wanted(tool_info):
            self.application = ApplicationWatch()
        if not resumer.resuming:  # a new session: its id, mode and application in the Context
            ctx.set(ContextNames.ID, int(self.id))
            ctx.set(ContextNames.MODE, self.mode)
            plan = self.plan
            if plan is not None and plan.object:
                ctx.set(ContextNames.APPLICATION_ROOT_NAME, plan.object)
        here = self.cursor("start", None, None)
        first = resumer.first_meta(
            start, here, task=self.task, mode=self.mode, owner=self.owner, limits=self.limits, skipped=self.skipped
        )
        # Written with the round's start (one transaction), unless a resumed round goes on with a step.
        await ctx.acommit_step(author="system", meta=dict(first), summary=summary_of(first), defer=self._round is None)
        for hook in self._start_hooks:
            hook(self)
        assert self._held.keeper is not None
        self._held.keeper.start_renewing()

    def _continue_at(self, start: StartPoint) -> None:
        """Continue where the stored cursor says (see the module docs): counters, ids, the open round."""
        assert start.point is not None
        then = self._resumer.continuation(start.point, self.limits, eva_round=self.settings.system.eva_round)
        self.progress, self.limits, self._phase = then.progress, then.limits, then.phase
        self._agenda.continue_at(then.next_round_id, then.next_plan_index)
        self._pending_round_eval = then.pending_round_eval
        if then.reopen is not None:
            round_id, plan_index, agent, state = then.reopen
            step = self._agenda.step_at(plan_index)
            request = self.context.get(ContextNames.REQUEST)
            self._round = self._rounds[round_id] = Round(
                self,
                round_id,
                request,
                self._agents_for(step),
                plan_index=plan_index,
                plan_step=step,
                start_agent=agent,
                start_state=state,
            )
            self._round.agent.round_result = start.meta.get("round_result")  # (ended by its last step)

    def _new_fence(self, token: int) -> None:
        self.context.fence = token

    # ============================================================ dispatcher

    async def open_dispatcher(self) -> Any:
        """The session's dispatcher, made from its factory (and entered) on the first call.

        A dispatcher the session made is closed when the session ends, or by
        :meth:`discard` if it never runs.
        """
        return await self._held.dispatcher.open(self)

    async def tools(self) -> dict[str, Any]:
        """The tools the session's dispatcher offers, keyed ``server.tool`` ({} when it cannot list them)."""
        await self.open_dispatcher()
        return await self._held.dispatcher.tool_info(self.session_id)

    async def discard(self) -> None:
        """Close what a session that will not run has opened (its dispatcher)."""
        await self._held.dispatcher.close(self.session_id)

    def __repr__(self) -> str:
        return f"<Session {self.session_id!r} task={self.task!r} mode={self.mode}>"
