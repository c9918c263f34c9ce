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
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import re
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping

import orjson

from saucer.config import Settings, load_settings
from saucer.context import Context, ContextNames
from saucer.engine.accounting import CostSummary, Limits
from saucer.engine.cursor import continue_cursor, last_cursor, retry_cursor
from saucer.engine.agent import Agent, AgentSet, as_agent_set
from saucer.engine.errors import (
    EngineError,
    LeaseLostError,
    LLMUnavailableError,
)
from saucer.engine.evaluation import Evaluation
from saucer.engine.interactor import ask
from saucer.engine.logs import (
    EXPERIENCE_FILE,
    EvaluationLogEntry,
    SessionLogs,
    StepRecord,
    TEXT_LOG,
    REQUEST_LOG,
    EVALUATION_LOG,
    read_step_log,
    render_markdown,
    slug,
)
from saucer.engine.observer import ObserverCaller
from saucer.engine.plan import Plan, PlanStep, parse_plan, plan_from_rounds
from saucer.engine.round import Round, RoundResult, RoundStatus
from saucer.store import EventStore, LeaseHeldError, StoreError, open_store
from saucer.store.base import Lease, SessionInfo

__all__ = ["Session", "SessionResult", "SessionStatus", "new_session_id", "lease_owner"]

_log = logging.getLogger("saucer.engine")


class SessionStatus:
    """How a session ended (``session_status`` in the last event's meta)."""

    RUNNING = "running"
    FINISHED = "finished"  # every round finished and no work is left
    FAILED = "failed"  # a round failed (an agent gave up, a command failed in follower mode)
    ERROR = "error"  # an exception: a crashed step, a bad graph, a missing LLM agent...
    STOPPED = "stopped"  # a limit (max_step, max_round) cut it short with work left; resume continues it
    INTERRUPTED = "interrupted"  # never stored: derived when read, for a session whose runner vanished
    SKIPPED = "skipped"  # never stored: a pool did not run it, another runner had claimed it


@dataclass
class SessionResult:
    """What :meth:`Session.run` returns."""

    session_id: str
    task: str
    mode: str
    status: str
    reason: str = ""
    error: str | None = None
    rounds: int = 0
    steps: int = 0
    cost: CostSummary = field(default_factory=CostSummary)
    log_path: str | None = None
    experience_path: str | None = None
    evaluations: list[Evaluation] = field(default_factory=list)
    version: int = 0

    @property
    def ok(self) -> bool:
        return self.status == SessionStatus.FINISHED

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "task": self.task,
            "mode": self.mode,
            "status": self.status,
            "reason": self.reason,
            "error": self.error,
            "rounds": self.rounds,
            "steps": self.steps,
            "cost": self.cost.to_dict(),
            "log_path": self.log_path,
            "experience_path": self.experience_path,
            "evaluations": [e.model_dump(mode="json") for e in self.evaluations],
            "version": self.version,
        }


def new_session_id(task: str) -> str:
    """``<task>-<YYYYmmdd-HHMMSS>-<10 hex>``: readable, sortable, unique (40 random bits:
    a million sessions started in the same second collide with odds of about 1 in 2 million)."""
    return f"{slug(task, 40)}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:10]}"


def lease_owner() -> str:
    """``host:pid:uuid`` naming this runner in lease errors."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _jsonable(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if dump is not None:
        return dump(mode="json")
    return orjson.loads(orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS))


def _fork_origin(info: SessionInfo) -> tuple[str | None, int | None]:
    """The session a fork branched from and where: its parent, or (once it stands alone) its meta."""
    if info.parent_id is not None:
        return info.parent_id, info.parent_version
    at = info.meta.get("at")
    return info.meta.get("forked_from"), at if isinstance(at, int) else None


def _session_meta(store: EventStore, session_id: str) -> dict[str, Any]:
    """The creation meta of a session, looking through forks to the original.

    A fork's own first event may give it its own workspace (``saucer fork --workspace``).
    """
    info = store.session_info(session_id)
    workspace = None
    origin, at = _fork_origin(info)
    if origin is not None and at is not None:
        first = next(iter(store.read(session_id, at, at + 1)), None)
        workspace = first.meta.get("workspace") if first is not None else None
    seen = 0
    while "mode" not in info.meta and origin is not None and store.exists(origin) and seen < 100:
        info = store.session_info(origin)
        origin, _ = _fork_origin(info)
        seen += 1
    meta = dict(info.meta)
    if workspace:
        meta["workspace"] = workspace
    return meta


class Session:
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
        dispatcher_factory: Callable[["Session"], Any] | None = None,
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
    ) -> None:
        if not isinstance(task, str) or not task.strip():
            raise ValueError("a session needs a task name")
        self.task = task
        self.mode = mode
        self.settings = settings if settings is not None else load_settings()
        self.session_id = session_id or new_session_id(task)
        self.request = request or ""
        self.plan: Plan | None = parse_plan(plan, plan_file or "plan") if plan is not None else None
        self.plan_file = plan_file
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
        #: Called as ``hook(session, round, agent)`` after a step that ends a subtask.
        self.subtask_end_hook: Callable[..., Any] | None = None
        self._agents_spec = agents
        self._graph = graph
        self._dispatcher = dispatcher
        self._dispatcher_factory = dispatcher_factory
        self._owns_dispatcher = False
        self._entered_dispatcher: Any = None
        self._dispatcher_opened = False
        self._store_spec = store if store is not None else self.settings.store.url
        self.store: EventStore | None = None
        self._owns_store = False
        self.context: Context = None  # type: ignore[assignment]  # set by run()
        self.logs: SessionLogs = SessionLogs.disabled()
        self.owner = lease_owner()
        self.lease: Lease | None = None
        self._lease_renewed = 0.0
        self._lease_lost: BaseException | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._notify = ObserverCaller(observer)
        self._resuming = False
        self._retry_failed = False
        self._start_hooks: list[Callable[..., Any]] = []
        self._end_hooks: list[Callable[..., Any]] = []
        self._closers: list[Callable[[], Awaitable[Any]]] = []
        # progress
        self.session_step = 0
        self._rounds_done = 0
        self._failed_rounds = 0
        self._requests_taken = 0
        self._next_round_id = 0
        self._next_plan_index = 0
        self._round: Round | None = None
        self._pending_round_eval: int | None = None
        self._finish_flag = False
        self._error: str | None = None
        self._stopped: str | None = None
        self._reason = ""
        self._eval_cost = 0.0
        self._exp_cost = 0.0
        self._unknown_cost = False
        self._evaluations: list[Evaluation] = []
        #: (request, successful commands) per round of this run; experience source when nothing is committed per step.
        self._run_rounds: list[tuple[str, list[dict[str, Any]]]] = []
        self._follower_set: AgentSet | None = None
        self._request_set: AgentSet | None = None
        self._phase = "new"
        self.result: SessionResult | None = None

    @property
    def resumed(self) -> bool:
        """True for a session made by :meth:`resume` (it continues a stored session)."""
        return self._resuming

    # ================================================================= hooks

    def add_start_hook(self, hook: Callable[["Session"], Any]) -> None:
        """Call ``hook(session)`` once the session has started (its start is committed)."""
        self._start_hooks.append(hook)

    def add_end_hook(self, hook: Callable[["Session", "SessionResult"], Any]) -> None:
        """Call ``hook(session, result)`` when the session ends, before ``on_session_end``."""
        self._end_hooks.append(hook)

    def add_closer(self, closer: Callable[[], Awaitable[Any]]) -> None:
        """Await ``closer()`` when the session closes, e.g. to close a model client's connections."""
        self._closers.append(closer)

    # ================================================================ resume

    @classmethod
    def resume(
        cls,
        session_id: str,
        *,
        store: EventStore | str | None = None,
        settings: Settings | None = None,
        retry_failed: bool = False,
        **kwargs: Any,
    ) -> "Session":
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
        probe = open_store(spec) if isinstance(spec, str) else spec
        try:
            meta = _session_meta(probe, session_id)
        finally:
            if isinstance(spec, str):
                probe.close()
        plan = meta.get("plan")
        kwargs.setdefault("platform", meta.get("platform") or "linux")
        if meta.get("workspace"):
            kwargs.setdefault("workspace", meta["workspace"])
        for fixed in ("task", "mode", "request", "plan", "plan_file", "session_id"):
            if fixed in kwargs:
                raise TypeError(f"Session.resume takes {fixed} from the stored session, not as an argument")
        session = cls(
            meta.get("task") or session_id,
            mode=meta.get("mode") or "normal",
            settings=settings,
            store=spec,
            session_id=session_id,
            request=meta.get("request") or "",
            plan=plan,
            plan_file=meta.get("plan_file"),
            **kwargs,
        )
        session._resuming = True
        session._retry_failed = retry_failed
        return session

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
                if self._phase not in ("session_eval",):
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
        return (
            self._finish_flag
            or self._error is not None
            or self._stopped is not None
            or self.limits.step_reached(self.session_step)
            or self.limits.round_reached(self._rounds_done)
        )

    async def _loop(self) -> None:
        while True:
            if self._round is None:
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
                self._error = result.error or result.reason
                self._reason = result.reason
                return
            if result.status == RoundStatus.STOPPED:
                self._stopped = result.reason
                return
            if result.status == RoundStatus.FAILED and self.stop_on_failure:
                self._reason = f"round {rnd.id} failed: {result.reason}"
                return

    def _note_limits(self) -> None:
        """A limit ended the loop: ``stopped`` when work was left, else just the reason."""
        if self._finish_flag or self._error or self._stopped:
            return
        if self.limits.round_reached(self._rounds_done):
            limit = f"max_round ({self.limits.max_round}) reached"
        elif self.limits.step_reached(self.session_step):
            limit = f"max_step ({self.limits.max_step}) reached"
        else:
            return
        if self._work_left():
            self._stopped = limit
        else:
            self._reason = limit

    def _work_left(self) -> bool:
        """Whether another round would have run without the limit."""
        if self.plan is not None and self.plan.steps:
            return self._next_plan_index < len(self.plan.steps)
        if self._requests_taken == 0:
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
        if self._requests_taken == 0:
            request = self.request or (plan.task if plan is not None else "")
            if not request:
                if self.mode != "normal":
                    raise EngineError(f"session {self.session_id!r} ({self.mode} mode) has no request and no plan steps")
                request = await ask(self.interactor, "first_request") or ""
                if not request:
                    raise EngineError("no request was given (pass a request, or run with a terminal to type one)")
        elif self.ask_new_requests:
            request = await ask(self.interactor, "new_request")
            if not request or (isinstance(request, str) and request.strip().upper() == "N"):
                return None
        else:
            return None
        self._requests_taken += 1
        return str(request)

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
        if rnd.plan_index is not None:
            self._next_plan_index = rnd.plan_index + 1
        if self.context.durability == "exit":
            self._run_rounds.append((rnd.request, []))
        return rnd

    def _agents_for(self, step: PlanStep | str | None) -> AgentSet:
        if isinstance(step, PlanStep):
            if self._follower_set is None:
                from saucer.agents.follower import FollowerAgent

                self._follower_set = AgentSet([FollowerAgent()])
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

    # ================================================================ start

    async def _start(self) -> None:
        settings = self.settings
        spec = self._store_spec
        if isinstance(spec, str):
            self.store = open_store(spec)
            self._owns_store = True
        else:
            self.store = spec
        store = self.store
        sid = self.session_id
        if self._resuming:
            store.session_info(sid)  # SessionNotFoundError for an unknown id
        else:
            store.create_session(sid, meta=self._creation_meta())
        self.lease = await self._acquire_lease()
        self._lease_renewed = time.monotonic()
        # Where to continue, read under the lease and before anything is written
        # (a session with no failed step to retry is an error that changes nothing).
        cursor, cursor_meta = last_cursor(store, sid) if self._resuming else (None, {})
        continued = None
        ended = cursor_meta.get("session_status") if cursor is not None and cursor.get("phase") == "end" else None
        if ended == SessionStatus.STOPPED:
            continued = "stopped"
            cursor, _ = continue_cursor(store, sid)
        elif ended in (SessionStatus.FAILED, SessionStatus.ERROR) and self._retry_failed:
            continued = "retry_failed"
            cursor, _ = retry_cursor(store, sid)
        self.context = ctx = Context.open(
            store,
            sid,
            author="system",
            durability=settings.store.durability,
            snapshot_every=settings.store.snapshot_every,
            create=False,
            fence=self.lease.token,
        )
        if ended is not None and continued is None:
            self.result = self._stored_result(cursor_meta)
            return
        self._open_logs(ctx)
        await self._attach_dispatcher(ctx)
        tool_info = await self._tool_info()
        if cursor is not None:
            self._apply_cursor(cursor)
        self.session_step = ctx.get(ContextNames.SESSION_STEP)
        if continued == "stopped":  # a fresh budget, counted from here
            self.limits = self.limits.from_here(self.session_step, self._rounds_done)
        if self.logs.path is not None:
            ctx.set(ContextNames.LOG_PATH, str(self.logs.path))
        if tool_info:
            ctx.set(ContextNames.TOOL_INFO, tool_info)
        if self._resuming:
            resumed_at = dict(cursor) if cursor is not None else self._cursor("start", None, None)
            resumed_at.update(self._limit_bases())
            meta = {
                "kind": "session_resume",
                "owner": self.owner,
                "session_status": SessionStatus.RUNNING,
                "cursor": resumed_at,
            }
            if continued is not None:
                meta["continues"] = continued
        else:
            ctx.set(ContextNames.ID, int(self.id))
            ctx.set(ContextNames.MODE, self.mode)
            if self.plan is not None and self.plan.object:
                ctx.set(ContextNames.APPLICATION_ROOT_NAME, self.plan.object)
            meta = {
                "kind": "session_start",
                "task": self.task,
                "mode": self.mode,
                "owner": self.owner,
                "session_status": SessionStatus.RUNNING,
                "cursor": self._cursor("start", None, None),
            }
        await ctx.acommit_step(author="system", meta=meta)
        for hook in self._start_hooks:
            hook(self)
        self._renewer = asyncio.create_task(self._renew_loop(), name=f"saucer-lease-{sid}")

    def _creation_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "task": self.task,
            "mode": self.mode,
            "request": self.request,
            "platform": self.platform,
            "status": SessionStatus.RUNNING,
        }
        if self.workspace is not None:
            meta["workspace"] = self.workspace
        if self.plan is not None:
            meta["plan"] = self.plan.model_dump(mode="json", exclude_defaults=True)
            meta["plan_file"] = self.plan_file
        return meta

    def _apply_cursor(self, cursor: Mapping[str, Any]) -> None:
        """Continue where the cursor says (see the module docs)."""
        self._rounds_done = int(cursor.get("rounds") or 0)
        self._failed_rounds = int(cursor.get("failed") or 0)
        self._requests_taken = int(cursor.get("requests") or 0)
        self._eval_cost = float(cursor.get("eval_cost") or 0.0)
        self._exp_cost = float(cursor.get("exp_cost") or 0.0)
        self._unknown_cost = bool(cursor.get("unknown_cost"))
        self._error = cursor.get("error")
        self._stopped = cursor.get("stopped")
        self._reason = cursor.get("reason") or ""
        base = cursor.get("limit_base")
        if isinstance(base, dict):
            self.limits = self.limits.from_here(int(base.get("steps") or 0), int(base.get("rounds") or 0))
        phase = cursor.get("phase")
        round_id = cursor.get("round")
        plan_index = cursor.get("plan_index")
        self._phase = phase or "start"
        if round_id is None:
            return
        self._next_round_id = int(round_id) + 1
        if plan_index is not None:
            self._next_plan_index = int(plan_index) + 1
        if phase in ("round_start", "step"):
            step = self.plan.steps[plan_index] if (self.plan is not None and plan_index is not None) else None
            agents = self._agents_for(step)
            self._round = Round(
                self,
                int(round_id),
                self.context.get(ContextNames.REQUEST),
                agents,
                plan_index=plan_index,
                plan_step=step,
                start_agent=cursor.get("agent"),
                start_state=cursor.get("state"),
            )
        elif phase == "round_end" and not cursor.get("evaluated", True) and self.settings.system.eva_round:
            self._pending_round_eval = int(round_id)

    def _cursor(
        self,
        phase: str,
        round_id: int | None,
        plan_index: int | None,
        agent: str | None = None,
        state: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        cursor: dict[str, Any] = {"phase": phase, "round": round_id, "plan_index": plan_index, "agent": agent, "state": state}
        # Counters at zero are left out (the cursor rides on every step's event).
        if self._rounds_done:
            cursor["rounds"] = self._rounds_done
        if self._failed_rounds:
            cursor["failed"] = self._failed_rounds
        if self._requests_taken:
            cursor["requests"] = self._requests_taken
        if self._eval_cost:
            cursor["eval_cost"] = self._eval_cost
        if self._exp_cost:
            cursor["exp_cost"] = self._exp_cost
        if self._unknown_cost:
            cursor["unknown_cost"] = True
        if self._error is not None or self._stopped is not None or self._reason:
            cursor.update(error=self._error, stopped=self._stopped, reason=self._reason)
        cursor.update(self._limit_bases())
        if extra:
            cursor.update(extra)
        return cursor

    def _limit_bases(self) -> dict[str, Any]:
        """Where the limits count from, when a stopped session was continued (nothing otherwise)."""
        limits = self.limits
        if not (limits.step_base or limits.round_base):
            return {}
        return {"limit_base": {"steps": limits.step_base, "rounds": limits.round_base}}

    def _open_logs(self, ctx: Context) -> None:
        cfg = self.settings.logs
        if not cfg.enabled:
            self.logs = SessionLogs.disabled()
        else:
            previous = ctx.get(ContextNames.LOG_PATH) if self._resuming else ""
            if previous and not self._logs_of_another_session(previous):
                self.logs = SessionLogs.reopen(previous)
            else:
                self.logs = SessionLogs.create(cfg.root, self.task, self.session_id)
        ctx.set(ContextNames.LOGGER, self.logs.logger(TEXT_LOG))
        ctx.set(ContextNames.REQUEST_LOGGER, self.logs.logger(REQUEST_LOG))
        ctx.set(ContextNames.EVALUATION_LOGGER, self.logs.logger(EVALUATION_LOG))

    def _logs_of_another_session(self, path: str) -> bool:
        """True when ``path`` is the log folder a fork inherited from its parent (a fork writes its own)."""
        assert self.store is not None
        if _fork_origin(self.store.session_info(self.session_id))[0] is None:
            return False
        own = re.escape(slug(self.session_id, 120))
        return re.fullmatch(rf"{own}(-\d+)?", Path(path).name) is None

    @property
    def log_path(self) -> Path | None:
        """``logs/<task>/<session_id>/`` (None when logs are off)."""
        return self.logs.path

    # ============================================================ dispatcher

    async def open_dispatcher(self) -> Any:
        """The session's dispatcher, made from its factory (and entered) on the first call.

        A dispatcher the session made is closed when the session ends, or by
        :meth:`discard` if it never runs.
        """
        if self._dispatcher_opened:
            return self._dispatcher
        dispatcher = self._dispatcher
        if dispatcher is None and self._dispatcher_factory is not None:
            dispatcher = self._dispatcher_factory(self)
            if inspect.isawaitable(dispatcher):
                dispatcher = await dispatcher
            self._owns_dispatcher = True
        if dispatcher is not None and self._owns_dispatcher and hasattr(dispatcher, "__aenter__"):
            entered = await dispatcher.__aenter__()
            self._entered_dispatcher = dispatcher
            if entered is not None:
                dispatcher = entered
        self._dispatcher = dispatcher
        self._dispatcher_opened = True
        return dispatcher

    async def tools(self) -> dict[str, Any]:
        """The tools the session's dispatcher offers, keyed ``server.tool`` ({} when it cannot list them)."""
        await self.open_dispatcher()
        return await self._tool_info()

    async def discard(self) -> None:
        """Close what a session that will not run has opened (its dispatcher)."""
        await self._close_dispatcher()

    async def _attach_dispatcher(self, ctx: Context) -> None:
        ctx.attach_command_dispatcher(await self.open_dispatcher())

    async def _tool_info(self) -> dict[str, Any]:
        fn = getattr(self._dispatcher, "list_tools", None)
        if fn is None:
            return {}
        try:
            tools = fn()
            if inspect.isawaitable(tools):
                tools = await tools
        except Exception as exc:  # noqa: BLE001 - a session can run without the tool list
            _log.warning("session %s: could not list tools: %s", self.session_id, exc)
            return {}
        if isinstance(tools, Mapping):
            return {str(k): _jsonable(v) for k, v in tools.items()}
        out: dict[str, Any] = {}
        for tool in tools or []:
            data = _jsonable(tool)
            name = data.get("name") if isinstance(data, dict) else None
            if name:
                out[str(name)] = data
        return out

    # ================================================================ leases

    async def _acquire_lease(self) -> Lease:
        assert self.store is not None
        deadline = time.monotonic() + self.lease_wait
        ttl = self.settings.store.lease_ttl
        while True:
            try:
                return self.store.acquire_lease(self.session_id, self.owner, ttl)
            except LeaseHeldError as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                await asyncio.sleep(min(left, max(0.02, exc.expires_at - time.time() + 0.02)))

    def _renew(self) -> None:
        assert self.store is not None
        try:
            lease = self.store.acquire_lease(self.session_id, self.owner, self.settings.store.lease_ttl)
        except LeaseHeldError as exc:
            self._lease_lost = exc
            return
        except StoreError as exc:  # transient: the next renewal tries again
            _log.warning("session %s: lease renewal failed: %s", self.session_id, exc)
            return
        self._lease_renewed = time.monotonic()
        if self.lease is None or lease.token != self.lease.token:
            self.context.fence = lease.token
        self.lease = lease

    async def _renew_loop(self) -> None:
        interval = self.settings.store.lease_ttl / 3.0
        while True:
            await asyncio.sleep(interval)
            self._renew()

    def _check_lease(self) -> None:
        """Called before each step: stop if the lease was lost, renew if it is due."""
        if self._lease_lost is not None:
            raise LeaseLostError(f"session {self.session_id!r}: this runner lost its lease ({self._lease_lost})")
        if time.monotonic() - self._lease_renewed > self.settings.store.lease_ttl / 3.0:
            self._renew()
            if self._lease_lost is not None:
                raise LeaseLostError(f"session {self.session_id!r}: this runner lost its lease ({self._lease_lost})")

    # ================================================================ rounds

    def _remember_commands(self, record: StepRecord) -> None:
        done = self._run_rounds[-1][1]
        for i, command in enumerate(record.commands):
            if i < len(record.results) and record.results[i].get("status") == "success":
                done.append(command)

    def _subtask_end(self, rnd: Round, agent: Agent) -> None:
        hook = self.subtask_end_hook
        if hook is not None:
            hook(self, rnd, agent)

    async def _end_round(self, rnd: Round, result: RoundResult) -> None:
        ctx = self.context
        ctx.set(ContextNames.ROUND_RESULT, result.reason or result.status)
        self._rounds_done += 1
        if not result.ok:
            self._failed_rounds += 1
            if not self._reason:
                # The first round that did not finish says why the session did not (e.g. no_action).
                self._reason = f"round {rnd.id} {result.status}: {result.reason}" if result.reason else ""
        evaluate = self.settings.system.eva_round
        await ctx.acommit_step(
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

    # ============================================================ evaluation

    def _resolve_evaluator(self) -> Any:
        if self.evaluator is not None:
            return self.evaluator
        if self._request_set is not None and self._request_set.evaluator is not None:
            return self._request_set.evaluator
        from saucer.agents.evaluator import RuleEvaluator

        self.evaluator = RuleEvaluator()
        return self.evaluator

    async def _evaluate(self, scope: str, round_id: int | None, plan_index: int | None = None) -> Evaluation:
        evaluator = self._resolve_evaluator()
        name = getattr(evaluator, "name", None) or type(evaluator).__name__
        try:
            verdict = evaluator.evaluate(self.context, scope=scope, round_id=round_id)
            if inspect.isawaitable(verdict):
                verdict = await verdict
            if not isinstance(verdict, Evaluation):
                verdict = Evaluation.model_validate(verdict)
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - a failed evaluation is a verdict, not a crash
            verdict = Evaluation(scope=scope, round=round_id, complete="unsure", reason=f"the evaluator failed: {type(exc).__name__}: {exc}")
        if not verdict.evaluator:
            verdict = verdict.model_copy(update={"evaluator": name})
        if verdict.round is None and round_id is not None:
            verdict = verdict.model_copy(update={"round": round_id})
        cost = verdict.cost
        if cost is None:
            self._unknown_cost = True
        elif cost:
            self._eval_cost += cost
            self.context.incr(ContextNames.SESSION_COST, cost)
        self._evaluations.append(verdict)
        self.logs.write_evaluation(EvaluationLogEntry(**verdict.model_dump(), timestamp=time.time()))
        phase = "round_end" if scope == "round" else "session_eval"
        await self.context.acommit_step(
            author=f"evaluator:{name}",
            round=round_id,
            meta={
                "kind": "evaluation",
                "scope": scope,
                "verdict": verdict.model_dump(mode="json"),
                "cost": cost,
                "session_status": SessionStatus.RUNNING,
                "cursor": self._cursor(phase, round_id if scope == "round" else None, plan_index, evaluated=True),
            },
        )
        return verdict

    # ================================================================== end

    def _status(self) -> str:
        if self._error is not None:
            return SessionStatus.ERROR
        if self._stopped is not None:
            return SessionStatus.STOPPED
        if self._failed_rounds:
            return SessionStatus.FAILED
        return SessionStatus.FINISHED

    async def _finish(self) -> None:
        status = self._status()
        if self.settings.system.eva_session and self._phase != "session_eval" and status != SessionStatus.ERROR:
            await self._evaluate("session", None)
        experience_path = await self._maybe_save_experience(status)
        await self._complete(status, experience_path)

    async def _complete(self, status: str, experience_path: str | None, error: str | None = None) -> None:
        ctx = self.context
        cost = self.cost_summary()
        reason = self._stopped or self._reason or (self._error or "")
        if status == SessionStatus.FINISHED and not reason:
            reason = f"{self._rounds_done} round(s) finished"
        summary = {
            "status": status,
            "rounds": self._rounds_done,
            "steps": self.session_step,
            "cost": None if cost.unknown else round(cost.known, 6),
            "reason": reason,
        }
        meta = {
            "kind": "session_end",
            "session_status": status,
            "summary": summary,
            "cost_summary": cost.to_dict(),
            "error": error or self._error,
            "experience_path": experience_path,
            "evaluations": [e.model_dump(mode="json") for e in self._evaluations],
            "cursor": self._cursor("end", None, None),
        }
        version = await ctx.acommit(author="system", meta=meta)
        self.result = SessionResult(
            session_id=self.session_id,
            task=self.task,
            mode=self.mode,
            status=status,
            reason=reason,
            error=error or self._error,
            rounds=self._rounds_done,
            steps=self.session_step,
            cost=cost,
            log_path=str(self.logs.path) if self.logs.path is not None else None,
            experience_path=experience_path,
            evaluations=list(self._evaluations),
            version=version,
        )
        if self.settings.system.log_to_markdown and self.logs.path is not None:
            self._write_markdown(summary, cost)
        for hook in self._end_hooks:
            hook(self, self.result)
        await self._notify("on_session_end", self, self.result)

    def _write_markdown(self, summary: dict[str, Any], cost: CostSummary) -> None:
        try:
            records = list(read_step_log(self.logs.path)) if (self.logs.path / "response.log").exists() else []  # type: ignore[operator]
        except (OSError, ValueError) as exc:
            _log.warning("session %s: output.md skipped: %s", self.session_id, exc)
            return
        title = f"{self.task} — session {self.session_id} ({self.mode})"
        self.logs.write_markdown(render_markdown(title, records, {**summary, "cost": cost.render().removeprefix("cost: ")}))

    async def _fail(self, exc: BaseException) -> None:
        """An exception outside a step: record it as the session's end when the store still takes it."""
        message = str(exc) if isinstance(exc, (EngineError, LeaseHeldError, ValueError)) else f"{type(exc).__name__}: {exc}"
        self._error = message
        if self.context is not None and not isinstance(exc, (StoreError, LeaseLostError)):
            try:
                if self.context.durability != "exit":
                    self.context.rollback()
                await self._complete(SessionStatus.ERROR, None, message)
                return
            except Exception as inner:  # noqa: BLE001
                _log.warning("session %s: could not record its error: %s", self.session_id, inner)
        self.result = SessionResult(
            session_id=self.session_id,
            task=self.task,
            mode=self.mode,
            status=SessionStatus.ERROR,
            reason=message,
            error=message,
            rounds=self._rounds_done,
            steps=self.session_step,
            cost=self.cost_summary() if self.context is not None else CostSummary(),
            log_path=str(self.logs.path) if self.logs.path is not None else None,
            version=self.context.version if self.context is not None else 0,
        )
        for hook in self._end_hooks:
            hook(self, self.result)
        await self._notify("on_session_end", self, self.result)

    def cost_summary(self) -> CostSummary:
        """Steps, evaluation and experience cost so far."""
        ctx = self.context
        total = ctx.get(ContextNames.SESSION_COST) if ctx is not None else 0.0
        per_round = ctx.get(ContextNames.ROUND_COST) if ctx is not None else {}
        steps = max(0.0, total - self._eval_cost - self._exp_cost)
        return CostSummary(
            steps=steps,
            evaluation=self._eval_cost,
            experience=self._exp_cost,
            per_round=dict(per_round),
            unknown=self._unknown_cost,
        )

    def _stored_result(self, meta: Mapping[str, Any]) -> SessionResult:
        summary = meta.get("summary") or {}
        cost_data = meta.get("cost_summary") or {}
        cost = CostSummary(
            steps=cost_data.get("steps", 0.0),
            evaluation=cost_data.get("evaluation", 0.0),
            experience=cost_data.get("experience", 0.0),
            per_round={int(k): v for k, v in (cost_data.get("per_round") or {}).items()},  # None: unknown
            unknown=bool(cost_data.get("unknown")),
        )
        return SessionResult(
            session_id=self.session_id,
            task=self.task,
            mode=self.mode,
            status=meta.get("session_status", summary.get("status", SessionStatus.FINISHED)),
            reason=summary.get("reason", ""),
            error=meta.get("error"),
            rounds=summary.get("rounds", 0),
            steps=summary.get("steps", 0),
            cost=cost,
            log_path=self.context.get(ContextNames.LOG_PATH) or None,
            experience_path=meta.get("experience_path"),
            evaluations=[Evaluation.model_validate(e) for e in meta.get("evaluations") or []],
            version=self.context.version,
        )

    # ============================================================ experience

    async def _maybe_save_experience(self, status: str) -> str | None:
        mode = self.save_experience or self.settings.system.save_experience
        if status != SessionStatus.FINISHED or mode == "always_not":
            return None
        session_verdicts = [e for e in self._evaluations if e.scope == "session"]
        judged = session_verdicts[-1:] or self._evaluations  # the session's verdict, else every round's
        if any(v.complete == "no" for v in judged):
            return None  # an evaluation says the task is not done: never a good plan
        if mode == "auto" and session_verdicts and session_verdicts[-1].complete != "yes":
            return None
        if mode == "ask" and not await ask(self.interactor, "experience_asker"):
            return None
        plan = self.experience_plan()
        if not plan.steps:
            return None
        target_dir = self.settings.system.experience_dir
        if target_dir is not None:
            path = Path(target_dir) / f"{slug(self.task)}-{slug(self.session_id, 120)}.json"
        elif self.logs.path is not None:
            path = self.logs.path / EXPERIENCE_FILE
        else:
            _log.warning("session %s: experience not saved (logs are off and system.experience_dir is not set)", self.session_id)
            return None
        cost: float | None = 0.0
        if self.experience_saver is not None:
            out = self.experience_saver(self, plan, path)
            if inspect.isawaitable(out):
                out = await out
            if isinstance(out, tuple):
                path, cost = Path(out[0]), out[1]
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(plan.model_dump_json(indent=2, exclude_defaults=True) + "\n", encoding="utf-8")
        if cost is None:
            self._unknown_cost = True
        elif cost:
            self._exp_cost += cost
            self.context.incr(ContextNames.SESSION_COST, cost)
        return str(path)

    def experience_plan(self) -> Plan:
        """This session's successful commands as a plan follower mode can replay."""
        assert self.store is not None
        if self.context.durability == "exit":  # no per-step events: what this run did
            return plan_from_rounds(self.task, self._run_rounds)
        rounds: list[tuple[str, list[dict[str, Any]]]] = []
        for event in self.store.read(self.session_id, 0, self.context.version):
            kind = event.meta.get("kind")
            if kind == "round_start":
                rounds.append((event.meta.get("request") or "", []))
            elif kind == "step" and rounds:
                results = event.meta.get("results") or []
                for i, command in enumerate(event.meta.get("commands") or []):
                    if i < len(results) and results[i].get("status") == "success":
                        rounds[-1][1].append(command)
        return plan_from_rounds(self.task, rounds)

    # ================================================================ close

    async def _close(self, clean: bool) -> None:
        renewer = self._renewer
        if renewer is not None:
            # Not awaited: awaiting here would swallow a cancellation aimed at this task.
            renewer.cancel()
            self._renewer = None
        await self._close_dispatcher()
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
                    ctx.__exit__(RuntimeError, RuntimeError("aborted"), None)  # discard the unfinished step
            except Exception as exc:  # noqa: BLE001
                _log.warning("session %s: closing the context failed: %s", self.session_id, exc)
        if self.lease is not None and self.store is not None:
            try:
                self.store.release_lease(self.lease)
            except Exception as exc:  # noqa: BLE001
                _log.warning("session %s: releasing the lease failed: %s", self.session_id, exc)
        self.logs.close()
        if self._owns_store and self.store is not None:
            self.store.close()

    async def _close_dispatcher(self) -> None:
        if self._entered_dispatcher is not None:
            try:
                await self._entered_dispatcher.__aexit__(None, None, None)
            except Exception as exc:  # noqa: BLE001
                _log.warning("session %s: closing the dispatcher failed: %s", self.session_id, exc)
            self._entered_dispatcher = None

    def __repr__(self) -> str:
        return f"<Session {self.session_id!r} task={self.task!r} mode={self.mode}>"
