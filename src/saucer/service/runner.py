"""What a service session runs: the :class:`TaskRunner` seam and the plain plan runner.

The server does not know how a task is carried out. For each session it calls::

    outcome = await runner.run(session_id, task, dispatcher, record)

- ``task`` is the submitted :class:`~saucer.service.protocol.TaskSpec`;
- ``dispatcher`` is a :class:`CommandDispatcher` (in service mode a
  :class:`~saucer.dispatch.websocket.WebSocketCommandDispatcher` bound to the
  session's device);
- ``record`` is a :class:`SessionRecorder`: the runner reads what was already
  committed and commits each step durably *before* moving on (a ``fresh``
  recorder's session was just submitted: nothing is committed, no earlier run
  is to be looked for);
- the returned :class:`TaskOutcome` becomes the session's final status.

After a server crash the same ``run`` is called again for every session that
had not ended, with the same ``session_id`` and ``task``; the runner must
resume from what ``record`` says is committed and never repeat a committed
step. Runners give each command a call_id that is deterministic per
(session, step, index), so a device asked again for a step that was in flight
when the server died answers from its cache instead of running it twice.

Two runners exist. The server's default is
:class:`~saucer.service.engine_runner.EngineTaskRunner`: each session is a
saucer engine Session whose Context is durable in the event store, and the
step records are a projection of it. :class:`PlanTaskRunner` (here) runs
plans given as data with the step records as its only log; it has no
Context, no LLM agents and no ``saucer show`` timeline, and is kept as the
minimal reference implementation of the seam.

Optional runner hooks, each a Protocol a runner satisfies or not, found once
when the server is built (:meth:`RunnerHooks.of`), never looked up by name at
call time: ``validate(task)`` (:class:`ValidatingRunner`: raise ValueError to
refuse a submission with 422), ``await sync_steps(session_id, record)``
(:class:`StepSyncingRunner`: before a resumed run, bring the step records up
to date with the runner's own log), ``await record_end(session_id, outcome)``
(:class:`EndRecordingRunner`: when a session ends, so the runner's log shows
ends it did not produce itself, such as a cancellation), ``await close()``
(:class:`ClosingRunner`: when the server stops) and a ``store``
(:class:`StoreBackedRunner`: the event store the web viewer and the approval
routes read).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from saucer.dispatch.messages import Command, Result, ResultStatus
from saucer.service.protocol import TaskSpec
from saucer.service.records import SessionRecordStore, StepRecord
from saucer.store import EventStore

DEFAULT_STEP_TIMEOUT = 300.0
"""Seconds a step's batch may take when neither the step nor the task says."""


class CommandDispatcher(Protocol):
    """What a runner sends commands through: a :class:`~saucer.dispatch.base.BasicCommandDispatcher` that can
    also be told which call_ids of the batch the server approved (the device runs a sensitive command only
    then; :class:`~saucer.dispatch.websocket.WebSocketCommandDispatcher`). A runner that never gates
    commands calls it without ``approved``."""

    async def execute_commands(
        self, commands: Sequence[Command], timeout: float | None = None, *, approved: Collection[str] = ()
    ) -> list[Result]:
        """Run ``commands``, the call_ids in ``approved`` marked approved; one Result per Command, in order."""
        ...


class SessionRecorder(Protocol):
    """A session's durable step log, as seen by a runner."""

    @property
    def fresh(self) -> bool:
        """The session was submitted for this run: no step is committed and no runner ran it before (a
        runner need not look for an earlier run in its own log)."""
        ...

    async def completed_steps(self) -> list[StepRecord]:
        """Steps already committed, in index order."""
        ...

    async def commit_step(self, step: StepRecord, *, derived: bool = False) -> None:
        """Durably commit one step; a repeated index is an error. ``derived``: the step is a projection
        of the runner's own durable log (:meth:`~saucer.service.records.SessionRecordStore.commit_step`)."""
        ...


class TaskOutcome(BaseModel):
    """How a task ended, what it produced and, on failure, why."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["completed", "failed", "cancelled"]
    results: list[Any] = Field(default_factory=list)
    error: str | None = None


class TaskRunner(Protocol):
    """Carries out one session's task through a dispatcher, committing steps to a recorder."""

    async def run(
        self, session_id: str, task: TaskSpec, dispatcher: CommandDispatcher, record: SessionRecorder
    ) -> TaskOutcome:
        """Run (or resume) ``task``; return its outcome. Raise only on cancellation."""
        ...


@runtime_checkable
class ValidatingRunner(Protocol):
    """A runner that can refuse a task before a session is made for it."""

    def validate(self, task: TaskSpec) -> None:
        """Raise ValueError when ``task`` cannot be run (the submission is refused with 422)."""
        ...


@runtime_checkable
class StepSyncingRunner(Protocol):
    """A runner with a log of its own, which the step records may lag behind after a crash."""

    async def sync_steps(self, session_id: str, record: SessionRecorder) -> None:
        """Commit to ``record`` the steps the runner's log has and the records lack."""
        ...


@runtime_checkable
class EndRecordingRunner(Protocol):
    """A runner whose log records a session's end, even one it did not produce (a cancellation)."""

    async def record_end(self, session_id: str, outcome: TaskOutcome) -> bool:
        """Write ``outcome`` as the session's end in the runner's log (unless it is there already); True when
        that log is durable and holds the end, so the session's end record need not wait for the disk."""
        ...

    async def has_ended(self, session_id: str) -> bool:
        """Whether the runner's log holds the session's end (a server that lost the end record with the disk's
        cache runs such a session again at once: its run only reports that end)."""
        ...


@runtime_checkable
class ClosingRunner(Protocol):
    """A runner holding resources (a store, connections) that the server closes when it stops."""

    async def close(self) -> None:
        """Release what the runner holds."""
        ...


@runtime_checkable
class StoreBackedRunner(Protocol):
    """A runner whose sessions live in an event store (read by the web viewer and the approval routes)."""

    store: Any


@dataclass(frozen=True)
class RunnerHooks:
    """The optional hooks one runner has, found once (None: the runner has no such hook)."""

    validate: Callable[[TaskSpec], None] | None = None
    sync_steps: Callable[[str, SessionRecorder], Awaitable[None]] | None = None
    record_end: Callable[[str, TaskOutcome], Awaitable[bool]] | None = None
    has_ended: Callable[[str], Awaitable[bool]] | None = None
    close: Callable[[], Awaitable[None]] | None = None
    store: EventStore | None = None

    @classmethod
    def of(cls, runner: TaskRunner) -> RunnerHooks:
        """The hooks of ``runner``, by the Protocols it satisfies (a ``store`` that is no EventStore is none)."""
        store = runner.store if isinstance(runner, StoreBackedRunner) else None
        return cls(
            validate=runner.validate if isinstance(runner, ValidatingRunner) else None,
            sync_steps=runner.sync_steps if isinstance(runner, StepSyncingRunner) else None,
            record_end=runner.record_end if isinstance(runner, EndRecordingRunner) else None,
            has_ended=runner.has_ended if isinstance(runner, EndRecordingRunner) else None,
            close=runner.close if isinstance(runner, ClosingRunner) else None,
            store=store if isinstance(store, EventStore) else None,
        )


class StoreSessionRecorder:
    """A :class:`SessionRecorder` over a :class:`~saucer.service.records.SessionRecordStore`."""

    def __init__(self, store: SessionRecordStore, session_id: str, *, fresh: bool = False) -> None:
        self._store = store
        self.session_id = session_id
        self._fresh = fresh
        #: A fresh session's steps are the ones committed through this recorder: kept, not read back.
        self._committed: list[StepRecord] | None = [] if fresh else None

    @property
    def fresh(self) -> bool:
        """Made for a session's first run, right after its submission (see :class:`SessionRecorder`)."""
        return self._fresh

    async def completed_steps(self) -> list[StepRecord]:
        """Committed steps in order."""
        if self._committed is not None:
            return list(self._committed)
        return await self._store.steps(self.session_id)

    async def commit_step(self, step: StepRecord, *, derived: bool = False) -> None:
        """Commit one step durably."""
        await self._store.commit_step(self.session_id, step, derived=derived)
        if self._committed is not None:
            self._committed.append(step)

    def known_steps(self) -> list[StepRecord] | None:
        """A fresh session's committed steps, all of them committed through this recorder (None: not known
        here, read them from the store)."""
        return list(self._committed) if self._committed is not None else None


class PlanTaskRunner:
    """Run a task given as a plan, step by step, resuming at the first uncommitted step.

    A step whose results contain a failure (or a skipped command) is committed
    as failed and ends the session as failed; the failure message names the
    step and the command's error.
    """

    def __init__(self, default_step_timeout: float = DEFAULT_STEP_TIMEOUT) -> None:
        self.default_step_timeout = default_step_timeout

    def validate(self, task: TaskSpec) -> None:
        """Raise ValueError if ``task`` cannot be run by this runner."""
        if not task.steps:
            raise ValueError("the plan runner needs a task with at least one step in 'steps'")

    async def run(
        self, session_id: str, task: TaskSpec, dispatcher: CommandDispatcher, record: SessionRecorder
    ) -> TaskOutcome:
        """Run the plan's remaining steps through ``dispatcher``."""
        self.validate(task)
        done = await record.completed_steps()
        for expected, step in enumerate(done):
            if step.index != expected:
                return TaskOutcome(
                    status="failed", error=f"step log of session {session_id} has a gap at step {expected}"
                )
        if done and done[-1].status == "failed":
            return _outcome(done)
        steps = list(done)
        for index in range(len(done), len(task.steps)):
            plan_step = task.steps[index]
            commands = [
                Command(
                    tool_name=c.tool_name,
                    parameters=c.parameters,
                    tool_type=c.tool_type,
                    call_id=step_call_id(session_id, index, position),
                )
                for position, c in enumerate(plan_step.commands)
            ]
            timeout = plan_step.timeout or task.timeout or self.default_step_timeout
            results = await dispatcher.execute_commands(commands, timeout) if commands else []
            failed = any(r.status in (ResultStatus.FAILURE, ResultStatus.SKIPPED) for r in results)
            committed = StepRecord(
                index=index, subtask=plan_step.subtask, status="failed" if failed else "completed", results=results
            )
            await record.commit_step(committed)
            steps.append(committed)
            if failed:
                break
        return _outcome(steps)


def step_call_id(session_id: str, step: int, position: int) -> str:
    """The call_id of command ``position`` of ``step``: the same on every attempt of that step."""
    return f"{session_id}.{step}.{position}"


def _outcome(steps: list[StepRecord]) -> TaskOutcome:
    results = [s.model_dump(mode="json") for s in steps]
    last = steps[-1] if steps else None
    if last is not None and last.status == "failed":
        first = next(
            (r for r in last.results if r.status != ResultStatus.SUCCESS and r.status != ResultStatus.NONE), None
        )
        cause = first.error if first is not None and first.error else "a command failed"
        label = f" ({last.subtask!r})" if last.subtask else ""
        return TaskOutcome(status="failed", results=results, error=f"step {last.index}{label} failed: {cause}")
    return TaskOutcome(status="completed", results=results)
