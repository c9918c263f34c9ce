"""The server's sessions: created, run on their device, resumed after a restart, cancelled, looked up.

:class:`SessionManager` owns the running sessions of one server and records
everything in the session record store (:mod:`saucer.service.records`); each
session's task runs through a :class:`~saucer.service.runner.TaskRunner` with
a :class:`~saucer.dispatch.websocket.WebSocketCommandDispatcher` to its
device. :class:`ServiceState` is everything the app serves from.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from saucer.dispatch.messages import Command, Result
from saucer.dispatch.toolcheck import command_problem
from saucer.dispatch.websocket import DeviceUnavailable, WebSocketCommandDispatcher
from saucer.engine.cancel import CancelError, request_cancel
from saucer.service.auth import TokenAuthenticator
from saucer.service.device_api import unknown_device_message
from saucer.service.hub import Connection, DeviceHub
from saucer.service.protocol import ErrorCode, ProtocolError, TaskEndFrame, TaskSpec, now
from saucer.service.records import SessionRecord, SessionRecordStore, SessionStatus, StepRecord, apply_changes
from saucer.service.runner import RunnerHooks, StoreSessionRecorder, TaskOutcome, TaskRunner
from saucer.service.settings import ServiceConfig

__all__ = ["ServiceSession", "SessionManager", "ServiceState", "sees_session"]

_log = logging.getLogger("saucer.service.server")


def sees_session(record: SessionRecord, principal: str, admins: Iterable[str]) -> bool:
    """Whether ``principal`` sees the session (lists it, reads it, cancels it through the API, finds it in
    the viewer): its owner, a service admin, or a participant its task names. The one rule of
    ``GET /api/sessions``, ``GET /api/sessions/{id}`` and the viewer's listing."""
    return record.owner == principal or principal in admins or principal in record.task.participants


class ServiceSession:
    """A running (or waiting) session: its latest record, its task, and who to tell when it ends."""

    def __init__(self, record: SessionRecord, submitter: Connection | None = None) -> None:
        self.record = record
        self.submitter = submitter
        self.task: asyncio.Task[None] | None = None
        self.done = asyncio.Event()
        self.cancel_requested = False
        #: Who cancelled it (a principal), said by its end.
        self.cancelled_by = ""
        self.dispatcher: WebSocketCommandDispatcher | None = None
        #: Its record says ``running``, attempt 1, from its creation on (:meth:`SessionManager.submit`
        #: starts it at once): its first run has no record to write before it starts.
        self.recorded_running = False
        #: Once it has ended: its committed steps, when its only run was here and so committed every one
        #: (None: read them from the store). What a long-poll answers without a read.
        self.final_steps: list[StepRecord] | None = None
        #: The write of its record when it was submitted here (its runner starts meanwhile).
        self.created: asyncio.Future[None] | None = None

    @property
    def session_id(self) -> str:
        """The session's id."""
        return self.record.session_id


class SessionManager:
    """Creates, runs, resumes, cancels and looks up sessions; records everything in the store."""

    def __init__(self, store: SessionRecordStore, hub: DeviceHub, runner: TaskRunner, config: ServiceConfig) -> None:
        self.store = store
        self.hub = hub
        self.runner = runner
        #: The runner's optional hooks, found once here (saucer.service.runner.RunnerHooks).
        self.hooks = RunnerHooks.of(runner)
        self.config = config
        self._active: dict[str, ServiceSession] = {}
        self._closing = False
        hub.on_device_online(self._device_online)

    async def rehydrate(self) -> int:
        """Load every session that had not ended; each resumes when its device registers, or at once when
        the runner's log holds its end (:meth:`~saucer.service.runner.EndRecordingRunner.has_ended`)."""
        records = await self.store.list_sessions(active_only=True)
        for record in records:
            record = await self.store.update_session(record.session_id, status=SessionStatus.WAITING_DEVICE)
            session = self._active[record.session_id] = ServiceSession(record)
            if self.hooks.has_ended is not None and await self.hooks.has_ended(record.session_id):
                # Its end is in the runner's log but its end record was lost (a crash, a power cut: the
                # record did not wait for the disk); its run only reports that end: no device is needed.
                self._start(session)
        if records:
            _log.info("rehydrated %d unfinished sessions; they resume when their devices reconnect", len(records))
        return len(records)

    async def submit(
        self, owner: str, device_id: str, task: TaskSpec, submitter: Connection | None = None
    ) -> SessionRecord:
        """Start ``task`` on ``device_id`` for ``owner``; raise :class:`ProtocolError` if it cannot start."""
        if self._closing:
            raise ProtocolError(ErrorCode.SHUTTING_DOWN, "the server is shutting down; submit again after it restarts")
        if self.hooks.validate is not None:
            try:
                self.hooks.validate(task)
            except ValueError as exc:
                raise ProtocolError(ErrorCode.INVALID_TASK, str(exc)) from None
        device = self.hub.visible(device_id, owner)
        if device is None:
            raise ProtocolError(ErrorCode.UNKNOWN_DEVICE, unknown_device_message(device_id))
        if not device.online:
            raise ProtocolError(ErrorCode.DEVICE_OFFLINE, f"device {device_id!r} is offline: {device.offline_reason}")
        problem = _tool_problem(task, device.info.get("tools"))
        if problem is not None:
            raise ProtocolError(ErrorCode.INVALID_TASK, f"{problem} (tools of device {device_id!r})")
        task = task.submitted_by(owner)
        # Created running, its first attempt counted: it starts now (one durable write, not two).
        record = SessionRecord(
            session_id=uuid.uuid4().hex,
            owner=owner,
            device_id=device_id,
            task=task,
            status=SessionStatus.RUNNING,
            attempts=1,
        )
        session = ServiceSession(record, submitter)
        session.recorded_running = True
        # The record's write (and its fsync) and the runner's start (the engine's session in its own store)
        # run at once; no command reaches the device before the record is durable (_RecordedFirst), and the
        # caller hears of the session only then.
        created = session.created = asyncio.ensure_future(self.store.create_session(record))
        self._active[record.session_id] = session
        self._start(session)
        try:
            await created
        except BaseException:
            # Not recorded: it must not run (what its runner has made meanwhile is never resumed).
            self._active.pop(record.session_id, None)
            created.cancel()
            if session.task is not None:
                session.task.cancel()
            raise
        return record

    async def lookup(self, session_id: str, principal: str) -> SessionRecord | None:
        """The session if ``principal`` sees it (:func:`sees_session`); None otherwise (whether or not it exists)."""
        session = self._active.get(session_id)
        record = session.record if session is not None else await self.store.get_session(session_id)
        if record is None or not sees_session(record, principal, self.config.admins):
            return None
        return record

    async def visible(self, principal: str) -> list[SessionRecord]:
        """The sessions ``principal`` sees (:func:`sees_session`), oldest first: ``GET /api/sessions`` and ``/ui``."""
        return [r for r in await self.store.list_sessions() if sees_session(r, principal, self.config.admins)]

    async def wait(self, session_id: str, timeout: float) -> SessionRecord | None:
        """Wait up to ``timeout`` seconds for an active session to end; its final record if it ended meanwhile
        (None: it is still running, or was not active here)."""
        ended = await self.wait_ended(session_id, timeout)
        return ended.record if ended is not None else None

    async def wait_ended(self, session_id: str, timeout: float) -> ServiceSession | None:
        """As :meth:`wait`, the ended session itself: its final record and, when known here, its
        :attr:`~ServiceSession.final_steps`."""
        session = self._active.get(session_id)
        if session is None or timeout <= 0:
            return None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(session.done.wait(), timeout)
        return session if session.done.is_set() else None

    async def cancel(self, session_id: str, principal: str, reason: str = "") -> SessionRecord | None:
        """Cancel a session ``principal`` sees; return its record (unchanged if it had already ended).

        The caller decides who may cancel (the API: whoever sees the session; the viewer: whoever may act on
        it). The cancel is recorded with ``principal`` as its author: a ``cancel_request`` event in the
        runner's event log (:func:`saucer.engine.cancel.request_cancel`, as ``saucer cancel`` writes it) and
        the end's error, ``cancelled by PRINCIPAL``."""
        session = self._active.get(session_id)
        if session is None:
            return await self.store.get_session(session_id)
        why = f"cancelled by {principal}" + (f": {reason}" if reason else "")
        if not session.cancel_requested:
            session.cancel_requested, session.cancelled_by = True, why
            await self._record_cancel(session_id, principal, reason)
        if session.dispatcher is not None:
            # The runner unwinds only after the device has stopped the batch in flight (or is gone).
            session.dispatcher.cancel_reason = session.cancelled_by
        if session.task is not None and not session.task.done():
            session.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(session.done.wait())
        elif not session.done.is_set():
            await self._finish(session, TaskOutcome(status="cancelled", error=session.cancelled_by))
        return session.record

    async def _record_cancel(self, session_id: str, principal: str, reason: str) -> None:
        """The cancel in the runner's event log, authored by the principal (a runner without one: nothing)."""
        events = self.hooks.store
        if events is None or not await asyncio.to_thread(events.exists, session_id):
            return
        try:
            await asyncio.to_thread(request_cancel, events, session_id, author=principal, reason=reason)
        except CancelError as exc:  # not running there (waiting for its device): its end says who cancelled
            _log.info("session %s: the cancel is not in its event log: %s", session_id, exc)

    def begin_shutdown(self) -> None:
        """Stop every runner now, before connections close, so no session ends because of the shutdown.

        Their records stay active (``running``) and resume after the restart;
        new submissions are refused from here on.
        """
        self._closing = True
        for session in self._active.values():
            if session.task is not None and not session.task.done():
                session.task.cancel()

    async def close(self) -> None:
        """Stop running sessions without ending them and wait for their runners to unwind."""
        self.begin_shutdown()
        tasks = [s.task for s in self._active.values() if s.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    def _start(self, session: ServiceSession) -> None:
        if self._closing:
            return
        if session.task is None or session.task.done():
            session.task = asyncio.create_task(self._run(session), name=f"session-{session.session_id}")

    async def _device_online(self, device_id: str) -> None:
        for session in list(self._active.values()):
            if session.record.device_id == device_id and session.record.status == SessionStatus.WAITING_DEVICE:
                self._start(session)

    async def _run(self, session: ServiceSession) -> None:
        sid = session.session_id
        # Just submitted (its record made running by submit): no step, no earlier run to look for.
        recorder = StoreSessionRecorder(self.store, sid, fresh=session.recorded_running)
        if session.recorded_running:
            session.recorded_running = False  # a later run (after a reconnect) is counted as usual
        else:
            await self._record_attempt(session, recorder)
        dispatcher = _RecordedFirst(
            session.created,
            self.hub,
            session.record.device_id,
            sid,
            reconnect_grace=self.config.reconnect_grace,
            default_timeout=self.config.step_timeout,
            cancel_timeout=self.config.cancel_timeout,
        )
        session.dispatcher = dispatcher
        try:
            outcome = await self.runner.run(sid, session.record.task, dispatcher, recorder)
        except asyncio.CancelledError:
            if not session.cancel_requested:
                raise  # server shutdown: the record stays "running" and resumes after restart
            note = f"; {dispatcher.cancel_outcome}" if dispatcher.cancel_outcome else ""
            outcome = TaskOutcome(status="cancelled", error=f"{session.cancelled_by}{note}")
        except Exception as exc:
            _log.exception("runner failed for session %s", sid)
            outcome = TaskOutcome(status="failed", error=f"runner error: {type(exc).__name__}: {exc}")
        await self._finish(session, outcome, recorder.known_steps())

    async def _record_attempt(self, session: ServiceSession, recorder: StoreSessionRecorder) -> None:
        """Before a run: its record says ``running``, one attempt more, and where a resumed one resumes."""
        sid = session.session_id
        resumed_from: int | None = None
        if session.record.attempts > 0:
            if self.hooks.sync_steps is not None:
                # The runner's own log may be ahead of the step records (a crash between the two).
                try:
                    await self.hooks.sync_steps(sid, recorder)
                except Exception:
                    _log.exception("could not bring the step records of session %s up to date", sid)
            resumed_from = len(await self.store.steps(sid))
        session.record = await self.store.update_session(
            sid,
            status=SessionStatus.RUNNING,
            attempts=session.record.attempts + 1,
            resumed_from_step=resumed_from if resumed_from is not None else session.record.resumed_from_step,
        )

    async def _finish(
        self, session: ServiceSession, outcome: TaskOutcome, steps: list[StepRecord] | None = None
    ) -> None:
        results = outcome.results
        if outcome.status == "cancelled" and not results:
            results = [s.model_dump(mode="json") for s in await self.store.steps(session.session_id)]
        in_log = False  # the end is durable in the runner's log: the record need not wait for the disk
        if self.hooks.record_end is not None:
            # The runner's log first (it is what a resume reads), then the record.
            try:
                in_log = await self.hooks.record_end(session.session_id, outcome)
            except Exception:
                _log.exception("could not record the end of session %s in the runner's store", session.session_id)
        changes: dict[str, Any] = {
            "status": SessionStatus(outcome.status),
            "error": outcome.error,
            "results": results,
            "updated_at": now(),
        }
        written: asyncio.Task[SessionRecord] | None = None
        if in_log:
            # The end is durable in the runner's log, and the record a projection of it: the waiters hear of
            # the end now, with the record the write stores (made here, from the same changes), while the
            # write runs. It is queued before they wake, so whatever they read next is read after it.
            written = asyncio.ensure_future(self.store.update_session(session.session_id, derived=True, **changes))
            session.record = apply_changes(session.record, changes)
        else:
            session.record = await self.store.update_session(session.session_id, **changes)
        self._active.pop(session.session_id, None)
        session.final_steps = steps
        session.done.set()
        submitter = session.submitter
        if submitter is not None and not submitter.closed:
            frame = TaskEndFrame(
                session_id=session.session_id, status=outcome.status, results=results, error=outcome.error
            )
            with contextlib.suppress(DeviceUnavailable):
                await submitter.send(frame)
        if written is not None:
            try:
                session.record = await written
            except Exception:  # the runner's log holds the end: a restart finishes the session again (rehydrate)
                _log.exception("could not record the end of session %s", session.session_id)


class _RecordedFirst(WebSocketCommandDispatcher):
    """The session's dispatcher: it sends nothing before the session's record is durable (``created``)."""

    def __init__(self, created: asyncio.Future[None] | None, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._created = created

    async def execute_commands(
        self, commands: Sequence[Command], timeout: float | None = None, *, approved: Collection[str] = ()
    ) -> list[Result]:
        """As :meth:`WebSocketCommandDispatcher.execute_commands`, once the record is written."""
        if self._created is not None:
            await asyncio.shield(self._created)  # its failure fails the batch (and submit stops the session)
            self._created = None
        return await super().execute_commands(commands, timeout, approved=approved)


@dataclass
class ServiceState:
    """Everything the app serves from; reachable as ``app.state.service``."""

    config: ServiceConfig
    store: SessionRecordStore
    hub: DeviceHub
    sessions: SessionManager
    auth: TokenAuthenticator


def _tool_problem(task: TaskSpec, tools: Any) -> str | None:
    """The first command of ``task`` the device's tools cannot run, or None (also when it sent no tool list)."""
    if not isinstance(tools, dict):
        return None
    for i, step in enumerate(task.steps):
        for j, command in enumerate(step.commands):
            problem = command_problem(command.tool_name, command.parameters, tools)
            if problem is not None:
                return f"task.steps.{i}.commands.{j}: {problem}"
    return None
