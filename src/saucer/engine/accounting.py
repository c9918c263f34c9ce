"""Limits (``max_step``, ``max_round``) and the cost summary printed when a session ends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Limits", "CostSummary"]


@dataclass(frozen=True, slots=True)
class Limits:
    """When a session stops on its own.

    ``max_step`` caps the steps of the whole session (``SESSION_STEP``, as in
    UFO); ``max_round`` caps its rounds, a plan's steps included (0 or None:
    no limit; the seed's default is 10). When a stopped
    session is continued, the limits count from where it stopped
    (``step_base``, ``round_base``).
    """

    max_step: int = 50
    max_round: int | None = None
    step_base: int = 0
    round_base: int = 0

    def step_reached(self, session_step: int) -> bool:
        return session_step - self.step_base >= self.max_step

    def round_reached(self, rounds: int) -> bool:
        if not self.max_round:
            return False
        return rounds - self.round_base >= self.max_round

    def from_here(self, session_step: int, rounds: int) -> Limits:
        """The same limits, counted from ``session_step`` steps and ``rounds`` rounds."""
        return Limits(self.max_step, self.max_round, session_step, rounds)


@dataclass(slots=True)
class CostSummary:
    """What a session cost, split into agent steps, evaluation and experience saving.

    ``unknown`` is True when some cost could not be priced (e.g. a model
    missing from the price table): the total is then unknown (``None`` in
    :meth:`to_dict`, ``unknown`` in :meth:`render`), never a number that
    looks complete; ``known`` is the part that could be priced.
    ``per_round`` holds every round that ran: 0.0 when it was free, None
    when its cost is unknown.
    """

    steps: float = 0.0
    evaluation: float = 0.0
    experience: float = 0.0
    per_round: dict[int, float | None] = field(default_factory=dict)
    unknown: bool = False

    @property
    def known(self) -> float:
        """The priced part: steps + evaluation + experience."""
        return self.steps + self.evaluation + self.experience

    @property
    def total(self) -> float | None:
        """The whole cost, or None when some of it is unknown."""
        return None if self.unknown else self.known

    def to_dict(self, *, per_round: bool = True) -> dict[str, Any]:
        """JSON data; ``per_round=False`` leaves the rounds out (a session's end event: the
        Context's ``ROUND_COST`` holds them, and a long session has thousands)."""
        out: dict[str, Any] = {
            "steps": round(self.steps, 6),
            "evaluation": round(self.evaluation, 6),
            "experience": round(self.experience, 6),
            "total": None if self.unknown else round(self.known, 6),
        }
        if per_round:
            out["per_round"] = {str(k): None if v is None else round(v, 6) for k, v in self.per_round.items()}
        out["unknown"] = self.unknown
        return out

    def render(self) -> str:
        """One line for the terminal."""
        parts = f"steps ${self.steps:.4f} + evaluation ${self.evaluation:.4f} + experience ${self.experience:.4f}"
        if self.unknown:
            return f"cost: unknown (a model without a price was used; the priced part is {parts} = ${self.known:.4f})"
        return f"cost: {parts} = ${self.known:.4f}"

    def __str__(self) -> str:
        return self.render()
