"""What a session leaves besides its events: the experience plan and ``output.md``.

An *experience* is a finished session's successful commands as a plan that
follower mode can replay (``system.save_experience``: always, ask, auto,
always_not). It is never saved when the session did not finish or when an
evaluation says the task is not done. ``output.md`` is the step log rendered
for reading (``system.log_to_markdown``).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from saucer.engine.accounting import CostSummary
from saucer.engine.defaults import NO_TERMINAL, can_answer
from saucer.engine.evaluation import Evaluation
from saucer.engine.interactor import UserChannel
from saucer.engine.logs import EXPERIENCE_FILE, SessionLogs, render_markdown, slug
from saucer.engine.plan import Plan, plan_from_rounds
from saucer.engine.step_format import upcast_step
from saucer.engine.uitree import replayable
from saucer.store import EventStore

__all__ = ["experience_plan", "experience_path", "wanted", "save_plan", "write_output_markdown", "NOTHING_TO_SAVE"]

#: Why a finished session leaves no experience when none of its commands succeeded (or it ran none).
NOTHING_TO_SAVE = "no commands ran successfully, nothing to save"

_log = logging.getLogger("saucer.engine")

RunRounds = list[tuple[str, list[dict[str, Any]]]]
"""(request, successful commands) per round of a run."""


def experience_plan(task: str, store: EventStore, session_id: str, version: int, run_rounds: RunRounds | None) -> Plan:
    """The session's successful commands as a plan: from its step events, or from ``run_rounds``
    when nothing was committed per step (durability ``exit``)."""
    if run_rounds is not None:
        return plan_from_rounds(task, run_rounds)
    rounds: RunRounds = []
    for event in store.read(session_id, 0, version):
        kind = event.meta.get("kind")
        if kind == "round_start":
            rounds.append((event.meta.get("request") or "", []))
        elif kind == "step" and rounds:
            step = upcast_step(event.meta, f"session {session_id!r}: the step at version {event.version}")
            results = step.get("results") or []
            for i, command in enumerate(step.get("commands") or []):
                if i < len(results) and results[i].get("status") == "success":
                    rounds[-1][1].append(replayable(command, results[i]))
    return plan_from_rounds(task, rounds)


async def wanted(mode: str, finished: bool, evaluations: Sequence[Evaluation], channel: UserChannel) -> str | None:
    """Why the experience is not saved under ``save_experience`` mode ``mode``; None: save it."""
    if mode == "always_not":
        return "system.save_experience is always_not"
    if not finished:
        return "the session did not finish"
    session_verdicts = [e for e in evaluations if e.scope == "session"]
    judged = session_verdicts[-1:] or list(evaluations)  # the session's verdict, else every round's
    if any(v.complete == "no" for v in judged):
        return "an evaluation says the task is not complete"  # never a good plan
    if mode == "auto" and session_verdicts and session_verdicts[-1].complete != "yes":
        return "auto: the evaluation does not say the task is complete"
    if mode == "ask" and not await channel.experience_asker():
        return "the user said no" if can_answer(channel) else NO_TERMINAL
    return None


def experience_path(task: str, session_id: str, experience_dir: Path | None, logs: SessionLogs) -> Path | None:
    """``experience_dir/<task>-<session>.json``, else ``experience.json`` in the log folder, else None."""
    if experience_dir is not None:
        return Path(experience_dir) / f"{slug(task)}-{slug(session_id, 120)}.json"
    if logs.path is not None:
        return logs.path / EXPERIENCE_FILE
    _log.warning("session %s: experience not saved (logs are off and system.experience_dir is not set)", session_id)
    return None


async def save_plan(plan: Plan, path: Path, saver: Callable[[Plan, Path], Any] | None) -> tuple[Path, float | None]:
    """Write ``plan`` to ``path``, or hand it to ``saver(plan, path)``; return where it went and its cost.

    A saver may return ``(path, cost)`` (cost None: unknown); anything else means ``path`` at no cost.
    """
    if saver is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(plan.model_dump_json(indent=2, exclude_defaults=True) + "\n", encoding="utf-8")
        return path, 0.0
    out = saver(plan, path)
    if inspect.isawaitable(out):
        out = await out
    if isinstance(out, tuple):
        return Path(out[0]), out[1]
    return path, 0.0


def write_output_markdown(
    logs: SessionLogs, session_id: str, title: str, summary: dict[str, Any], cost: CostSummary
) -> None:
    """Render the step log to ``output.md`` (a warning, never an error, when the log cannot be read)."""
    if logs.path is None:
        return
    try:
        records = logs.step_records()
    except (OSError, ValueError) as exc:
        _log.warning("session %s: output.md skipped: %s", session_id, exc)
        return
    logs.write_markdown(render_markdown(title, records, {**summary, "cost": cost.render().removeprefix("cost: ")}))
