"""Limits (``max_step``, ``max_round``) and the cost summary printed when a session ends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Limits", "CostSummary"]


@dataclass(frozen=True, slots=True)
class Limits:
    """When a session stops on its own.

    ``max_step`` caps the steps of the whole session (``SESSION_STEP``, as in
    UFO); ``max_round`` caps its rounds (None: no limit; in follower mode
    every plan step runs unless ``max_round`` is set lower).
    """

    max_step: int = 50
    max_round: int | None = None

    def step_reached(self, session_step: int) -> bool:
        return session_step >= self.max_step

    def round_reached(self, rounds: int) -> bool:
        return self.max_round is not None and rounds >= self.max_round


@dataclass(slots=True)
class CostSummary:
    """What a session cost, split into agent steps, evaluation and experience saving.

    ``unknown`` is True when some cost could not be priced (e.g. a model
    missing from the price table); ``total`` then covers only the known part.
    """

    steps: float = 0.0
    evaluation: float = 0.0
    experience: float = 0.0
    per_round: dict[int, float] = field(default_factory=dict)
    unknown: bool = False

    @property
    def total(self) -> float:
        return self.steps + self.evaluation + self.experience

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": round(self.steps, 6),
            "evaluation": round(self.evaluation, 6),
            "experience": round(self.experience, 6),
            "total": round(self.total, 6),
            "per_round": {str(k): round(v, 6) for k, v in self.per_round.items()},
            "unknown": self.unknown,
        }

    def render(self) -> str:
        """One line for the terminal."""
        text = (
            f"cost: steps ${self.steps:.4f} + evaluation ${self.evaluation:.4f} "
            f"+ experience ${self.experience:.4f} = ${self.total:.4f}"
        )
        if self.unknown:
            text += " (some costs are unknown and not included)"
        return text

    def __str__(self) -> str:
        return self.render()
