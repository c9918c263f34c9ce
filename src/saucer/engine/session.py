"""A session: rounds of requests over one durable Context, run under a lease, resumable.

::

    session = Session("tidy notes", mode="follower", plan=load_plan("plan.json"),
                      store="sqlite:///.saucer/saucer.db", dispatcher=my_dispatcher)
    result = await session.run()            # SessionResult
    ...
    result = await Session.resume(session.session_id, store=url, dispatcher=d).run()

Where rounds come from: with a plan, round *i* runs plan step *i* (a command
step through the follower agent, offline; a text step through the LLM agents);
otherwise rounds come from requests (``request=``, then the interactor's
``first_request``/``new_request`` in normal mode).

Durability and resume. Every commit the engine makes (session start, round
start, each step, round end, evaluations, session end) carries a *cursor* in
its event ``meta``: the round, the plan step, and the agent and state that act
next. :meth:`Session.resume` reads the newest cursor and continues right after
the last committed step, so **a committed step is never executed again**. A
step that was running when the process died had not committed: it runs again
on resume (at-least-once for the one in-flight step; make tools idempotent or
check the Context if that matters). With durability ``exit`` nothing is
committed before the session ends, so a crashed ``exit`` session resumes from
its start. Agents' Python attributes are not restored; durable agent data
belongs in the Context.

Leases. A run takes the store's lease on the session (owner
``host:pid:uuid``, ``store.lease_ttl`` seconds), renews it from a background
task and at step boundaries, and fences every commit with the lease token, so
a second runner gets :class:`~saucer.store.LeaseHeldError` naming the holder,
and a runner whose lease was taken over cannot commit any more.

This module is the session's lifecycle (start, the loop of rounds, the end);
its other concerns have their own modules: the resume cursor
(:mod:`~saucer.engine.cursor`), the lease (:mod:`~saucer.engine.lease`), the
dispatcher (:mod:`~saucer.engine.dispatching`), the experience plan and
``output.md`` (:mod:`~saucer.engine.experience`), the result
(:mod:`~saucer.engine.result`). A :class:`~saucer.engine.round.Round` sees the
session through :class:`~saucer.engine.round.RoundHost`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from saucer.config import Settings, load_settings
from saucer.context import Context, ContextNames
from saucer.engine.accounting import Limits
from saucer.engine.agent import Agent, AgentSet, as_agent_set
from saucer.engine.application import ApplicationWatch
from saucer.engine.cancel import CANCEL_VAR, cancel_reason
from saucer.engine.components import new_follower
from saucer.engine.cursor import Progress
from saucer.engine.defaults import inapplicable, say_once
from saucer.engine.dispatching import DispatcherHolder
from saucer.engine.errors import EngineError, LeaseLostError, LLMUnavailableError
from saucer.engine.evaluation import Evaluation
from saucer.engine.interactor import ask, request_of
from saucer.engine.lease import LeaseKeeper, lease_owner
from saucer.engine.logs import SessionLogs, StepRecord, slug
from saucer.engine.observer import CompositeObserver, ObserverCaller
from saucer.engine.outcome import SessionOutcome
from saucer.engine.plan import Plan, PlanStep, declared_participants, initial_vars, parse_plan
from saucer.engine.result import SessionResult, SessionStatus
from saucer.engine.resume import ResumableSession
from saucer.engine.round import Round, RoundResult, RoundStatus
from saucer.engine.uitree import replayable
from saucer.store import EventStore, SessionNotFoundError, StoreError, open_store
from saucer.store.base import Lease

__all__ = ["Session", "SessionResult", "SessionStatus", "new_session_id", "lease_owner"]

_log = logging.getLogger("saucer.engine")


def new_session_id(task: str) -> str:
    """``<task>-<YYYYmmdd-HHMMSS>-<10 hex>``: readable, sortable, unique (40 random bits:
    a million sessions started in the same second collide with odds of about 1 in 2 million)."""
    return f"{slug(task, 40)}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:10]}"


class Session(ResumableSession, SessionOutcome):
    """One conversation: rounds of steps over a durable Context. See the module docs."""

    def __init__(
        self,
        task: str,
        *,
        mode: str = "normal",
        settings: Settings | None = None,
        store: EventStore | str | None = None,
        session_id: str | None = None,
        request: str = "",
        plan: Plan | Mapping[str, Any] | None = None,
        plan_file: str | None = None,
        agents: Any = None,
        graph: Any = None,
        dispatcher: Any = None,
        dispatcher_factory: Callable[[Session], Any] | None = None,
        interactor: Any = None,
        observer: Any = None,
        evaluator: Any = None,
        experience_saver: Callable[..., Any] | None = None,
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
        self.plan = parse_plan(plan, plan_file or "plan") if plan is not None else None
        self.plan_file = plan_file
        #: Context variables a new session starts with (the plan's ``vars``, then ``context_vars``).
        self.context_vars = initial_vars(self.plan, context_vars)
        #: Who may write to it besides its runner (None: everyone), declared when it is created:
        #: the plan's ``participants`` and ``participants``, and ``user`` (who submitted it) with them.
        self.participants = declared_participants(self.plan, participants, user)
        self.platform = platform
        #: The directory the built-in tools act in; stored so a resumed session uses the same one.
        self.workspace: str | None = str(Path(workspace).resolve()) if workspace else None
        self.id = id
        self.interactor = interactor
        self.observer = observer
        self.evaluator = evaluator
        self.experience_saver = experience_saver
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
        #: The cancel variable when this run opened the session (a fork copies its parent's): not a cancel of this run.
        self.cancel_before: Any = None
        self.store: EventStore | None = None
        self.context: Context = None  # type: ignore[assignment]  # set by run()
        self.logs: SessionLogs = SessionLogs.disabled()
        self.result: SessionResult | None = None
        self._agents_spec = agents
        self._graph = graph
        self._dispatcher = DispatcherHolder(dispatcher, dispatcher_factory)
        self._store_spec = store if store is not None else self.settings.store.url
        self._owns_store = False
        self._lease: LeaseKeeper | None = None
        self._notify = ObserverCaller(observer)
        self._resuming = False
        self._retry_failed = False
        self._start_hooks: list[Callable[..., Any]] = []
        self._end_hooks: list[Callable[..., Any]] = []
        self._closers: list[Callable[[], Awaitable[Any]]] = []
        self._next_round_id = 0
        self._next_plan_index = 0
        self._round: Round | None = None
        self._rounds: dict[int, Round] = {}
        self._pending_round_eval: int | None = None
        self._finish_flag = False
        self._evaluations: list[Evaluation] = []
        #: (request, successful commands) per round of this run; experience source when nothing is committed per step.
        self._run_rounds: list[tuple[str, list[dict[str, Any]]]] = []
        self._follower_set: AgentSet | None = None
        self._request_set: AgentSet | None = None
        self._phase = "new"

    @property
    def resumed(self) -> bool:
        """True for a session made by :meth:`resume` (it continues a stored session)."""
        return self._resuming

    @property
    def rounds(self) -> dict[int, Round]:
        """UFO's ``Session.rounds``: round id -> :class:`Round`, for the rounds this run opened (a resumed
        session's earlier rounds are in its store: ``saucer show``, :mod:`saucer.context` queries)."""
        return self._rounds

    @property
    def lease(self) -> Lease | None:
        """This runner's lease on the session while it runs."""
        return self._lease.lease if self._lease is not None else None

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
        self._closers.append(closer)

    def add_observers(self, *observers: Any) -> None:
        """Tell ``observers`` too (after the session's own observer) what happens in this session."""
        self._notify = ObserverCaller(CompositeObserver([self.observer, *observers]))

    async def notify(self, hook: str, *args: Any) -> None:
        """Call ``hook(*args)`` of the session's observers (a failing observer is logged once, never raised)."""
        await self._notify(hook, *args)

    # =================================================================== run

    async def run(self) -> SessionResult:
        """Run (or continue) the session to its end; return its result. Never raises for agent errors."""
        if self.result is not None:
            return self.result
        clean = False
        try:
            await self._start()
            if self.result is None:
                await self._notify("on_session_start", self)
                if self._pending_round_eval is not None:
                    await self._evaluate("round", self._pending_round_eval)
                    self._pending_round_eval = None
                if self._round is not None:  # resumed in the middle of a round
                    await self._notify("on_round_start", self, self._round)
                if self._phase != "session_eval":
                    await self._loop()
                await self._finish()
            clean = True
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - reported in the result
            if self.context is None:
                raise  # it never started (unknown session, lease held by another runner...)
            await self._fail(exc)
            # After a store or lease failure the pending changes cannot be committed: drop them.
            clean = not isinstance(exc, (StoreError, LeaseLostError))
        finally:
            await self._close(clean)
        assert self.result is not None
        return self.result

    def is_finished(self) -> bool:
        """Finish flag, error, ``max_step`` or ``max_round`` reached."""
        p = self.progress
        return (
            self._finish_flag
            or p.error is not None
            or p.stopped is not None
            or self.limits.step_reached(self.session_step)
            or self.limits.round_reached(p.rounds)
        )

    async def _loop(self) -> None:
        p = self.progress
        while True:
            if self._round is None:
                cancelled = self.cancelled()
                if cancelled is not None:  # a person cancelled it: no other round starts
                    p.stopped = cancelled
                    return
                if self.is_finished():
                    self._note_limits()
                    return
                request = await self.next_request()
                if request is None:
                    self._finish_flag = True
                    return
                self._round = await self._acreate_new_round(request)
                await self._notify("on_round_start", self, self._round)
            rnd = self._round
            result = await rnd.run()
            await self._end_round(rnd, result)
            self._round = None
            if result.status == RoundStatus.ERROR:
                p.error = result.error or result.reason
                p.reason = result.reason
                return
            if result.status == RoundStatus.STOPPED:
                p.stopped = result.reason
                return
            if result.status == RoundStatus.FAILED and self.stop_on_failure:
                p.reason = f"round {rnd.id} failed: {result.reason}"
                return

    def _note_limits(self) -> None:
        """A limit ended the loop: ``stopped`` when work was left, else just the reason."""
        p = self.progress
        if self._finish_flag or p.error or p.stopped:
            return
        if self.limits.round_reached(p.rounds):
            limit = f"max_round ({self.limits.max_round}) reached"
        elif self.limits.step_reached(self.session_step):
            limit = f"max_step ({self.limits.max_step}) reached"
        else:
            return
        if self._work_left():
            p.stopped = limit
        else:
            p.reason = limit

    def _work_left(self) -> bool:
        """Whether another round would have run without the limit."""
        if self.plan is not None and self.plan.steps:
            return self._next_plan_index < len(self.plan.steps)
        if self.progress.requests == 0:
            return True
        # A request-driven session goes on while its user can give more requests.
        return self.ask_new_requests and bool(getattr(self.interactor, "interactive", True))

    async def next_request(self) -> str | None:
        """The request of the next round, or None when there is no more work."""
        plan = self.plan
        if plan is not None and plan.steps:
            index = self._next_plan_index
            if index >= len(plan.steps):
                return None
            return plan.step_text(index)
        if self.progress.requests == 0:
            request = self.request or (plan.task if plan is not None else "")
            if not request:
                if self.mode != "normal":
                    raise EngineError(
                        f"session {self.session_id!r} ({self.mode} mode) has no request and no plan steps"
                    )
                request = await ask(self.interactor, "first_request") or ""
                if not request:
                    raise EngineError("no request was given (pass a request, or run with a terminal to type one)")
        elif self.ask_new_requests:
            request = request_of(await ask(self.interactor, "new_request"))
            if request is None:
                return None
        else:
            return None
        self.progress.requests += 1
        return str(request)

    # ================================================================ rounds

    def create_new_round(self, request: str) -> Round:
        """Start the next round for ``request`` (commits its start)."""
        rnd, meta = self._open_round(request)
        self.context.commit_step(author="system", round=rnd.id, meta=meta)
        return self._round_opened(rnd)

    async def _acreate_new_round(self, request: str) -> Round:
        """:meth:`create_new_round`, committing with the pool's other sessions (``acommit``)."""
        rnd, meta = self._open_round(request)
        await self.context.acommit_step(author="system", round=rnd.id, meta=meta)
        return self._round_opened(rnd)

    def _open_round(self, request: str) -> tuple[Round, dict[str, Any]]:
        """The next round and the meta of its start; its Context changes are pending."""
        ctx = self.context
        round_id = self._next_round_id
        plan_index: int | None = None
        step: PlanStep | str | None = None
        if self.plan is not None and self.plan.steps:
            plan_index = self._next_plan_index
            step = self.plan.steps[plan_index]
        agents = self._agents_for(step)
        ctx.set(ContextNames.CURRENT_ROUND_ID, round_id)
        ctx.set(ContextNames.CURRENT_ROUND_COST, 0.0)  # every round that runs has a ledger entry, even a free one
        ctx.set(ContextNames.REQUEST, request)
        ctx.set(ContextNames.SUBTASK, "")
        rnd = Round(self, round_id, request, agents, plan_index=plan_index, plan_step=step)
        meta = {
            "kind": "round_start",
            "request": request,
            "plan_index": plan_index,
            "session_status": SessionStatus.RUNNING,
            "cursor": self._cursor("round_start", round_id, plan_index, rnd.agent.name, rnd.agent.state.name()),
        }
        return rnd, meta

    def _round_opened(self, rnd: Round) -> Round:
        """Count a round whose start is committed."""
        self._next_round_id = rnd.id + 1
        self._rounds[rnd.id] = rnd
        if rnd.plan_index is not None:
            self._next_plan_index = rnd.plan_index + 1
        if self.context.durability == "exit":
            self._run_rounds.append((rnd.request, []))
        return rnd

    def _agents_for(self, step: PlanStep | str | None) -> AgentSet:
        if isinstance(step, PlanStep):
            if self._follower_set is None:
                self._follower_set = AgentSet([new_follower(self.settings)])
            return self._follower_set
        if self._request_set is None:
            spec = self._agents_spec
            if spec is None:
                where = f"plan step {self._next_plan_index} ({step!r:.60})" if isinstance(step, str) else "this request"
                raise LLMUnavailableError(
                    f"{where} needs an LLM agent, and none is available to session {self.session_id!r}; "
                    "configure one ([llm] base_url, model, api_key) or use command steps"
                )
            if callable(spec) and not isinstance(spec, (Agent, AgentSet)):
                spec = spec(self)
            agent_set = as_agent_set(spec)
            if self._graph is not None:
                agent_set = AgentSet(list(agent_set.agents), agent_set.initial, self._graph, agent_set.evaluator)
            self._request_set = agent_set
        return self._request_set

    async def _end_round(self, rnd: Round, result: RoundResult) -> None:
        p = self.progress
        self.context.set(ContextNames.ROUND_RESULT, result.reason or result.status)
        p.rounds += 1
        if not result.ok:
            p.failed += 1
            if not p.reason:
                # The first round that did not finish says why the session did not (e.g. no_action).
                p.reason = f"round {rnd.id} {result.status}: {result.reason}" if result.reason else ""
        evaluate = self.settings.system.eva_round
        await self.context.acommit_step(
            author="system",
            round=rnd.id,
            meta={
                "kind": "round_end",
                "round_status": result.status,
                "reason": result.reason,
                "error": result.error,
                "steps": result.steps,
                "cost": result.cost,
                "session_status": SessionStatus.RUNNING,
                "cursor": self._cursor("round_end", rnd.id, rnd.plan_index, evaluated=not evaluate),
            },
        )
        await self._notify("on_round_end", self, rnd, result)
        if evaluate:
            await self._evaluate("round", rnd.id, rnd.plan_index)

    # ====================================================== for the rounds (RoundHost)

    def check_lease(self) -> None:
        """Before each step: :class:`LeaseLostError` if this runner lost its lease; renew it when due."""
        if self._lease is not None:
            self._lease.check()

    def cancelled(self) -> str | None:
        """Before each step and round: why the session must stop (``cancelled by ...``: a person's cancel,
        taken in with the out-of-turn writes its commits are ordered after), or None."""
        return cancel_reason(self.context, self.cancel_before) if self.context is not None else None

    def step_cursor(self, round_id: int, plan_index: int | None, agent: str, state: str) -> dict[str, Any]:
        """The resume cursor of a step's commit: the agent and state that act next."""
        return self._cursor("step", round_id, plan_index, agent, state)

    def note_unknown_cost(self) -> None:
        """Some cost could not be priced: the session's total is unknown, never a number."""
        self.progress.unknown_cost = True

    async def step_committed(
        self, rnd: Round, agent: Agent, record: StepRecord, *, subtask_end: bool = False, failed: bool = False
    ) -> None:
        """A step of ``rnd`` is committed: count it, run the subtask hook, log it, tell the observer."""
        self.session_step = record.session_step
        if not failed:
            if subtask_end and self.subtask_end_hook is not None:
                self.subtask_end_hook(self, rnd, agent)
            if self._run_rounds and record.commands:
                done = self._run_rounds[-1][1]
                for i, command in enumerate(record.commands):
                    if i < len(record.results) and record.results[i].get("status") == "success":
                        done.append(replayable(command, record.results[i]))
        self.logs.write_step(record)
        await self._notify("on_step", self, record)

    # ================================================================ start

    async def _start(self) -> None:
        self.store = store = self._open_store()
        sid = self.session_id
        if self._resuming:
            if not store.exists(sid):  # (never parses the stored meta, which may hold a whole plan)
                raise SessionNotFoundError(sid)
        else:
            store.create_session(sid, meta=self._creation_meta(), participants=self.participants)
        self._lease = LeaseKeeper(store, sid, self.owner, self.settings.store.lease_ttl, self._new_fence)
        lease = await self._lease.acquire(self.lease_wait)
        # Where to continue, read under the lease and before anything is written
        # (a session with no failed step to retry is an error that changes nothing).
        point, point_meta, continued, ended = self._resume_point(store)
        if self._resuming and not (ended is not None and continued is None):
            self.plan  # a stored plan that no longer parses is a PlanError here, before anything is written
        self.context = ctx = Context.open(
            store,
            sid,
            author="system",
            durability=self.settings.store.durability,
            snapshot_every=self.settings.store.snapshot_every,
            create=False,
            fence=lease.token,
            serialise=True,  # out-of-turn writes never fail a step: it is ordered after them
        )
        if ended is not None and continued is None:
            self.result = self._stored_result(point_meta)
            return
        self.cancel_before = ctx.get_var(CANCEL_VAR)
        self._open_logs(ctx)
        ctx.attach_command_dispatcher(await self.open_dispatcher())
        tool_info = await self._dispatcher.tool_info(sid)
        if point is not None:
            self._apply_cursor(point)
        self.session_step = ctx.get(ContextNames.SESSION_STEP)
        if continued == "stopped":  # a fresh budget, counted from here
            self.limits = self.limits.from_here(self.session_step, self.progress.rounds)
        if self.logs.path is not None:
            ctx.set(ContextNames.LOG_PATH, str(self.logs.path))
        if tool_info:
            ctx.set(ContextNames.TOOL_INFO, tool_info)
        device_info = await self._dispatcher.device_info(sid)
        if device_info and device_info != ctx.get(ContextNames.DEVICE_INFO):
            ctx.set(ContextNames.DEVICE_INFO, device_info)
        if self.context_vars and not self._resuming:
            ctx.update_vars(set=self.context_vars)
        self.skipped = inapplicable(self.settings, tools=tool_info, logs_on=self.logs.path is not None)
        say_once(self.skipped)
        if ApplicationWatch.wanted(tool_info):
            self.application = ApplicationWatch()
        await ctx.acommit_step(author="system", meta=self._start_meta(point, continued))
        for hook in self._start_hooks:
            hook(self)
        self._lease.start_renewing()

    def _open_store(self) -> EventStore:
        spec = self._store_spec
        if isinstance(spec, str):
            self._owns_store = True
            return open_store(spec, encrypt=self.settings.store.encrypt, key_file=self.settings.store.key_file)
        return spec

    def _new_fence(self, token: int) -> None:
        self.context.fence = token

    # ============================================================ dispatcher

    async def open_dispatcher(self) -> Any:
        """The session's dispatcher, made from its factory (and entered) on the first call.

        A dispatcher the session made is closed when the session ends, or by
        :meth:`discard` if it never runs.
        """
        return await self._dispatcher.open(self)

    async def tools(self) -> dict[str, Any]:
        """The tools the session's dispatcher offers, keyed ``server.tool`` ({} when it cannot list them)."""
        await self.open_dispatcher()
        return await self._dispatcher.tool_info(self.session_id)

    async def discard(self) -> None:
        """Close what a session that will not run has opened (its dispatcher)."""
        await self._dispatcher.close(self.session_id)

    # ================================================================ close

    async def _close(self, clean: bool) -> None:
        if self._lease is not None:
            self._lease.stop()
        await self._dispatcher.close(self.session_id)
        for closer in self._closers:
            try:
                await closer()
            except Exception as exc:  # noqa: BLE001
                _log.warning("session %s: a close callback failed: %s", self.session_id, exc)
        self._closers.clear()
        ctx = self.context
        if ctx is not None:
            try:
                if clean:
                    ctx.close()
                else:
                    ctx.abort()  # discard the unfinished step
            except Exception as exc:  # noqa: BLE001
                _log.warning("session %s: closing the context failed: %s", self.session_id, exc)
        if self._lease is not None:
            self._lease.release()
        self.logs.close()
        if self._owns_store and self.store is not None:
            self.store.close()
            self.store = None  # the plan property opens the store's URL again if it still has to read

    def __repr__(self) -> str:
        return f"<Session {self.session_id!r} task={self.task!r} mode={self.mode}>"
