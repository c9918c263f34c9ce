"""The server's default runner: each service session is a saucer engine :class:`~saucer.engine.session.Session`.

::

    runner = EngineTaskRunner(settings, owner=server_identity(state_dir))
    app = create_app(config, runner=runner)

What runs. A task with ``steps`` becomes a plan whose command steps run as in
follower mode (one round, one committed step per plan step), through the
session's remote dispatcher (a
:class:`~saucer.dispatch.websocket.WebSocketCommandDispatcher` bound to the
device). A task without steps is a request for the LLM agents
(``saucer.agents.llm``, configured by ``[llm]``); when they are not available
or not configured the session ends as failed with the
:class:`~saucer.engine.errors.LLMUnavailableError` message saying what to set,
recorded in the event store like any other end.

Where things live.

- The **event store** (``settings.store.url``: SQLite, PostgreSQL or memory)
  holds each session's Context and its whole history under the service
  session id. It is the source of truth for what was executed: ``saucer show
  SESSION --store URL`` prints the timeline, and resume reads its cursor.
- The **session records** (:mod:`saucer.service.records`, one SQLite file in
  the state dir) stay the server's index: owner, device, submitted task,
  status, attempts and outcome, plus a *projection* of the committed steps
  (one :class:`~saucer.service.records.StepRecord` per engine step, written
  right after the step's event commits) so the HTTP API can list steps
  without reading the event log. If the server dies between an event and its
  projection, :meth:`EngineTaskRunner.sync_steps` rebuilds the missing
  records from the events before the session resumes; so a projection does
  not wait for the disk (``derived``): the next durable record written makes
  it durable. Nor does a session's end record once the event store holds the
  end (:meth:`EngineTaskRunner.record_end` says so): a server that lost it
  runs the session again at once when it starts (``has_ended``), and that
  run only reports the end the event store has.

Resume. After a crash or a graceful stop, the server calls :meth:`run` again
with the same session id: when the event store has the session it is
continued with :meth:`Session.resume`, which starts right after the last
committed step, so a committed step is never executed again. The one step
that was in flight is asked of the device again with the *same* call_ids:
this runner's dispatcher gives every command a call_id that depends only on
(session, round, position) for plan steps (``<session>.<step>.<position>``,
the round of a plan session is its plan step) and on (session, round, step,
batch, position) for LLM steps. The device keeps a cache of recent batches
keyed by their commands, so it answers such a repeat from its cache (or joins
the still running execution) instead of running it twice.

Leases. Every engine run holds the store's lease on its session. The lease
owner is the server's identity (:func:`server_identity`: a name kept in the
state dir), so a restarted server takes its sessions back at once instead of
waiting for the dead process's leases to expire, while another server on the
same store (another state dir) is still fenced off.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from saucer.config import SettingsModel, load_settings
from saucer.context import Context, ContextNames
from saucer.dispatch.messages import Command, Result, ResultStatus
from saucer.engine.errors import EngineError
from saucer.engine.factory import SessionFactory
from saucer.engine.logs import StepRecord as EngineStepRecord
from saucer.engine.plan import Plan, PlanCommand, PlanStep, initial_vars
from saucer.engine.session import Session, SessionResult
from saucer.engine.step_format import upcast_step
from saucer.engine.summaries import summary_of
from saucer.service.approvals import ApprovalGate, listed_reason
from saucer.service.hub import DeviceState
from saucer.service.protocol import TaskSpec
from saucer.service.records import StepAlreadyCommitted, StepRecord
from saucer.service.runner import DEFAULT_STEP_TIMEOUT, CommandDispatcher, SessionRecorder, TaskOutcome, step_call_id
from saucer.store import EventStore, LeaseHeldError, StoreError, open_store

__all__ = ["EngineTaskRunner", "server_identity", "task_plan", "SERVICE_MODE"]

_log = logging.getLogger("saucer.service.engine")

SERVICE_MODE = "service"
"""The engine mode of service sessions (``MODE`` in their Context)."""

_IDENTITY_FILE = "server-id"
_FAILED_AGENT_STATUSES = frozenset({"FAIL", "ERROR"})


def server_identity(state_dir: str | Path | None) -> str:
    """The lease owner name of a server: kept in ``<state_dir>/server-id``, so a restart reuses it.

    Without a state dir the identity is new for each process (its sessions
    cannot outlive it anyway).
    """
    if state_dir is None:
        return f"saucer-serve:{uuid.uuid4().hex}"
    path = Path(state_dir) / _IDENTITY_FILE
    try:
        existing = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        existing = ""
    if existing:
        return f"saucer-serve:{existing}"
    path.parent.mkdir(parents=True, exist_ok=True)
    name = uuid.uuid4().hex
    tmp = path.with_name(f".{_IDENTITY_FILE}.{uuid.uuid4().hex}.tmp")
    # A new file (O_EXCL), never through a link planted at its name (O_NOFOLLOW).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with open(fd, "w", encoding="utf-8") as handle:
        handle.write(name + "\n")
    try:
        # link() publishes the whole file at once, and fails if another process was first: theirs wins.
        os.link(tmp, path)
    except FileExistsError:
        name = path.read_text(encoding="utf-8").strip()
    except OSError:  # a file system without hard links
        with open(path, "x", encoding="utf-8") as handle:
            handle.write(name + "\n")
    finally:
        tmp.unlink(missing_ok=True)
    return f"saucer-serve:{name}"


def task_plan(task: TaskSpec) -> Plan:
    """The engine plan of a task with steps (command steps only)."""
    return Plan(
        task=task.task,
        steps=[
            PlanStep(
                subtask=step.subtask,
                commands=[
                    PlanCommand(tool_name=c.tool_name, parameters=c.parameters, tool_type=c.tool_type)
                    for c in step.commands
                ],
            )
            for step in task.steps
        ],
    )


@runtime_checkable
class DeviceDirectory(Protocol):
    """Where a device's registration is found by its id (the server's :class:`~saucer.service.hub.DeviceHub`)."""

    def get(self, device_id: str) -> DeviceState | None:
        """The device's state, or None for an unknown id."""
        ...


@runtime_checkable
class DeviceBoundDispatcher(Protocol):
    """A dispatcher bound to one device of a directory (the service's
    :class:`~saucer.dispatch.websocket.WebSocketCommandDispatcher`)."""

    link: Any
    device_id: str


def _device_finder(dispatcher: CommandDispatcher) -> tuple[DeviceDirectory, str] | None:
    """The directory and device id ``dispatcher`` is bound to, found once (None: it is bound to none)."""
    if not isinstance(dispatcher, DeviceBoundDispatcher):
        return None
    link = dispatcher.link
    return (link, dispatcher.device_id) if isinstance(link, DeviceDirectory) else None


class _SessionDispatcher:
    """The remote dispatcher as one engine session sees it: deterministic call_ids and per-step timeouts.

    The call_ids are set on the given Command objects themselves, so the step's
    recorded commands carry the ids the device saw.
    """

    def __init__(
        self,
        inner: CommandDispatcher,
        session_id: str,
        task: TaskSpec,
        default_timeout: float,
        approval_timeout: float = 0.0,
    ) -> None:
        self.inner = inner
        #: The device directory and id the dispatcher is bound to, found once (None: a dispatcher of no device).
        self._bound = _device_finder(inner)
        self.session_id = session_id
        self.task = task
        self.default_timeout = default_timeout
        self.session: Session | None = None
        self._batches: dict[int, int] = {}
        #: Sensitive commands wait here for a person's approval before they are sent (saucer.service.approvals).
        self.gate = ApprovalGate(session_id, approval_timeout)

    async def execute_commands(self, commands: Sequence[Command], timeout: float | None = None) -> list[Result]:
        """Name the commands after their place in the session, then run them on the device."""
        commands = list(commands)
        ctx = self.session.context if self.session is not None else None
        round_id = int(ctx.get(ContextNames.CURRENT_ROUND_ID)) if ctx is not None else 0
        step = int(ctx.get(ContextNames.SESSION_STEP)) if ctx is not None else 0
        batch = self._batches.get(step, 0)
        self._batches[step] = batch + 1
        plan_step = self.task.steps[round_id] if self.task.steps and round_id < len(self.task.steps) else None
        for position, command in enumerate(commands):
            if plan_step is not None and batch == 0:
                # A plan session's round is its plan step: <session>.<step>.<position>.
                command.call_id = step_call_id(self.session_id, round_id, position)
            else:
                command.call_id = f"{self.session_id}.{round_id}.{step}.{batch}.{position}"
        if timeout is None:
            timeout = (
                (plan_step.timeout if plan_step is not None else None) or self.task.timeout or self.default_timeout
            )
        store = self.session.store if self.session is not None else None
        sendable, approved, refused = await self.gate.check(store, commands, self._device_info(), round_id)
        results = list(await self._send(commands[:sendable], timeout, approved)) if sendable else []
        if refused is not None:
            results.append(refused)
            results += [
                Result.skipped(c, "not run: an earlier command of the batch was refused")
                for c in commands[sendable + 1 :]
            ]
        return results

    async def _send(self, commands: list[Command], timeout: float, approved: list[str]) -> list[Result]:
        if approved:
            return await self.inner.execute_commands(commands, timeout, approved=approved)
        return await self.inner.execute_commands(commands, timeout)

    def _device(self) -> DeviceState | None:
        if self._bound is None:
            return None
        directory, device_id = self._bound
        return directory.get(device_id)

    async def sensitive_reason(self, command: Command) -> str | None:
        """Why ``command`` needs approval by its device's rules (None: it does not); the dispatcher
        asks for it (so an LLM agent leaves the asking to it)."""
        tools = self._device_info().get("tools")
        return listed_reason(tools, command) if isinstance(tools, dict) else None

    def _device_info(self) -> dict[str, Any]:
        """What the device registered with (its ``tools`` and whether it runs with ``assume_yes``)."""
        device = self._device()
        return device.info if device is not None else {}

    def list_tools(self) -> dict[str, Any]:
        """The tools the device listed when it registered (``info["tools"]``); what LLM agents may call."""
        tools = self._device_info().get("tools")
        return dict(tools) if isinstance(tools, dict) else {}

    def device_info(self) -> list[dict[str, Any]]:
        """The session's ``DEVICE_INFO``: what its device reported when it registered (AIP: its ``metadata``)."""
        device = self._device()
        return [device.device_info()] if device is not None else []


class _StepProjection:
    """Engine observer: after each committed step, record it in the session records (the HTTP API's step list).

    ``derived``: the event store outlives the process (not ``memory://``), so a
    record lost in a power cut is rebuilt from it (:meth:`EngineTaskRunner.sync_steps`)
    and need not wait for the disk.
    """

    def __init__(self, record: SessionRecorder, derived: bool, session_id: str = "") -> None:
        self.record = record
        self.derived = derived
        self.session_id = session_id
        #: The steps this projection committed, in order (a new session's whole step list).
        self.committed: list[StepRecord] = []
        #: The last derived projection still being written (each waits for the one before it).
        self._pending: asyncio.Task[None] | None = None

    async def on_step(self, session: Session, step: EngineStepRecord) -> None:
        projected = step_record(step.to_dict())
        if not self.derived:
            if await _project(self.record, projected, derived=False):
                self.committed.append(projected)
            return
        # A derived record need not wait for the disk, so the session need not wait for it either: the
        # engine goes on with its next commit while the records' writer writes it (:meth:`settle` waits).
        self._pending = asyncio.ensure_future(self._write(projected, self._pending))

    async def _write(self, projected: StepRecord, before: asyncio.Task[None] | None) -> None:
        if before is not None:
            await asyncio.shield(before)  # in step order
        try:
            if await _project(self.record, projected, derived=True):
                self.committed.append(projected)
        except Exception as exc:  # noqa: BLE001 - as the engine does for an observer: logged, the session goes on
            _log.warning("session %s: step %d is not in the session records: %s", self.session_id, projected.index, exc)

    async def settle(self) -> None:
        """Wait until every step handed to :meth:`on_step` is written (or has failed, logged)."""
        if self._pending is not None:
            await asyncio.shield(self._pending)


def step_record(step: dict[str, Any]) -> StepRecord:
    """The service :class:`StepRecord` of an engine step (a ``StepRecord.to_dict()`` or a step event's meta)."""
    results = [Result.model_validate(r) for r in step.get("results") or []]
    failed = str(step.get("status") or "") in _FAILED_AGENT_STATUSES or step.get("error") is not None
    return StepRecord(
        index=int(step["session_step"]) - 1,
        subtask=str(step.get("subtask") or ""),
        status="failed" if failed else "completed",
        results=results,
    )


async def _project(record: SessionRecorder, step: StepRecord, *, derived: bool) -> bool:
    """Commit ``step`` to the records; False if they had it already."""
    try:
        await record.commit_step(step, derived=derived)
    except StepAlreadyCommitted:  # sync_steps got there first
        return False
    return True


class EngineTaskRunner:
    """Runs each service session as an engine :class:`Session` over ``settings.store.url``. See the module docs.

    ``store`` (an open :class:`~saucer.store.EventStore` or a URL) overrides
    ``settings.store.url``; a store opened here is closed by :meth:`close`.
    ``agents`` overrides the LLM agent provider of requests (default: the one
    ``[llm]`` configures, see :meth:`SessionFactory.agent_provider`).
    ``owner`` is the lease owner (default: a new identity per runner; the
    server passes :func:`server_identity` of its state dir).
    ``session_logs`` says which sessions write a log folder (``settings.logs``,
    when enabled): ``True`` every one, ``False`` none, ``"auto"`` those run by
    LLM agents only. A plan session's folder would hold nothing the event store
    lacks (its steps, its verdict in the end event, ``output.md`` rendered from
    them) and costs four file creations, the largest share of the kernel's
    time per session; an LLM session's ``request.log`` (its model calls) is
    kept nowhere else.
    """

    def __init__(
        self,
        settings: SettingsModel | None = None,
        *,
        store: EventStore | str | None = None,
        agents: Any = None,
        owner: str | None = None,
        default_step_timeout: float = DEFAULT_STEP_TIMEOUT,
        lease_wait: float | None = None,
        session_logs: Literal["auto"] | bool = True,
    ) -> None:
        settings = settings if settings is not None else load_settings()
        if settings.store.durability == "exit":
            # Resume (and the step projection) need each step committed when it ends.
            _log.warning("store.durability 'exit' is not used for service sessions; they commit each step ('step')")
            settings = settings.model_copy(deep=True)
            settings.store.durability = "step"
        if session_logs is False and settings.logs.enabled:
            settings = _without_logs(settings)
        self.settings = settings
        #: The settings of plan sessions (command steps only): no log folder under ``session_logs="auto"``.
        self._plan_settings = _without_logs(settings) if session_logs == "auto" and settings.logs.enabled else settings
        spec = store if store is not None else settings.store.url
        self._owns_store = not isinstance(spec, EventStore)
        self.store: EventStore = (
            open_store(spec, encrypt=settings.store.encrypt, key_file=settings.store.key_file)
            if isinstance(spec, str)
            else spec
        )
        self.owner = owner or f"saucer-serve:{uuid.uuid4().hex}"
        self.default_step_timeout = default_step_timeout
        #: How long a resume waits for a lease held by another owner (a dead server's) to expire.
        self.lease_wait = settings.store.lease_ttl + 1.0 if lease_wait is None else lease_wait
        self._factory = SessionFactory(settings, store=self.store, agents=agents)
        #: Sessions whose last run committed their end to the event store (:meth:`record_end` skips them once).
        self._ended: set[str] = set()

    @classmethod
    def for_service(cls, state_dir: str | Path | None, store_url: str, **options: Any) -> EngineTaskRunner:
        """The runner a server builds when given none: settings from ``saucer.toml`` and ``SAUCER_*``,
        the event store at ``store_url``, session logs under ``<state_dir>/logs`` (none without a state dir;
        which sessions write them: ``session_logs`` in ``options``, default ``"auto"``)."""
        options.setdefault("session_logs", "auto")
        overrides: dict[str, Any] = {"store.url": store_url}
        if state_dir is None:
            overrides["logs.enabled"] = False
        else:
            overrides["logs.root"] = str(Path(state_dir) / "logs")
        return cls(load_settings(overrides=overrides), owner=server_identity(state_dir), **options)

    def validate(self, task: TaskSpec) -> None:
        """Raise ValueError if ``task`` cannot run: a blank task, a plan step without commands."""
        if not task.task.strip():
            raise ValueError("task.task: the task (its name, or the request when there are no steps) is blank")
        for index, step in enumerate(task.steps):
            if not step.commands:
                raise ValueError(
                    f"task.steps.{index}: a step needs at least one command "
                    "(a task without steps is a request for the LLM agent)"
                )
        try:
            initial_vars(None, task.vars)
        except TypeError as exc:  # a value that cannot be stored
            raise ValueError(f"task.vars: {exc}") from None

    async def run(
        self, session_id: str, task: TaskSpec, dispatcher: CommandDispatcher, record: SessionRecorder
    ) -> TaskOutcome:
        """Run (or resume) the session's engine Session; map its result to a :class:`TaskOutcome`."""
        try:
            self.validate(task)
        except ValueError as exc:
            return TaskOutcome(status="failed", error=str(exc))
        remote = _SessionDispatcher(
            dispatcher, session_id, task, self.default_step_timeout, approval_timeout=self.settings.approvals.timeout
        )
        options: dict[str, Any] = dict(
            settings=self._plan_settings if task.steps else self.settings,
            dispatcher=remote,
            observer=(
                projection := _StepProjection(
                    record, derived=not self.store.url.startswith("memory:"), session_id=session_id
                )
            ),
            lease_wait=self.lease_wait,
            stop_on_failure=True,
            ask_new_requests=False,
        )
        if not task.steps:
            options["agents"] = self._agent_provider
        new = False  # a new session: its records hold exactly the steps projected by this run
        try:
            # (in a thread: the loop's other sessions must not wait on the store; a fresh session is not there)
            if not record.fresh and await asyncio.to_thread(self.store.exists, session_id):
                session = Session.resume(session_id, store=self.store, **options)
            else:
                new = True
                done = await record.completed_steps()
                if done:
                    # Starting over would run committed steps again (with call_ids the device has answered).
                    return TaskOutcome(
                        status="failed",
                        results=await _dumped(record),
                        error=f"session {session_id} has {len(done)} committed step(s) but no engine session in the "
                        f"event store {self.store.url or type(self.store).__name__}; restart the server with the "
                        "store it had (--store) to resume it",
                    )
                session = Session(
                    task.task,
                    mode=SERVICE_MODE,
                    store=self.store,
                    session_id=session_id,
                    plan=task_plan(task) if task.steps else None,
                    request="" if task.steps else task.task,
                    context_vars=task.vars,
                    participants=task.participants,
                    **options,
                )
            session.owner = self.owner
            remote.session = session
            result = await session.run()
        except asyncio.CancelledError:
            raise
        except (EngineError, LeaseHeldError, StoreError, ValueError) as exc:
            await projection.settle()
            return TaskOutcome(status="failed", error=str(exc), results=await _dumped(record))
        await projection.settle()  # the step records before the session's end record
        if result.end_recorded:
            self._ended.add(session_id)  # record_end has nothing to add (it forgets the id)
        steps = list(projection.committed) if new else await record.completed_steps()
        return outcome_of(result, steps)

    def _agent_provider(self, session: Session) -> Any:
        """The LLM agents of a request, resolved when its first round starts (so a missing model ends it cleanly)."""
        provider = self._factory.agent_provider()  # LLMUnavailableError saying what to set
        if callable(provider) and not hasattr(provider, "agents"):
            return provider(session)
        return provider

    async def sync_steps(self, session_id: str, record: SessionRecorder) -> int:
        """Add to the records every step the event store committed that they miss; return how many."""
        if not await asyncio.to_thread(self.store.exists, session_id):
            return 0
        have = {s.index for s in await record.completed_steps()}
        added = 0
        for event in await asyncio.to_thread(_events_of, self.store, session_id):
            meta = event.meta
            if meta.get("kind") != "step" or not isinstance(meta.get("session_step"), int):
                continue
            if meta["session_step"] - 1 in have:
                continue
            step = upcast_step(meta, f"session {session_id!r}: the step at version {event.version}")
            await _project(record, step_record(dict(step)), derived=False)
            have.add(meta["session_step"] - 1)
            added += 1
        if added:
            _log.info("session %s: %d committed step(s) recovered from the event store", session_id, added)
        return added

    async def record_end(self, session_id: str, outcome: TaskOutcome) -> bool:
        """Make sure the event log ends with the session's end (cancellation, a runner error); True when
        it does and outlives the process (not ``memory://``).

        The engine writes the end of sessions it finishes (then nothing is read
        here); this covers the ones that end around it, so ``saucer show`` and a
        later resume see them ended. The store work runs in a thread.
        """
        durable = not self.store.url.startswith("memory:")
        if session_id in self._ended:
            self._ended.discard(session_id)
            return durable
        return await asyncio.to_thread(self._record_end, session_id, outcome) and durable

    async def has_ended(self, session_id: str) -> bool:
        """Whether the event store holds the session's end (one read of its newest event, in a thread)."""
        return await asyncio.to_thread(self._has_ended, session_id)

    def _has_ended(self, session_id: str) -> bool:
        found = self.store.session_heads([session_id])
        last = found[0].last if found else None
        return last is not None and last.meta.get("kind") == "session_end"

    def _record_end(self, session_id: str, outcome: TaskOutcome) -> bool:
        store = self.store
        found = store.session_heads([session_id])  # its row and newest event, in one read
        if not found:
            return False
        last = found[0].last
        if last is not None and last.meta.get("kind") == "session_end":
            return True
        try:
            lease = store.acquire_lease(session_id, self.owner, self.settings.store.lease_ttl)
        except LeaseHeldError as exc:
            _log.warning("session %s: its end is not recorded in the event store: %s", session_id, exc)
            return False
        try:
            ctx = Context.open(store, session_id, author="system", create=False, fence=lease.token, serialise=True)
            try:
                reason = outcome.error or outcome.status
                ctx.set(ContextNames.ROUND_RESULT, reason)
                meta = {
                    "kind": "session_end",
                    "session_status": outcome.status,
                    "summary": {
                        "status": outcome.status,
                        "reason": reason,
                        "steps": ctx.get(ContextNames.SESSION_STEP),
                    },
                    "error": outcome.error,
                    "cursor": {"phase": "end", "round": None, "plan_index": None, "agent": None, "state": None},
                }
                ctx.commit(author="system", meta=meta, summary=summary_of(meta))
            finally:
                ctx.close()
        finally:
            store.release_lease(lease)
        return True

    async def close(self) -> None:
        """Close the event store if this runner opened it."""
        if self._owns_store:
            self.store.close()
            self._owns_store = False


def _without_logs(settings: SettingsModel) -> SettingsModel:
    """``settings`` for sessions that write no log folder (so no ``output.md`` either: not a skipped setting)."""
    return settings.model_copy(
        update={
            "logs": settings.logs.model_copy(update={"enabled": False}),
            "system": settings.system.model_copy(update={"log_to_markdown": False}),
        }
    )


def _events_of(store: EventStore, session_id: str) -> list[Any]:
    return list(store.read(session_id))


async def _dumped(record: SessionRecorder) -> list[Any]:
    return [s.model_dump(mode="json") for s in await record.completed_steps()]


def outcome_of(result: SessionResult, steps: list[StepRecord]) -> TaskOutcome:
    """The service outcome of an engine result; a failure names the step and the command's error."""
    results = [s.model_dump(mode="json") for s in steps]
    status = result.status
    if status == "finished":
        return TaskOutcome(status="completed", results=results)
    if status == "cancelled":
        return TaskOutcome(status="cancelled", results=results, error=result.error or result.reason or None)
    last = steps[-1] if steps else None
    if status in ("failed", "error") and last is not None and last.status == "failed":
        first = next((r for r in last.results if r.status not in (ResultStatus.SUCCESS, ResultStatus.NONE)), None)
        cause = (first.error if first is not None and first.error else None) or result.error or result.reason
        label = f" ({last.subtask!r})" if last.subtask else ""
        return TaskOutcome(status="failed", results=results, error=f"step {last.index}{label} failed: {cause}")
    return TaskOutcome(status="failed", results=results, error=result.error or result.reason or f"session {status}")
