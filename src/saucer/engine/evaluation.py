"""Evaluation of rounds and sessions (``system.eva_round`` / ``system.eva_session``).

An :class:`Evaluator` is anything with ``async evaluate(context, *, scope, round_id)``
returning an :class:`Evaluation`. The engine writes each verdict to
``evaluation.log``, adds its cost to ``SESSION_COST`` and to the cost
summary's ``evaluation`` part. ``saucer.agents.evaluator.RuleEvaluator`` judges
from command results without a model; the LLM judge lives in ``saucer.agents.llm``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from saucer.context import Context

__all__ = ["Evaluation", "Evaluator", "Scope"]

Scope = Literal["round", "session"]


class Evaluation(BaseModel):
    """A verdict: is the task (of a round, or of the whole session) complete?"""

    model_config = ConfigDict(extra="forbid")

    scope: Scope = "session"
    round: int | None = None
    complete: Literal["yes", "no", "unsure"] = "unsure"
    reason: str = ""
    sub_scores: dict[str, Any] = Field(default_factory=dict)
    cost: float | None = 0.0
    evaluator: str = ""


@runtime_checkable
class Evaluator(Protocol):
    """Judges a round or a session from its Context."""

    async def evaluate(self, context: "Context", *, scope: Scope, round_id: int | None = None) -> Evaluation:
        """The verdict for ``scope`` (``round_id`` is the round's id for ``round``)."""
        ...
