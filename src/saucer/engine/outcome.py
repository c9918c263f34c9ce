"""How a session ends: evaluation, status, experience, ``output.md`` and its one :class:`SessionResult`.

:class:`OutcomeRecorder` is the session's collaborator that judges
(``system.eva_round``, ``system.eva_session``), decides the status (error,
stopped, failed, finished), saves the experience
(:mod:`saucer.engine.experience`), commits the session's end and builds its
:class:`~saucer.engine.result.SessionResult`, in one place
(:meth:`OutcomeRecorder.result`). It owns the session's verdicts and its
evaluator; what it reads of the session is the :class:`OutcomeHost` protocol.
It returns results and never calls the session's hooks or observers: the
session does, with what it gets back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from saucer.context import ContextNames
from saucer.engine import experience
from saucer.engine.accounting import CostSummary
from saucer.engine.components import new_evaluator
from saucer.engine.defaults import NO_TERMINAL, say_once
from saucer.engine.errors import EngineError, LeaseLostError
from saucer.engine.evaluation import Evaluation, Scope, evaluator_name, judge
from saucer.engine.experience import RunRounds
from saucer.engine.logs import EvaluationLogEntry, StepRecord
from saucer.engine.result import SessionResult, SessionStatus, stored_cost
from saucer.engine.round import RoundResult, RoundStatus
from saucer.engine.summaries import summary_of
from saucer.engine.uitree import replayable
from saucer.store import LeaseHeldError, StoreError

if TYPE_CHECKING:
    from saucer.config import SettingsModel
    from saucer.context import Context
    from saucer.engine.cursor import Progress
    from saucer.engine.interactor import UserChannel
    from saucer.engine.logs import SessionLogs
    from saucer.engine.meta import CursorMeta, EvaluationMeta, RoundEndMeta, SessionEndMeta, SessionSummary
    from saucer.engine.plan import Plan
    from saucer.store import EventStore

__all__ = ["OutcomeHost", "OutcomeRecorder", "ExperienceSaver"]

_log = logging.getLogger("saucer.engine")

ExperienceSaver = Callable[[Any, "Plan", Any], Any]
"""``saver(session, plan, path)``: saves a session's experience plan its own way (its cost, or a path and cost)."""


class OutcomeHost(Protocol):
    """What the outcome recorder reads of its session (:class:`~saucer.engine.session.Session`)."""

    work_done: bool
    """The agenda has no more work: a cancel that came after it does not make the session cancelled."""

    def cancelled_by(self) -> tuple[str, str] | None:
        """``(who cancelled this run, what its end says)``, or None."""
        ...

    @property
    def session_id(self) -> str: ...
    @property
    def task(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def settings(self) -> SettingsModel: ...
    @property
    def store(self) -> EventStore | None: ...
    @property
    def context(self) -> Context: ...
    @property
    def logs(self) -> SessionLogs: ...
    @property
    def progress(self) -> Progress: ...
    @property
    def session_step(self) -> int: ...
    @property
    def skipped(self) -> dict[str, str]:
        """Settings that are on but cannot apply to this session -> why (the recorder adds to it)."""
        ...

    @property
    def save_experience(self) -> str | None: ...
    @property
    def user_channel(self) -> UserChannel: ...

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
        """The resume cursor a commit of this session carries."""
        ...


class OutcomeRecorder:
    """Judges a session and records its end (see the module docs)."""

    def __init__(
        self,
        host: OutcomeHost,
        *,
        evaluator: Any = None,
        fallback_evaluator: Callable[[], Any] | None = None,
        experience_saver: ExperienceSaver | None = None,
    ) -> None:
        self._host = host
        #: The evaluator given to the session; else the agents' (``fallback_evaluator()``), else ``agents.evaluator``.
        self.evaluator = evaluator
        self._fallback = fallback_evaluator
        #: Saves the experience plan its own way (``saver(session, plan, path)``), when given.
        self.experience_saver = experience_saver
        #: The verdicts of this run, in order (listed by the session's end).
        self.evaluations: list[Evaluation] = []
        #: (request, successful commands) per round of this run: the experience's source when nothing
        #: is committed per step (durability ``exit``).
        self._run_rounds: RunRounds = []
        #: A step of this run ran a command successfully: the experience plan has a step.
        self._succeeded = False

    def resolve_evaluator(self) -> Any:
        """The session's evaluator, made from ``agents.evaluator`` when none was given (once)."""
        if self.evaluator is not None:
            return self.evaluator
        found = self._fallback() if self._fallback is not None else None
        if found is not None:
            return found
        self.evaluator = new_evaluator(self._host.settings)
        return self.evaluator

    async def judge(self, scope: Scope, round_id: int | None) -> Evaluation:
        """The evaluator's verdict, logged, charged and kept for the session's end (not committed)."""
        host = self._host
        verdict = await judge(self.resolve_evaluator(), host.context, scope, round_id)
        cost = verdict.cost
        if cost is None:
            host.progress.unknown_cost = True
        elif cost:
            host.progress.eval_cost += cost
            host.context.incr(ContextNames.SESSION_COST, cost)
        self.evaluations.append(verdict)
        host.logs.write_evaluation(EvaluationLogEntry(**verdict.model_dump(), timestamp=time.time()))
        return verdict

    async def evaluate(self, scope: Scope, round_id: int | None, plan_index: int | None = None) -> Evaluation:
        """Judge (:meth:`judge`) and commit the verdict, with the cursor past it."""
        host = self._host
        verdict = await self.judge(scope, round_id)
        phase = "round_end" if scope == "round" else "session_eval"
        meta: EvaluationMeta = {
            "kind": "evaluation",
            "scope": scope,
            "verdict": verdict.model_dump(mode="json"),
            "cost": verdict.cost,
            "session_status": SessionStatus.RUNNING,
            "cursor": host.cursor(phase, round_id if scope == "round" else None, plan_index, evaluated=True),
        }
        await host.context.acommit_step(
            author=f"evaluator:{evaluator_name(self.resolve_evaluator())}",
            round=round_id,
            meta=dict(meta),
            summary=summary_of(meta),
            defer=True,  # written with the next commit: the next round's start, or the session's end
        )
        return verdict

    # =============================================================== rounds

    def round_opened(self, request: str) -> None:
        """A round's start is committed (kept for the experience when steps are not committed one by one)."""
        if self._host.context.durability == "exit":
            self._run_rounds.append((request, []))

    def step_done(self, record: StepRecord) -> None:
        """A step that did not fail is committed: its successful commands are the experience's."""
        if not self._succeeded and record.commands:
            self._succeeded = any(r.get("status") == "success" for r in record.results[: len(record.commands)])
        if self._run_rounds and record.commands:
            done = self._run_rounds[-1][1]
            for i, command in enumerate(record.commands):
                if i < len(record.results) and record.results[i].get("status") == "success":
                    done.append(replayable(command, record.results[i]))

    async def round_ended(self, round_id: int, plan_index: int | None, result: RoundResult) -> None:
        """Count a round that ended and commit its end (``round_end``, with its ``ROUND_RESULT``)."""
        host = self._host
        p = host.progress
        host.context.set(ContextNames.ROUND_RESULT, result.reason or result.status)
        p.rounds += 1
        if not result.ok:
            p.failed += 1
            if not p.reason:
                # The first round that did not finish says why the session did not (e.g. no_action).
                p.reason = f"round {round_id} {result.status}: {result.reason}" if result.reason else ""
        evaluate = host.settings.system.eva_round
        meta: RoundEndMeta = {
            "kind": "round_end",
            "round_status": result.status,
            "reason": result.reason,
            "error": result.error,
            "steps": result.steps,
            "cost": result.cost,
            "session_status": SessionStatus.RUNNING,
            "cursor": host.cursor("round_end", round_id, plan_index, evaluated=not evaluate),
        }
        # Written with the next commit (its evaluation, the next round's start or the session's end).
        await host.context.acommit_step(
            author="system", round=round_id, meta=dict(meta), summary=summary_of(meta), defer=True
        )

    def ends_session(self, round_id: int, result: RoundResult, *, stop_on_failure: bool) -> bool:
        """Whether how round ``round_id`` ended ends the session (an error, a limit, a failure with
        ``stop_on_failure``), noted in its progress."""
        p = self._host.progress
        if result.status == RoundStatus.ERROR:
            p.error = result.error or result.reason
            p.reason = result.reason
            return True
        if result.status == RoundStatus.STOPPED:
            p.stopped = result.reason
            return True
        if result.status == RoundStatus.FAILED and stop_on_failure:
            p.reason = f"round {round_id} failed: {result.reason}"
            return True
        return False

    # ================================================================== end

    def status(self) -> str:
        """The session's status from its progress: error, cancelled (by a person), stopped, failed, else finished."""
        p = self._host.progress
        if p.error is not None:
            return SessionStatus.ERROR
        if self._host.cancelled_by() is not None and not self._host.work_done:
            return SessionStatus.CANCELLED
        if p.stopped is not None:
            return SessionStatus.STOPPED
        if p.failed:
            return SessionStatus.FAILED
        return SessionStatus.FINISHED

    async def finish(self, evaluated: bool) -> SessionResult:
        """The end of a session whose loop is over: its evaluation (unless ``evaluated``), experience, end."""
        status = self.status()
        cancelled = self._host.cancelled_by()
        if status == SessionStatus.CANCELLED and cancelled is not None:  # its end says who cancelled it
            self._host.progress.stopped = cancelled[1]  # (a refused approval failed its round)
        ended_early = status in (SessionStatus.ERROR, SessionStatus.CANCELLED)
        if self._host.settings.system.eva_session and not evaluated and not ended_early:
            await self.evaluate("session", None)
        experience_path = await self._save_experience(status)
        return await self.complete(status, experience_path)

    async def complete(self, status: str, experience_path: str | None, error: str | None = None) -> SessionResult:
        """Commit the session's end (``session_end``) and make its result."""
        host = self._host
        p = host.progress
        cost = self.cost_summary()
        reason = p.stopped or p.reason or (p.error or "")
        if status == SessionStatus.FINISHED and not reason:
            reason = f"{p.rounds} round(s) finished"
        summary: SessionSummary = {
            "status": status,
            "rounds": p.rounds,
            "steps": host.session_step,
            "cost": None if cost.unknown else round(cost.known, 6),
            "reason": reason,
        }
        meta: SessionEndMeta = {
            "kind": "session_end",
            "session_status": status,
            "summary": summary,
            "cost_summary": cost.to_dict(per_round=False),  # ROUND_COST holds the rounds
            "error": error or p.error,
            "experience_path": experience_path,
            "evaluations": [e.model_dump(mode="json") for e in self.evaluations],
            "cursor": host.cursor("end", None, None),
        }
        if host.skipped:
            meta["skipped"] = dict(host.skipped)
        version = await host.context.acommit(author="system", meta=dict(meta), summary=summary_of(meta))
        result = self.result(
            status,
            reason,
            error or p.error,
            version,
            cost,
            experience_path=experience_path,
            evaluations=self.evaluations,
            end_recorded=True,
        )
        if host.settings.system.log_to_markdown and host.logs.path is not None:
            title = f"{host.task} — session {host.session_id} ({host.mode})"
            experience.write_output_markdown(host.logs, host.session_id, title, dict(summary), cost)
        return result

    async def fail(self, exc: BaseException) -> SessionResult:
        """An exception outside a step: recorded as the session's end when the store still takes it."""
        host = self._host
        message = (
            str(exc) if isinstance(exc, (EngineError, LeaseHeldError, ValueError)) else f"{type(exc).__name__}: {exc}"
        )
        host.progress.error = message
        if not isinstance(exc, (StoreError, LeaseLostError)):
            try:
                if host.context.durability != "exit":
                    host.context.rollback()
                return await self.complete(SessionStatus.ERROR, None, message)
            except Exception as inner:  # noqa: BLE001
                _log.warning("session %s: could not record its error: %s", host.session_id, inner)
        return self.result(SessionStatus.ERROR, message, message, host.context.version, self.cost_summary())

    def result(
        self,
        status: str,
        reason: str,
        error: str | None,
        version: int,
        cost: CostSummary,
        *,
        rounds: int | None = None,
        steps: int | None = None,
        log_path: str | None = None,
        experience_path: str | None = None,
        evaluations: list[Evaluation] | None = None,
        skipped: dict[str, str] | None = None,
        end_recorded: bool = False,
    ) -> SessionResult:
        """The one place a :class:`SessionResult` is made: this run's counters unless told otherwise."""
        host = self._host
        if log_path is None and host.logs.path is not None:
            log_path = str(host.logs.path)
        return SessionResult(
            session_id=host.session_id,
            task=host.task,
            mode=host.mode,
            status=status,
            reason=reason,
            error=error,
            rounds=host.progress.rounds if rounds is None else rounds,
            steps=host.session_step if steps is None else steps,
            cost=cost,
            log_path=log_path,
            experience_path=experience_path,
            evaluations=list(evaluations or ()),
            version=version,
            skipped=dict(host.skipped if skipped is None else skipped),
            end_recorded=end_recorded,
        )

    def stored_result(self, meta: dict[str, Any]) -> SessionResult:
        """The result a session that already ended stored with its end."""
        ctx = self._host.context
        summary = meta.get("summary") or {}
        return self.result(
            meta.get("session_status", summary.get("status", SessionStatus.FINISHED)),
            summary.get("reason", ""),
            meta.get("error"),
            ctx.version,
            stored_cost(meta, ctx.get(ContextNames.ROUND_COST)),
            rounds=summary.get("rounds", 0),
            steps=summary.get("steps", 0),
            log_path=ctx.get(ContextNames.LOG_PATH) or None,
            experience_path=meta.get("experience_path"),
            evaluations=[Evaluation.model_validate(e) for e in meta.get("evaluations") or []],
            skipped=dict(meta.get("skipped") or {}),
            end_recorded=True,
        )

    def cost_summary(self) -> CostSummary:
        """Steps, evaluation and experience cost so far."""
        host = self._host
        ctx: Context | None = host.context
        p = host.progress
        total = ctx.get(ContextNames.SESSION_COST) if ctx is not None else 0.0
        per_round = ctx.get(ContextNames.ROUND_COST) if ctx is not None else {}
        return CostSummary(
            steps=max(0.0, total - p.eval_cost - p.exp_cost),
            evaluation=p.eval_cost,
            experience=p.exp_cost,
            per_round=dict(per_round),
            unknown=p.unknown_cost,
        )

    # ============================================================ experience

    async def _save_experience(self, status: str) -> str | None:
        host = self._host
        mode = host.save_experience or host.settings.system.save_experience
        finished = status == SessionStatus.FINISHED
        if mode == "always_not" or not finished:
            return None
        # The plan is read from the store only when it is needed: to know whether it is empty (unless a
        # command of this run succeeded: then it is not), and to save it.
        plan = None if self._succeeded else await asyncio.to_thread(self.experience_plan)  # off the event loop
        if plan is not None and not plan.steps:  # said before anyone is asked: there is nothing to save
            host.skipped["save_experience"] = experience.NOTHING_TO_SAVE
            if mode in ("ask", "always"):
                _log.warning("session %s: experience not saved: %s", host.session_id, experience.NOTHING_TO_SAVE)
            return None
        why_not = await experience.wanted(mode, finished, self.evaluations, host.user_channel)
        if why_not == NO_TERMINAL:  # the seed's "ask" could not apply
            host.skipped["save_experience"] = why_not
            say_once({"save_experience": why_not})
        if why_not is not None:
            return None
        path = experience.experience_path(host.task, host.session_id, host.settings.system.experience_dir, host.logs)
        if path is None:
            return None
        if plan is None:
            plan = await asyncio.to_thread(self.experience_plan)  # it reads the session's log: off the event loop
        saver = self.experience_saver
        save: Callable[[Plan, Any], Any] | None = None
        if saver is not None:

            def save(plan: Plan, path: Any) -> Any | Awaitable[Any]:
                return saver(host, plan, path)

        saved, cost = await experience.save_plan(plan, path, save)
        if cost is None:
            host.progress.unknown_cost = True
        elif cost:
            host.progress.exp_cost += cost
            host.context.incr(ContextNames.SESSION_COST, cost)
        return str(saved)

    def experience_plan(self) -> Plan:
        """The session's successful commands as a plan follower mode can replay."""
        host = self._host
        assert host.store is not None
        run_rounds = self._run_rounds if host.context.durability == "exit" else None  # no per-step events
        return experience.experience_plan(host.task, host.store, host.session_id, host.context.version, run_rounds)
