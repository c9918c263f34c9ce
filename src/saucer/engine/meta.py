"""The ``meta`` of the events the engine commits, written as types: one definition each.

Every commit of a session carries ``kind`` (what happened), ``session_status``
(``running`` until its end) and a resume ``cursor``
(:mod:`saucer.engine.cursor`). A step's commit carries its
:class:`~saucer.engine.logs.StepRecord` (``StepRecord.to_meta``) with these.
The store keeps these dicts as they are; readers go through
:mod:`saucer.engine.cursor`, :mod:`saucer.engine.result` and :mod:`saucer.engine.overview`.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

__all__ = [
    "CursorMeta",
    "LimitBase",
    "CreationMeta",
    "SessionStartMeta",
    "SessionResumeMeta",
    "RoundStartMeta",
    "RoundEndMeta",
    "EvaluationMeta",
    "SessionSummary",
    "SessionEndMeta",
    "StepRecordMeta",
    "StepMeta",
    "ApprovalRequestData",
    "ApprovalRequestMeta",
    "ApprovalDecisionData",
    "ApprovalDecisionMeta",
]


class LimitBase(TypedDict):
    """Where a continued session's limits count from."""

    steps: int
    rounds: int


class _CursorPosition(TypedDict):
    phase: str
    round: int | None
    plan_index: int | None
    agent: str | None
    state: str | None


class CursorMeta(_CursorPosition, total=False):
    """A resume cursor as stored: the position, then only the counters that are not zero."""

    v: int
    rounds: int
    failed: int
    requests: int
    eval_cost: float
    exp_cost: float
    unknown_cost: bool
    error: str | None
    stopped: str | None
    reason: str
    limit_base: LimitBase
    evaluated: bool


class _CreationRequired(TypedDict):
    task: str
    mode: str
    request: str
    platform: str
    status: str


class CreationMeta(_CreationRequired, total=False):
    """The meta a session is created with in the store (what a resume reads back)."""

    workspace: str
    plan: dict[str, Any]
    plan_file: str | None


class _SessionStartRequired(TypedDict):
    kind: Literal["session_start"]
    task: str
    mode: str
    owner: str
    session_status: str
    cursor: CursorMeta


class SessionStartMeta(_SessionStartRequired, total=False):
    """The first commit of a new session."""

    skipped: dict[str, str]


class _SessionResumeRequired(TypedDict):
    kind: Literal["session_resume"]
    owner: str
    session_status: str
    cursor: CursorMeta


class SessionResumeMeta(_SessionResumeRequired, total=False):
    """The first commit of a resumed run; ``continues`` says how (``stopped``, ``retry_failed``)."""

    continues: str
    skipped: dict[str, str]


class RoundStartMeta(TypedDict):
    """A round's start."""

    kind: Literal["round_start"]
    request: str
    plan_index: int | None
    session_status: str
    cursor: CursorMeta


class RoundEndMeta(TypedDict):
    """A round's end: how it ended, its steps and cost (None: unknown)."""

    kind: Literal["round_end"]
    round_status: str
    reason: str
    error: str | None
    steps: int
    cost: float | None
    session_status: str
    cursor: CursorMeta


class EvaluationMeta(TypedDict):
    """An evaluator's verdict on a round or the session."""

    kind: Literal["evaluation"]
    scope: str
    verdict: dict[str, Any]
    cost: float | None
    session_status: str
    cursor: CursorMeta


class SessionSummary(TypedDict):
    """The summary a session's end carries (and ``output.md`` shows)."""

    status: str
    rounds: int
    steps: int
    cost: float | None
    reason: str


class _StepRecordRequired(TypedDict):
    step_format: int
    round: int
    step: int
    session_step: int
    agent: str
    state: str
    status: str
    next_agent: str | None
    next_state: str | None
    subtask_index: int
    started_at: float


class StepRecordMeta(_StepRecordRequired, total=False):
    """A :class:`~saucer.engine.logs.StepRecord` in its compact stored form (``StepRecord.to_meta``):
    fields at their defaults are left out."""

    subtask: str
    plan_index: int
    commands: list[dict[str, Any]]
    results: list[dict[str, Any]]
    cost: float | None
    error: str
    extra: dict[str, Any]
    artifacts: list[dict[str, Any]]


class StepMeta(StepRecordMeta, total=False):
    """A step's commit: its record, with ``kind`` ``step``, ``session_status`` and the cursor of who acts next."""

    kind: Literal["step"]
    session_status: str
    cursor: CursorMeta
    #: What the acting agent says of its round so far (``Agent.round_result``): its end's reason if a
    #: resume finds the round ended by this step.
    round_result: str


class _ApprovalRequestRequired(TypedDict):
    action: str
    detail: str
    reason: str


class ApprovalRequestData(_ApprovalRequestRequired, total=False):
    """What a pending approval (or question, ``kind``) asks, and how long it waits (``timeout``, seconds)."""

    kind: Literal["question"]
    timeout: float


class ApprovalRequestMeta(TypedDict):
    """A pending approval or question (:mod:`saucer.engine.approvals`)."""

    kind: Literal["approval_request"]
    approval: ApprovalRequestData


class _ApprovalDecisionRequired(TypedDict):
    number: int
    status: Literal["approved", "refused", "timed_out", "answered"]


class ApprovalDecisionData(_ApprovalDecisionRequired, total=False):
    """Which approval was decided, how, and a note (a question's answer)."""

    note: str


class ApprovalDecisionMeta(TypedDict):
    """A decision on a pending approval or question."""

    kind: Literal["approval_decision"]
    approval: ApprovalDecisionData


class _SessionEndRequired(TypedDict):
    kind: Literal["session_end"]
    session_status: str
    summary: SessionSummary
    cost_summary: dict[str, Any]
    error: str | None
    experience_path: str | None
    evaluations: list[dict[str, Any]]
    cursor: CursorMeta


class SessionEndMeta(_SessionEndRequired, total=False):
    """A session's end."""

    skipped: dict[str, str]
