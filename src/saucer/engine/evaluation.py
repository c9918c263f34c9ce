"""Evaluation of rounds and sessions (``system.eva_round`` / ``system.eva_session``).

An :class:`Evaluator` is anything with ``async evaluate(context, *, scope, round_id)``
returning an :class:`Evaluation`. The engine writes each verdict to
``evaluation.log``, adds its cost to ``SESSION_COST`` and to the cost
summary's ``evaluation`` part. Which evaluator judges is a setting
(``agents.evaluator``, :mod:`saucer.engine.components`): by default
``saucer.agents.evaluator.RuleEvaluator``, which judges from command results
without a model; the LLM judge lives in ``saucer.agents.llm``.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from saucer.engine.conformance import conforms

if TYPE_CHECKING:
    from saucer.context import Context

__all__ = ["Evaluation", "Evaluator", "Scope", "judge", "evaluator_name"]

Scope = Literal["round", "session"]


class Evaluation(BaseModel):
    """A verdict: is the task (of a round, or of the whole session) complete?"""

    model_config = ConfigDict(extra="forbid")

    scope: Scope = "session"
    round: int | None = None
    complete: Literal["yes", "no", "unsure"] = "unsure"
    reason: str = ""
    sub_scores: dict[str, Any] = Field({})
    cost: float | None = 0.0
    evaluator: str = ""


@runtime_checkable
class Evaluator(Protocol):
    """Judges a round or a session from its Context."""

    async def evaluate(self, context: Context, *, scope: Scope, round_id: int | None = None) -> Evaluation:
        """The verdict for ``scope`` (``round_id`` is the round's id for ``round``)."""
        ...


@runtime_checkable
class _Named(Protocol):
    name: str


def evaluator_name(evaluator: object) -> str:
    """The evaluator's ``name`` when it has one, else its class name (what its verdicts and commits say)."""
    name = evaluator.name if conforms(evaluator, _Named) else None
    return name if isinstance(name, str) and name else type(evaluator).__name__


async def judge(evaluator: Any, context: Context, scope: Scope, round_id: int | None) -> Evaluation:
    """``evaluator``'s verdict, named after it and its round filled in; an evaluator that fails
    (or answers something that is not a verdict) gives an ``unsure`` verdict saying so, never a crash."""
    name = evaluator_name(evaluator)
    try:
        verdict = evaluator.evaluate(context, scope=scope, round_id=round_id)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        if not isinstance(verdict, Evaluation):
            verdict = Evaluation.model_validate(verdict)
    except (asyncio.CancelledError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - a failed evaluation is a verdict, not a crash
        verdict = Evaluation(
            scope=scope, round=round_id, complete="unsure", reason=f"the evaluator failed: {type(exc).__name__}: {exc}"
        )
    if not verdict.evaluator:
        verdict = verdict.model_copy(update={"evaluator": name})
    if verdict.round is None and round_id is not None:
        verdict = verdict.model_copy(update={"round": round_id})
    return verdict
