"""Evaluators that need no model.

:class:`RuleEvaluator` judges from what the steps recorded in
``STRUCTURAL_LOGS``: a round (or the whole session) is complete when it has
steps, none of its commands failed and its last step ended in ``FINISH``.
Model-based judges implement the same :class:`~saucer.engine.evaluation.Evaluator`
protocol (``saucer.agents.llm``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from saucer.context import ContextNames
from saucer.engine.evaluation import Evaluation, Scope

if TYPE_CHECKING:
    from saucer.context import Context

__all__ = ["RuleEvaluator", "BaseEvaluator"]


class BaseEvaluator:
    """Helpers for evaluators: the steps of a round or of the session."""

    name = "base"

    @staticmethod
    def entries(context: Context, round_id: int | None) -> list[dict[str, Any]]:
        logs = context.get(ContextNames.STRUCTURAL_LOGS) or {}
        rounds = [round_id] if round_id is not None else sorted(logs)
        out: list[dict[str, Any]] = []
        for r in rounds:
            for subtask in sorted(logs.get(r) or {}):
                out.extend(logs[r][subtask])
        return out

    async def evaluate(self, context: Context, *, scope: Scope, round_id: int | None = None) -> Evaluation:
        raise NotImplementedError


class RuleEvaluator(BaseEvaluator):
    """Complete when every command succeeded and each round's last step finished. Costs nothing."""

    name = "rules"

    async def evaluate(self, context: Context, *, scope: Scope, round_id: int | None = None) -> Evaluation:
        entries = self.entries(context, round_id if scope == "round" else None)
        if not entries:
            return Evaluation(
                scope=scope, round=round_id, complete="unsure", reason="no steps to judge", evaluator=self.name
            )
        failed = sum(1 for e in entries for s in (e.get("Results") or []) if s != "success")
        commands = sum(len(e.get("Results") or []) for e in entries)
        last_by_round: dict[Any, dict[str, Any]] = {}
        for e in entries:
            last_by_round[e.get("Round")] = e
        unfinished = [r for r, e in last_by_round.items() if e.get("Status") != "FINISH"]
        complete: Literal["yes", "no"] = "yes" if not failed and not unfinished else "no"
        reason = f"{commands - failed}/{commands} command(s) succeeded"
        if unfinished:
            reason += f"; round(s) {', '.join(map(str, unfinished))} did not finish"
        return Evaluation(
            scope=scope,
            round=round_id,
            complete=complete,
            reason=reason,
            sub_scores={"commands": commands, "failed": failed, "steps": len(entries)},
            cost=0.0,
            evaluator=self.name,
        )
