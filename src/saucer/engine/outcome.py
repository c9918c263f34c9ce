"""How a session ends: evaluation, status, experience, ``output.md`` and its one :class:`SessionResult`.

:class:`SessionOutcome` is the part of :class:`~saucer.engine.session.Session`
that judges (``system.eva_round``, ``system.eva_session``), decides the
status (error, stopped, failed, finished), saves the experience
(:mod:`saucer.engine.experience`), commits the session's end and builds its
:class:`~saucer.engine.result.SessionResult`, in one place (:meth:`SessionOutcome._result`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from saucer.config import Settings
from saucer.context import Context, ContextNames
from saucer.engine import experience
from saucer.engine.accounting import CostSummary
from saucer.engine.components import new_evaluator
from saucer.engine.cursor import Progress
from saucer.engine.defaults import NO_TERMINAL, say_once
from saucer.engine.errors import EngineError, LeaseLostError
from saucer.engine.evaluation import Evaluation, judge
from saucer.engine.logs import EvaluationLogEntry, SessionLogs
from saucer.engine.observer import ObserverCaller
from saucer.engine.plan import Plan
from saucer.engine.result import SessionResult, SessionStatus, stored_cost
from saucer.store import EventStore, LeaseHeldError, StoreError

if TYPE_CHECKING:
    from saucer.engine.agent import AgentSet

__all__ = ["SessionOutcome"]

_log = logging.getLogger("saucer.engine")


class SessionOutcome:
    """Evaluation and the end of a session; mixed into :class:`~saucer.engine.session.Session`."""

    # Set by Session.__init__ (and run):
    task: str
    mode: str
    session_id: str
    settings: Settings
    store: EventStore | None
    context: Context
    logs: SessionLogs
    progress: Progress
    cancelled: Callable[[], str | None]
    _finish_flag: bool
    session_step: int
    interactor: Any
    evaluator: Any
    experience_saver: Callable[..., Any] | None
    save_experience: str | None
    skipped: dict[str, str]
    result: SessionResult | None
    _phase: str
    _notify: ObserverCaller
    _end_hooks: list[Callable[..., Any]]
    _evaluations: list[Evaluation]
    _request_set: AgentSet | None
    _run_rounds: list[tuple[str, list[dict[str, Any]]]]

    if TYPE_CHECKING:  # provided by ResumableSession

        def _cursor(self, phase: str, round_id: int | None, plan_index: int | None, **extra: Any) -> dict[str, Any]: ...

    def _resolve_evaluator(self) -> Any:
        if self.evaluator is not None:
            return self.evaluator
        if self._request_set is not None and self._request_set.evaluator is not None:
            return self._request_set.evaluator
        self.evaluator = new_evaluator(self.settings)
        return self.evaluator

    async def evaluation(self, scope: str = "session", round_id: int | None = None) -> Evaluation:
        """UFO's ``Session.evaluation()``: the session's evaluator judges the session (or round
        ``round_id``) now. While the session runs the verdict is kept as ``system.eva_session``'s is
        (``evaluation.log``, its cost in ``SESSION_COST`` with the next commit, listed by the session's
        end); a session that has ended is judged on its final Context and nothing is recorded."""
        if self.result is not None or self.context is None:
            return await judge(self._resolve_evaluator(), self.context, scope, round_id)  # type: ignore[arg-type]
        return await self._judge(scope, round_id)

    async def _judge(self, scope: str, round_id: int | None) -> Evaluation:
        """The evaluator's verdict, logged, charged and kept for the session's end (not committed)."""
        verdict = await judge(self._resolve_evaluator(), self.context, scope, round_id)  # type: ignore[arg-type]
        cost = verdict.cost
        if cost is None:
            self.progress.unknown_cost = True
        elif cost:
            self.progress.eval_cost += cost
            self.context.incr(ContextNames.SESSION_COST, cost)
        self._evaluations.append(verdict)
        self.logs.write_evaluation(EvaluationLogEntry(**verdict.model_dump(), timestamp=time.time()))
        return verdict

    async def _evaluate(self, scope: str, round_id: int | None, plan_index: int | None = None) -> Evaluation:
        verdict = await self._judge(scope, round_id)
        evaluator = self._resolve_evaluator()
        name = getattr(evaluator, "name", None) or type(evaluator).__name__
        cost = verdict.cost
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
        p = self.progress
        if p.error is not None:
            return SessionStatus.ERROR
        if self.cancelled() is not None and not self._finish_flag:  # a cancel that came after the work: finished
            return SessionStatus.CANCELLED
        if p.stopped is not None:
            return SessionStatus.STOPPED
        if p.failed:
            return SessionStatus.FAILED
        return SessionStatus.FINISHED

    async def _finish(self) -> None:
        status = self._status()
        if status == SessionStatus.CANCELLED:  # its end says who cancelled (a refused approval failed its round)
            self.progress.stopped = self.cancelled()
        if (
            self.settings.system.eva_session
            and self._phase != "session_eval"
            and status not in (SessionStatus.ERROR, SessionStatus.CANCELLED)
        ):
            await self._evaluate("session", None)
        experience_path = await self._save_experience(status)
        await self._complete(status, experience_path)

    async def _complete(self, status: str, experience_path: str | None, error: str | None = None) -> None:
        p = self.progress
        cost = self.cost_summary()
        reason = p.stopped or p.reason or (p.error or "")
        if status == SessionStatus.FINISHED and not reason:
            reason = f"{p.rounds} round(s) finished"
        summary = {
            "status": status,
            "rounds": p.rounds,
            "steps": self.session_step,
            "cost": None if cost.unknown else round(cost.known, 6),
            "reason": reason,
        }
        meta = {
            "kind": "session_end",
            "session_status": status,
            "summary": summary,
            "cost_summary": cost.to_dict(per_round=False),  # ROUND_COST holds the rounds
            "error": error or p.error,
            "experience_path": experience_path,
            "evaluations": [e.model_dump(mode="json") for e in self._evaluations],
            "cursor": self._cursor("end", None, None),
        }
        if self.skipped:
            meta["skipped"] = dict(self.skipped)
        version = await self.context.acommit(author="system", meta=meta)
        self.result = self._result(
            status,
            reason,
            error or p.error,
            version,
            cost,
            experience_path=experience_path,
            evaluations=self._evaluations,
        )
        if self.settings.system.log_to_markdown and self.logs.path is not None:
            title = f"{self.task} — session {self.session_id} ({self.mode})"
            experience.write_output_markdown(self.logs, self.session_id, title, summary, cost)
        await self._ended()

    async def _fail(self, exc: BaseException) -> None:
        """An exception outside a step: record it as the session's end when the store still takes it."""
        message = (
            str(exc) if isinstance(exc, (EngineError, LeaseHeldError, ValueError)) else f"{type(exc).__name__}: {exc}"
        )
        self.progress.error = message
        if not isinstance(exc, (StoreError, LeaseLostError)):
            try:
                if self.context.durability != "exit":
                    self.context.rollback()
                await self._complete(SessionStatus.ERROR, None, message)
                return
            except Exception as inner:  # noqa: BLE001
                _log.warning("session %s: could not record its error: %s", self.session_id, inner)
        self.result = self._result(SessionStatus.ERROR, message, message, self.context.version, self.cost_summary())
        await self._ended()

    async def _ended(self) -> None:
        assert self.result is not None
        for hook in self._end_hooks:
            hook(self, self.result)
        await self._notify("on_session_end", self, self.result)

    def _result(
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
    ) -> SessionResult:
        """The one place a :class:`SessionResult` is made: this run's counters unless told otherwise."""
        if log_path is None and self.logs.path is not None:
            log_path = str(self.logs.path)
        return SessionResult(
            session_id=self.session_id,
            task=self.task,
            mode=self.mode,
            status=status,
            reason=reason,
            error=error,
            rounds=self.progress.rounds if rounds is None else rounds,
            steps=self.session_step if steps is None else steps,
            cost=cost,
            log_path=log_path,
            experience_path=experience_path,
            evaluations=list(evaluations or ()),
            version=version,
            skipped=dict(self.skipped if skipped is None else skipped),
        )

    def _stored_result(self, meta: dict[str, Any]) -> SessionResult:
        """The result a session that already ended stored with its end."""
        summary = meta.get("summary") or {}
        return self._result(
            meta.get("session_status", summary.get("status", SessionStatus.FINISHED)),
            summary.get("reason", ""),
            meta.get("error"),
            self.context.version,
            stored_cost(meta, self.context.get(ContextNames.ROUND_COST)),
            rounds=summary.get("rounds", 0),
            steps=summary.get("steps", 0),
            log_path=self.context.get(ContextNames.LOG_PATH) or None,
            experience_path=meta.get("experience_path"),
            evaluations=[Evaluation.model_validate(e) for e in meta.get("evaluations") or []],
            skipped=dict(meta.get("skipped") or {}),
        )

    def cost_summary(self) -> CostSummary:
        """Steps, evaluation and experience cost so far."""
        ctx = self.context
        p = self.progress
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
        mode = self.save_experience or self.settings.system.save_experience
        finished = status == SessionStatus.FINISHED
        if mode == "always_not" or not finished:
            return None
        plan = self.experience_plan()
        if not plan.steps:  # said before anyone is asked: there is nothing to save
            self.skipped["save_experience"] = experience.NOTHING_TO_SAVE
            if mode in ("ask", "always"):
                _log.warning("session %s: experience not saved: %s", self.session_id, experience.NOTHING_TO_SAVE)
            return None
        why_not = await experience.wanted(mode, finished, self._evaluations, self.interactor)
        if why_not == NO_TERMINAL:  # the seed's "ask" could not apply
            self.skipped["save_experience"] = why_not
            say_once({"save_experience": why_not})
        if why_not is not None:
            return None
        path = experience.experience_path(self.task, self.session_id, self.settings.system.experience_dir, self.logs)
        if path is None:
            return None
        saver = self.experience_saver
        path, cost = await experience.save_plan(
            plan, path, None if saver is None else (lambda plan, path: saver(self, plan, path))
        )
        if cost is None:
            self.progress.unknown_cost = True
        elif cost:
            self.progress.exp_cost += cost
            self.context.incr(ContextNames.SESSION_COST, cost)
        return str(path)

    def experience_plan(self) -> Plan:
        """This session's successful commands as a plan follower mode can replay."""
        assert self.store is not None
        run_rounds = self._run_rounds if self.context.durability == "exit" else None  # no per-step events
        return experience.experience_plan(self.task, self.store, self.session_id, self.context.version, run_rounds)
