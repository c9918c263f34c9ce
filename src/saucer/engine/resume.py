"""Starting a session where its stored history says: the resume side of :class:`~saucer.engine.session.Session`.

:class:`ResumableSession` is the part of the session that reads and writes
its resume cursor (:mod:`saucer.engine.cursor`): what a run's first commit
says, where a resumed run continues, and which log folder it writes to.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from saucer.config import Settings, load_settings
from saucer.context import Context, ContextNames
from saucer.engine.accounting import Limits
from saucer.engine.cursor import (
    Progress,
    ResumePoint,
    continue_cursor,
    cursor_meta,
    fork_origin,
    last_cursor,
    retry_cursor,
    stored_session_brief,
)
from saucer.engine.logs import EVALUATION_LOG, REQUEST_LOG, TEXT_LOG, SessionLogs, slug
from saucer.engine.plan import Plan, initial_vars, parse_plan
from saucer.engine.result import SessionStatus
from saucer.engine.round import Round
from saucer.redaction import redact_known
from saucer.store import EventStore, open_store

if TYPE_CHECKING:
    from saucer.engine.agent import AgentSet
    from saucer.engine.plan import PlanStep

__all__ = ["ResumableSession"]


class ResumableSession:
    """Resume, and the cursor every commit carries; mixed into :class:`~saucer.engine.session.Session`."""

    # Set by Session.__init__ (and run):
    task: str
    mode: str
    id: int
    owner: str
    session_id: str
    settings: Settings
    plan_file: str | None
    platform: str
    workspace: str | None
    request: str
    store: EventStore | None
    _store_spec: EventStore | str
    context: Context
    logs: SessionLogs
    limits: Limits
    progress: Progress
    _resuming: bool
    _retry_failed: bool
    context_vars: dict[str, Any]
    _phase: str
    _round: Round | None
    _rounds: dict[int, Round]
    _next_round_id: int
    _next_plan_index: int
    _pending_round_eval: int | None
    skipped: dict[str, str]
    _plan: Plan | None = None
    #: A resumed session's plan is read when first needed: the id of the session whose stored meta holds it.
    _stored_plan: str | None = None

    @property
    def plan(self) -> Plan | None:
        """The session's plan (None: none); a resumed session reads it from its store when first asked,
        as a stored plan of 10^4 steps is megabytes (:class:`PlanError` if it is no longer a valid plan)."""
        if self._stored_plan is not None:
            holder = self._stored_plan
            spec = self.store if self.store is not None else self._store_spec
            if isinstance(spec, str):
                with open_store(
                    spec, encrypt=self.settings.store.encrypt, key_file=self.settings.store.key_file
                ) as probe:
                    data = probe.session_plan(holder)
            else:
                data = spec.session_plan(holder)
            self._plan = parse_plan(data, self.plan_file or "plan") if data is not None else None
            self._stored_plan = None
        return self._plan

    @plan.setter
    def plan(self, value: Plan | None) -> None:
        self._plan, self._stored_plan = value, None

    if TYPE_CHECKING:  # provided by Session

        def _agents_for(self, step: PlanStep | str | None) -> AgentSet: ...

    @classmethod
    def resume(
        cls,
        session_id: str,
        *,
        store: EventStore | str | None = None,
        settings: Settings | None = None,
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
        probe = (
            open_store(spec, encrypt=settings.store.encrypt, key_file=settings.store.key_file)
            if isinstance(spec, str)
            else spec
        )
        try:
            meta, plan_holder = stored_session_brief(probe, session_id)
        finally:
            if isinstance(spec, str):
                probe.close()
        kwargs.setdefault("platform", meta.get("platform") or "linux")
        if meta.get("workspace"):
            kwargs.setdefault("workspace", meta["workspace"])
        for fixed in ("task", "mode", "request", "plan", "plan_file", "session_id", "context_vars", "participants"):
            if fixed in kwargs:
                raise TypeError(f"Session.resume takes {fixed} from the stored session, not as an argument")
        session = cls(  # type: ignore[call-arg]  # cls is Session
            meta.get("task") or session_id,
            mode=meta.get("mode") or "normal",
            settings=settings,
            store=spec,
            session_id=session_id,
            request=meta.get("request") or "",
            plan_file=meta.get("plan_file"),
            **kwargs,
        )
        session._stored_plan = plan_holder  # read when a step of it is first needed
        session._resuming = True
        session._retry_failed = retry_failed
        return session

    def _resume_point(self, store: EventStore) -> tuple[ResumePoint | None, dict[str, Any], str | None, str | None]:
        """Where to continue: the cursor, its event's meta, how it continues (stopped, retry_failed) and how it ended.

        A stored session with no cursor was created but its runner died before its start was committed
        (a worker killed at that moment): this run is its start, not a resume. It commits the
        ``session_start`` (its id, mode, application) and the initial variables: the plan's, then
        :attr:`context_vars` (which the caller of :meth:`resume` may set, e.g. from the queue job).
        """
        if not self._resuming:
            return None, {}, None, None
        point, meta = last_cursor(store, self.session_id)
        if point is None:
            self._resuming = False
            self.context_vars = initial_vars(self.plan, self.context_vars)
            return None, {}, None, None
        ended = meta.get("session_status") if point is not None and point.phase == "end" else None
        if ended == SessionStatus.STOPPED:
            return continue_cursor(store, self.session_id)[0], meta, "stopped", ended
        if ended in (SessionStatus.FAILED, SessionStatus.ERROR) and self._retry_failed:
            return retry_cursor(store, self.session_id)[0], meta, "retry_failed", ended
        return point, meta, None, ended

    def _start_meta(self, point: ResumePoint | None, continued: str | None) -> dict[str, Any]:
        """The meta of the first commit of this run (session_start, or session_resume)."""
        if self._resuming:
            resumed_at = point.to_meta() if point is not None else self._cursor("start", None, None)
            if self.limits.step_base or self.limits.round_base:
                resumed_at["limit_base"] = {"steps": self.limits.step_base, "rounds": self.limits.round_base}
            meta: dict[str, Any] = {
                "kind": "session_resume",
                "owner": self.owner,
                "session_status": SessionStatus.RUNNING,
                "cursor": resumed_at,
            }
            if continued is not None:
                meta["continues"] = continued
        else:
            ctx = self.context
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
        if self.skipped:  # the seed's defaults this run cannot apply, and why
            meta["skipped"] = dict(self.skipped)
        return meta

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
            # Known secrets (configured keys and tokens) never reach the store, a plan written with one literally included.
            meta["plan"] = redact_known(self.plan.model_dump(mode="json", exclude_defaults=True))
            meta["plan_file"] = self.plan_file
        return meta

    def _apply_cursor(self, point: ResumePoint) -> None:
        """Continue where the cursor says (see the module docs)."""
        self.progress = point.progress
        if point.limit_base is not None:
            self.limits = self.limits.from_here(*point.limit_base)
        self._phase = point.phase
        round_id, plan_index = point.round, point.plan_index
        if round_id is None:
            return
        self._next_round_id = round_id + 1
        if plan_index is not None:
            self._next_plan_index = plan_index + 1
        if point.phase in ("round_start", "step"):
            step = self.plan.steps[plan_index] if (self.plan is not None and plan_index is not None) else None
            self._round = Round(
                self,
                round_id,
                self.context.get(ContextNames.REQUEST),
                self._agents_for(step),
                plan_index=plan_index,
                plan_step=step,
                start_agent=point.agent,
                start_state=point.state,
            )
            self._rounds[round_id] = self._round
        elif point.phase == "round_end" and point.evaluated is False and self.settings.system.eva_round:
            self._pending_round_eval = round_id

    def _cursor(
        self,
        phase: str,
        round_id: int | None,
        plan_index: int | None,
        agent: str | None = None,
        state: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        return cursor_meta(phase, round_id, plan_index, agent, state, self.progress, self.limits, **extra)

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
        if fork_origin(self.store.session_info(self.session_id))[0] is None:
            return False
        own = re.escape(slug(self.session_id, 120))
        return re.fullmatch(rf"{own}(-\d+)?", Path(path).name) is None
