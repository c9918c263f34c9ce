"""Where a stored session continues: the engine cursors in its log.

Every commit the engine makes carries a *cursor* in its event ``meta``
(phase, round, plan step, the agent and state that act next, and the
session's counters). A resume continues after the newest one. Two kinds of
resume start from an older cursor instead, without rewriting anything:

- continuing a session that a limit **stopped** (``max_step``, ``max_round``)
  starts from the cursor before its end, and re-enters the round the limit
  cut short;
- retrying a **failed** session (``resume --retry-failed``) starts from the
  cursor before its failed step, so that step runs again; the failed attempt
  stays in the log.

A cursor is a typed record, :class:`ResumePoint`: where (phase, round, plan
step, agent, state) and the session's :class:`Progress` (its counters and
verdict so far). It is stored as a small dict in the event's meta, counters at
zero left out since it rides on every step's event. Its format has a version
(``v``); version 1, the first, is written without it, so every cursor stored
so far is version 1. A cursor of a newer version than this saucer knows is an
:class:`~saucer.engine.errors.EngineError`, never a guess.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from saucer.engine.accounting import Limits
from saucer.engine.errors import EngineError
from saucer.engine.step_format import upcast_step
from saucer.store import Event, EventStore, SessionInfo

if TYPE_CHECKING:
    from saucer.engine.meta import CursorMeta

__all__ = [
    "CURSOR_VERSION",
    "Progress",
    "ResumePoint",
    "Cursor",
    "cursor_meta",
    "last_cursor",
    "continue_cursor",
    "retry_cursor",
    "fork_origin",
    "stored_session_brief",
    "stored_session_meta",
]

CURSOR_VERSION = 1
"""The format of the cursors this saucer writes (and the newest it reads)."""


@dataclass(slots=True)
class Progress:
    """A session's counters and verdict so far: what every cursor carries besides its position."""

    rounds: int = 0
    failed: int = 0
    requests: int = 0
    eval_cost: float = 0.0
    exp_cost: float = 0.0
    unknown_cost: bool = False
    error: str | None = None
    stopped: str | None = None
    reason: str = ""


@dataclass(slots=True)
class ResumePoint:
    """Where a stored session continues, and its progress there (see the module docs)."""

    phase: str
    round: int | None = None
    plan_index: int | None = None
    agent: str | None = None
    state: str | None = None
    progress: Progress = field(default_factory=Progress)
    #: Where the limits count from, when a stopped session was continued (steps, rounds).
    limit_base: tuple[int, int] | None = None
    #: For a round's end: whether its evaluation is committed (None: not said).
    evaluated: bool | None = None
    version: int = CURSOR_VERSION

    @classmethod
    def from_meta(cls, data: Mapping[str, Any]) -> ResumePoint:
        """Read a stored cursor (any version up to :data:`CURSOR_VERSION`)."""
        version = data.get("v", 1)
        if not isinstance(version, int) or version < 1 or version > CURSOR_VERSION:
            raise EngineError(
                f"the session's resume cursor has format version {version!r}; this saucer reads up to "
                f"{CURSOR_VERSION}: resume it with the saucer that wrote it"
            )
        base = data.get("limit_base")
        evaluated = data.get("evaluated")
        return cls(
            phase=data.get("phase") or "start",
            round=_int_or_none(data.get("round")),
            plan_index=_int_or_none(data.get("plan_index")),
            agent=data.get("agent"),
            state=data.get("state"),
            progress=Progress(
                rounds=int(data.get("rounds") or 0),
                failed=int(data.get("failed") or 0),
                requests=int(data.get("requests") or 0),
                eval_cost=float(data.get("eval_cost") or 0.0),
                exp_cost=float(data.get("exp_cost") or 0.0),
                unknown_cost=bool(data.get("unknown_cost")),
                error=data.get("error"),
                stopped=data.get("stopped"),
                reason=data.get("reason") or "",
            ),
            limit_base=(int(base.get("steps") or 0), int(base.get("rounds") or 0)) if isinstance(base, dict) else None,
            evaluated=evaluated if isinstance(evaluated, bool) else None,
            version=version,
        )

    def to_meta(self) -> CursorMeta:
        """The stored form (what :func:`cursor_meta` writes)."""
        limits = Limits(step_base=self.limit_base[0], round_base=self.limit_base[1]) if self.limit_base else Limits()
        return cursor_meta(
            self.phase,
            self.round,
            self.plan_index,
            self.agent,
            self.state,
            self.progress,
            limits,
            evaluated=self.evaluated,
        )


def cursor_meta(
    phase: str,
    round_id: int | None,
    plan_index: int | None,
    agent: str | None,
    state: str | None,
    progress: Progress,
    limits: Limits,
    *,
    evaluated: bool | None = None,
) -> CursorMeta:
    """A cursor as stored in an event's meta: position, non-zero counters, the limits' base
    (and, for a round's end, whether its evaluation is committed)."""
    cursor: CursorMeta = {
        "phase": phase,
        "round": round_id,
        "plan_index": plan_index,
        "agent": agent,
        "state": state,
    }
    if CURSOR_VERSION != 1:  # version 1 is the one stored without "v"
        cursor["v"] = CURSOR_VERSION
    # Counters at zero are left out (the cursor rides on every step's event).
    if progress.rounds:
        cursor["rounds"] = progress.rounds
    if progress.failed:
        cursor["failed"] = progress.failed
    if progress.requests:
        cursor["requests"] = progress.requests
    if progress.eval_cost:
        cursor["eval_cost"] = progress.eval_cost
    if progress.exp_cost:
        cursor["exp_cost"] = progress.exp_cost
    if progress.unknown_cost:
        cursor["unknown_cost"] = True
    if progress.error is not None or progress.stopped is not None or progress.reason:
        cursor["error"] = progress.error
        cursor["stopped"] = progress.stopped
        cursor["reason"] = progress.reason
    if limits.step_base or limits.round_base:
        cursor["limit_base"] = {"steps": limits.step_base, "rounds": limits.round_base}
    if evaluated is not None:
        cursor["evaluated"] = evaluated
    return cursor


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


Cursor = tuple[ResumePoint | None, dict[str, Any]]
"""A cursor and the meta of the event that carries it (``(None, {})``: none)."""

_FAILED_STATES = frozenset({"FAIL", "ERROR"})


def _backwards(store: EventStore, session_id: str, chunk: int = 16) -> Iterator[Event]:
    """The session's events (its lineage, for forks), newest first: the newest alone (the engine's
    every commit carries a cursor, and an event may hold megabytes of ops), then a few at a time."""
    version, size = store.head(session_id), 1
    while version > 0:
        low = max(0, version - size)
        yield from reversed(list(store.read(session_id, low, version)))
        version, size = low, chunk


def _cursor_of(event: Event) -> ResumePoint | None:
    cursor = event.meta.get("cursor")
    return ResumePoint.from_meta(cursor) if isinstance(cursor, dict) else None


def last_cursor(store: EventStore, session_id: str) -> Cursor:
    """The newest engine cursor of the session and its event's meta."""
    for event in _backwards(store, session_id):
        cursor = _cursor_of(event)
        if cursor is not None:
            return cursor, event.meta
    return None, {}


def continue_cursor(store: EventStore, session_id: str) -> Cursor:
    """Where a stopped session continues: the cursor before its end.

    The end, session evaluations and the end of a round that the limit cut
    short (with that round's evaluation) are passed over, so the cut round
    resumes at its next step.
    """
    cut_round: Any = object()
    for event in _backwards(store, session_id):
        cursor = _cursor_of(event)
        if cursor is None:
            continue
        kind = event.meta.get("kind")
        if kind == "session_end" or (kind == "evaluation" and event.meta.get("scope") == "session"):
            continue
        if kind == "round_end" and event.meta.get("round_status") == "stopped":
            cut_round = event.round
            continue
        if kind == "evaluation" and event.round == cut_round:
            continue
        return cursor, event.meta
    return None, {}


def _failed_step(event: Event) -> bool:
    if event.meta.get("kind") != "step":
        return False
    meta = upcast_step(event.meta, f"session {event.session_id!r}: the step at version {event.version}")
    if meta.get("error") or meta.get("status") in _FAILED_STATES:
        return True
    return any(r.get("status") not in ("success", None) for r in meta.get("results") or [])


def retry_cursor(store: EventStore, session_id: str) -> Cursor:
    """Where a failed session retries: the cursor just before its last failed step.

    :class:`EngineError` when the session has no failed step (it failed
    before running one, e.g. with no request to work on).
    """
    found = False
    for event in _backwards(store, session_id):
        if not found:
            found = _failed_step(event)
            continue
        cursor = _cursor_of(event)
        if cursor is not None:
            return cursor, event.meta
    raise EngineError(f"session {session_id!r} has no failed step to run again")


def fork_origin(info: SessionInfo) -> tuple[str | None, int | None]:
    """The session a fork branched from and where: its parent, or (once it stands alone) its meta."""
    if info.parent_id is not None:
        return info.parent_id, info.parent_version
    at = info.meta.get("at")
    return info.meta.get("forked_from"), at if isinstance(at, int) else None


def stored_session_brief(store: EventStore, session_id: str) -> tuple[dict[str, Any], str | None]:
    """The creation meta of a session (task, mode...) without its plan, looking through forks to
    the original, and the id of the session whose meta holds the plan (None: it has none).

    What :meth:`~saucer.engine.session.Session.resume` reads: a plan is read
    (``store.session_plan(holder)``) when a step of it is first needed.
    A fork's own first event may give it its own workspace (``saucer fork``); a fork never
    inherits its parent's.
    """
    info, has_plan = store.session_info_without_plan(session_id)
    workspace = None
    origin, at = fork_origin(info)
    origin_of_fork = origin
    if origin is not None and at is not None:
        first = next(iter(store.read(session_id, at, at + 1)), None)
        workspace = first.meta.get("workspace") if first is not None else None
    seen = 0
    # A fork's meta names its origin (and, since forks inherit them, its task and mode): its creation
    # meta and plan are its origin's.
    while (
        ("mode" not in info.meta or (not has_plan and "forked_from" in info.meta))
        and origin is not None
        and store.exists(origin)
        and seen < 100
    ):
        info, has_plan = store.session_info_without_plan(origin)
        origin, _ = fork_origin(info)
        seen += 1
    meta = dict(info.meta)
    if origin_of_fork is not None:
        # A fork never runs in its parent's workspace: it has its own (``saucer fork``) or none.
        meta.pop("workspace", None)
    if workspace:
        meta["workspace"] = workspace
    return meta, info.session_id if has_plan else None


def stored_session_meta(store: EventStore, session_id: str) -> dict[str, Any]:
    """The creation meta of a session (task, mode, plan...), looking through forks to the original:
    :func:`stored_session_brief` with the plan read."""
    meta, holder = stored_session_brief(store, session_id)
    if holder is not None:
        meta["plan"] = store.session_plan(holder)
    return meta
