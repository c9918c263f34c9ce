"""Starting a session where its stored history says: the session's :class:`Resumer` and its stored plan.

Durability and resume. Every commit the engine makes (session start, round
start, each step, round end, evaluations, session end) carries a *cursor* in
its event ``meta``: the round, the plan step, and the agent and state that act
next. ``Session.resume`` reads the newest cursor and continues right after
the last committed step, so **a committed step is never executed again**.
The session's start is written with its first round's start, and a round's
end and evaluation with the next round's start or the session's end (one
transaction each, :mod:`saucer.context.staging`): a crash before those are
written resumes after the last step, whose event records what the round's end
says (``round_result``), so the round ends as it would have. A
step that was running when the process died had not committed: it runs again
on resume (at-least-once for the one in-flight step; make tools idempotent or
check the Context if that matters). With durability ``exit`` nothing is
committed before the session ends, so a crashed ``exit`` session resumes from
its start. Agents' Python attributes are not restored; durable agent data
belongs in the Context.

:class:`Resumer` is the session's collaborator that knows whether a run
resumes and where: it reads the resume cursor (:mod:`saucer.engine.cursor`)
under the lease, says what the run's first commit says when it resumes, and
turns a cursor into a :class:`Continuation` that the session applies. It
holds only the session's id and how it was asked to resume; everything else
is passed in, so it reads nothing of the session behind its back.
:class:`StoredPlan` reads a resumed session's plan when it is first needed;
:func:`resume_arguments` makes ``Session.resume``'s arguments from the stored
session, and :func:`open_session_logs` picks the log folder a run writes to.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saucer.context import ContextNames
from saucer.engine.accounting import Limits
from saucer.engine.cursor import (
    Progress,
    ResumePoint,
    continue_cursor,
    fork_origin,
    last_cursor,
    retry_cursor,
    stored_session_brief,
)
from saucer.engine.logs import EVALUATION_LOG, REQUEST_LOG, TEXT_LOG, SessionLogs, slug
from saucer.engine.plan import Plan, parse_plan
from saucer.engine.result import SessionStatus
from saucer.redaction import redact_known
from saucer.store import EventStore, open_store

if TYPE_CHECKING:
    from saucer.config import LogsSettings, SettingsModel
    from saucer.context import Context
    from saucer.engine.meta import CreationMeta, CursorMeta, SessionResumeMeta, SessionStartMeta

__all__ = [
    "Resumer",
    "StartPoint",
    "Continuation",
    "StoredPlan",
    "creation_meta",
    "resume_arguments",
    "open_session_logs",
]

#: What ``Session.resume`` takes from the stored session, never as an argument.
_FIXED = ("task", "mode", "request", "plan", "plan_file", "session_id", "context_vars", "participants")


@dataclass(frozen=True, slots=True)
class StartPoint:
    """Where a run starts, read under the lease before anything is written."""

    #: The cursor to continue from (None: a new session, or one whose start was never committed).
    point: ResumePoint | None = None
    #: The meta of the event that carries the newest cursor.
    meta: dict[str, Any] = field(default_factory=dict)
    #: How an ended session continues: ``stopped`` (a fresh budget) or ``retry_failed``; None: it does not.
    continued: str | None = None
    #: How the stored session ended (None: it did not).
    ended: str | None = None
    #: The stored session was created but its start never committed: this run is its start.
    never_started: bool = False

    @property
    def over(self) -> bool:
        """The stored session ended and does not continue: the run only reports its stored result."""
        return self.ended is not None and self.continued is None


@dataclass(frozen=True, slots=True)
class Continuation:
    """What a cursor means for the session's state: the session applies it (and reopens the round)."""

    progress: Progress
    limits: Limits
    phase: str
    #: The next round's id and plan step (None: unchanged).
    next_round_id: int | None = None
    next_plan_index: int | None = None
    #: A round to reopen where its next step runs: (round id, plan index, agent, state).
    reopen: tuple[int, int | None, str | None, str | None] | None = None
    #: A round whose end is committed but not its evaluation.
    pending_round_eval: int | None = None


class Resumer:
    """Whether a run resumes its session, and where (see the module docs)."""

    def __init__(self, session_id: str, *, resuming: bool = False, retry_failed: bool = False) -> None:
        self.session_id = session_id
        #: True for a run that continues a stored session.
        self.resuming = resuming
        #: Run a failed session's failed step again (``resume --retry-failed``).
        self.retry_failed = retry_failed

    def locate(self, store: EventStore) -> StartPoint:
        """Where to continue: the cursor, its event's meta, how it continues and how it ended.

        A stored session with no cursor was created but its runner died before its start was
        committed (a worker killed at that moment): this run is its start, not a resume
        (``never_started``; the session then commits ``session_start`` and its initial variables).
        """
        if not self.resuming:
            return StartPoint()
        point, meta = last_cursor(store, self.session_id)
        if point is None:
            self.resuming = False
            return StartPoint(never_started=True)
        ended = meta.get("session_status") if point.phase == "end" else None
        if ended == SessionStatus.STOPPED:
            return StartPoint(continue_cursor(store, self.session_id)[0], meta, "stopped", ended)
        if ended in (SessionStatus.FAILED, SessionStatus.ERROR) and self.retry_failed:
            return StartPoint(retry_cursor(store, self.session_id)[0], meta, "retry_failed", ended)
        return StartPoint(point, meta, None, ended)

    @staticmethod
    def continuation(point: ResumePoint, limits: Limits, *, eva_round: bool) -> Continuation:
        """What continuing at ``point`` means for the session (``eva_round``: rounds are evaluated)."""
        if point.limit_base is not None:
            limits = limits.from_here(*point.limit_base)
        round_id, plan_index = point.round, point.plan_index
        if round_id is None:
            return Continuation(point.progress, limits, point.phase)
        reopen = None
        pending = None
        if point.phase in ("round_start", "step"):
            reopen = (round_id, plan_index, point.agent, point.state)
        elif point.phase == "round_end" and point.evaluated is False and eva_round:
            pending = round_id
        return Continuation(
            point.progress,
            limits,
            point.phase,
            next_round_id=round_id + 1,
            next_plan_index=None if plan_index is None else plan_index + 1,
            reopen=reopen,
            pending_round_eval=pending,
        )

    def first_meta(
        self,
        start: StartPoint,
        here: CursorMeta,
        *,
        task: str,
        mode: str,
        owner: str,
        limits: Limits,
        skipped: dict[str, str],
    ) -> SessionStartMeta | SessionResumeMeta:
        """The meta of a run's first commit: ``session_start`` for a new session, ``session_resume`` for a
        resumed one (where it continues, and how: ``continues``), with what this run cannot apply (``skipped``);
        ``here`` is the session's cursor at its start (a resume continues its stored one)."""
        meta: SessionStartMeta | SessionResumeMeta
        if not self.resuming:
            meta = {
                "kind": "session_start",
                "task": task,
                "mode": mode,
                "owner": owner,
                "session_status": SessionStatus.RUNNING,
                "cursor": here,
            }
        else:
            resumed_at = start.point.to_meta() if start.point is not None else here
            if limits.step_base or limits.round_base:
                resumed_at["limit_base"] = {"steps": limits.step_base, "rounds": limits.round_base}
            meta = {
                "kind": "session_resume",
                "owner": owner,
                "session_status": SessionStatus.RUNNING,
                "cursor": resumed_at,
            }
            if start.continued is not None:
                meta["continues"] = start.continued
        if skipped:  # the seed's defaults this run cannot apply, and why
            meta["skipped"] = dict(skipped)
        return meta


class StoredPlan:
    """A session's plan; a resumed session's is read from its store when first asked for, as a
    stored plan of 10^4 steps is megabytes (:class:`PlanError` if it is no longer a valid plan)."""

    def __init__(self, plan: Plan | None, plan_file: str | None) -> None:
        self._plan = plan
        self._plan_file = plan_file
        #: The id of the session whose stored meta holds the plan, until it is read.
        self._holder: str | None = None

    def stored_in(self, holder: str | None) -> None:
        """The plan is the one stored with session ``holder`` (None: there is none)."""
        self._plan, self._holder = None, holder

    def get(self, store: EventStore | str, settings: SettingsModel) -> Plan | None:
        """The plan (``store``: the session's store, or its URL when it is not open)."""
        holder = self._holder
        if holder is not None:
            if isinstance(store, str):
                with open_store(store, encrypt=settings.store.encrypt, key_file=settings.store.key_file) as probe:
                    data = probe.session_plan(holder)
            else:
                data = store.session_plan(holder)
            self._plan = parse_plan(data, self._plan_file or "plan") if data is not None else None
            self._holder = None
        return self._plan

    def set(self, plan: Plan | None) -> None:
        """Replace the plan."""
        self._plan, self._holder = plan, None


def creation_meta(
    task: str, mode: str, request: str, platform: str, workspace: str | None, plan: Plan | None, plan_file: str | None
) -> CreationMeta:
    """The meta a new session is created with in the store (what :func:`resume_arguments` reads back)."""
    meta: CreationMeta = {
        "task": task,
        "mode": mode,
        "request": request,
        "platform": platform,
        "status": SessionStatus.RUNNING,
    }
    if workspace is not None:
        meta["workspace"] = workspace
    if plan is not None:
        # Known secrets (configured keys and tokens) never reach the store, a plan written with one literally included.
        meta["plan"] = redact_known(plan.model_dump(mode="json", exclude_defaults=True))
        meta["plan_file"] = plan_file
    return meta


def resume_arguments(
    spec: EventStore | str, settings: SettingsModel, session_id: str, kwargs: dict[str, Any]
) -> tuple[dict[str, Any], str | None]:
    """``Session(...)``'s arguments for resuming ``session_id`` (``kwargs``: the caller's own, checked),
    and the id of the session whose stored meta holds its plan (None: it has none)."""
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
    for fixed in _FIXED:
        if fixed in kwargs:
            raise TypeError(f"Session.resume takes {fixed} from the stored session, not as an argument")
    out = dict(kwargs)
    out.setdefault("platform", meta.get("platform") or "linux")
    if meta.get("workspace"):
        out.setdefault("workspace", meta["workspace"])
    out.update(
        task=meta.get("task") or session_id,
        mode=meta.get("mode") or "normal",
        settings=settings,
        store=spec,
        session_id=session_id,
        request=meta.get("request") or "",
        plan_file=meta.get("plan_file"),
    )
    return out, plan_holder


def open_session_logs(
    cfg: LogsSettings, ctx: Context, *, resuming: bool, task: str, session_id: str, store: EventStore
) -> SessionLogs:
    """The run's log files (a resumed run continues its own folder; a fork writes its own), with the
    Context's loggers pointed at them."""
    if not cfg.enabled:
        logs = SessionLogs.disabled()
    else:
        previous = ctx.get(ContextNames.LOG_PATH) if resuming else ""
        if previous and not _logs_of_another_session(store, session_id, previous):
            logs = SessionLogs.reopen(previous)
        else:
            logs = SessionLogs.create(cfg.root, task, session_id)
    ctx.set(ContextNames.LOGGER, logs.logger(TEXT_LOG))
    ctx.set(ContextNames.REQUEST_LOGGER, logs.logger(REQUEST_LOG))
    ctx.set(ContextNames.EVALUATION_LOGGER, logs.logger(EVALUATION_LOG))
    return logs


def _logs_of_another_session(store: EventStore, session_id: str, path: str) -> bool:
    """True when ``path`` is the log folder a fork inherited from its parent (a fork writes its own)."""
    if fork_origin(store.session_info(session_id))[0] is None:
        return False
    own = re.escape(slug(session_id, 120))
    return re.fullmatch(rf"{own}(-\d+)?", Path(path).name) is None
