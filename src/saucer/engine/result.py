"""How a session ended: :class:`SessionStatus` and :class:`SessionResult` (what ``Session.run`` returns)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from saucer.engine.accounting import CostSummary
from saucer.engine.evaluation import Evaluation

__all__ = ["SessionStatus", "SessionResult", "stored_cost"]


class SessionStatus:
    """How a session ended (``session_status`` in the last event's meta)."""

    RUNNING = "running"
    FINISHED = "finished"  # every round finished and no work is left
    FAILED = "failed"  # a round failed (an agent gave up, a command failed in follower mode)
    ERROR = "error"  # an exception: a crashed step, a bad graph, a missing LLM agent...
    STOPPED = "stopped"  # a limit (max_step, max_round) cut it short with work left; resume continues it
    CANCELLED = "cancelled"  # a person cancelled it (saucer cancel, the viewer, the service's API)
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
    #: Settings that were on but could not apply (or experience not saved) -> why, as its end event says.
    skipped: dict[str, str] = field(default_factory=dict)
    #: The session's end is in its store (committed by this run, or found there when it started).
    end_recorded: bool = False

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
            "skipped": dict(self.skipped),
        }


def stored_cost(meta: Mapping[str, Any], round_cost: Mapping[int, float | None] | None = None) -> CostSummary:
    """The cost summary a session's end event stored; its rounds' costs from ``round_cost``
    (the Context's ``ROUND_COST`` at that event) unless the event holds them (saucer before 2026-11-27)."""
    data = meta.get("cost_summary") or {}
    stored = data.get("per_round")
    return CostSummary(
        steps=data.get("steps", 0.0),
        evaluation=data.get("evaluation", 0.0),
        experience=data.get("experience", 0.0),
        per_round=(
            {int(k): v for k, v in stored.items()} if stored is not None else dict(round_cost or {})
        ),  # None: unknown
        unknown=bool(data.get("unknown")),
    )
