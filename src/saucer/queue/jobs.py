"""The one kind of job: run (or continue) one session; and the procrastinate app that carries it.

A job's arguments say which session to run and how to create it the first
time (task, mode, plan or request, workspace). The worker that takes it runs
it through the engine, under the store's lease on the session:

- a session that does not exist yet is created and run;
- one that exists is continued at its first uncommitted step
  (:meth:`Session.resume`, waiting up to ``store.lease_ttl`` for the lease of
  a runner that died to expire; a failed one has its failed step run again);
- one that already finished only reports its result.

So a job that runs twice (a worker died after the session ended but before
the job was marked done; a stalled job retried) never runs a committed step
again. Outcomes: the job *succeeds* when the session ends ``finished`` or
``stopped``, *fails* when it ends ``failed`` or ``error`` or runs past
``queue.job_timeout``, and goes *back to the queue* when its worker shuts
down (SIGTERM after ``queue.shutdown_timeout``) or another runner holds the
session's lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import procrastinate
import psycopg
from procrastinate import job_context
from procrastinate.manager import JobManager
from procrastinate.retry import BaseRetryStrategy, RetryDecision

from saucer.config import Settings
from saucer.dispatch.local import LocalCommandDispatcher
from saucer.engine.errors import PlanError
from saucer.engine.interactor import NonInteractiveInteractor
from saucer.engine.session import Session, SessionResult, SessionStatus
from saucer.engine.status import stored_status
from saucer.queue.schema import QueueLocation
from saucer.store import EventStore, LeaseHeldError, SessionExistsError

__all__ = [
    "TASK_NAME",
    "failure_reason",
    "SessionJobFailed",
    "HandedBack",
    "SessionBusy",
    "SessionRunner",
    "make_app",
]

_log = logging.getLogger("saucer.queue")

#: The procrastinate task name of a session job.
TASK_NAME = "saucer.session"
#: Seconds a job waits before its session starts, so the worker can fetch the jobs of its other slots.
_LET_THE_WORKER_FETCH = 0.02


#: The creation meta flag of a session that a job failed to start (see :meth:`SessionRunner.run_job`).
_QUEUE_ERROR = "queue_error"
#: The longest reason kept for a failed job, in characters.
_REASON_CHARS = 500


def failure_reason(exc: BaseException) -> str:
    """Why a job failed, in one line: saucer's own errors as they are, anything else with its type."""
    from saucer.engine.errors import EngineError

    text = str(exc) if isinstance(exc, (EngineError, SessionJobFailed, PlanError)) else f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 1] + "…"


class SessionJobFailed(Exception):
    """The session ended ``failed`` or ``error``, or ran past the job timeout: the job fails (``saucer queue retry`` retries it)."""


class HandedBack(Exception):
    """The worker is shutting down: the session stops where it is (its uncommitted step is dropped) and its job goes back to the queue."""


class SessionBusy(Exception):
    """Another runner holds the session's lease and renews it: the job is tried again later."""

    def __init__(self, message: str, after: float) -> None:
        super().__init__(message)
        self.after = after


class _BackToQueue(BaseRetryStrategy):
    """Only hand-backs and busy sessions are retried by the queue; a failed session waits for ``saucer queue retry``."""

    def get_retry_decision(self, *, exception: BaseException, job: Any) -> RetryDecision | None:
        if isinstance(exception, HandedBack):
            return RetryDecision(retry_in={"seconds": 0})
        if isinstance(exception, SessionBusy):
            return RetryDecision(retry_in={"seconds": max(1, int(exception.after))})
        return None


class SessionRunner:
    """Runs session jobs in a worker: one store and one way to make dispatchers and agents for all of them.

    ``dispatcher_factory(session)`` and ``agents`` default to the
    :class:`~saucer.engine.factory.SessionFactory`'s (the configured MCP
    servers; the LLM agents for requests and text steps).
    """

    def __init__(
        self,
        settings: Settings,
        store: EventStore,
        *,
        dispatcher_factory: Callable[[Session], Any] | None = None,
        agents: Any = None,
        observer: Any = None,
        workspace: str | None = None,
    ) -> None:
        from saucer.engine.factory import SessionFactory

        self.settings = settings
        self.store = store
        self.factory = SessionFactory(
            settings, store=store, agents=agents, dispatcher_factory=dispatcher_factory, workspace=workspace
        )
        self._injected_dispatcher = dispatcher_factory is not None
        self.observer = observer
        #: Results of the sessions this runner ran, newest last (for the worker's log and for tests).
        self.finished: list[SessionResult] = []

    async def cannot_run(self) -> list[str]:
        """What this worker cannot run, one sentence each, checked when it starts: requests and text
        steps without LLM settings (``[llm]``); plans whose tool servers do not start."""
        from saucer.engine.errors import LLMUnavailableError

        out: list[str] = []
        try:
            self.factory.agent_provider()
        except LLMUnavailableError as exc:
            out.append(f"requests and text steps (they will fail): {' '.join(str(exc).split())}")
        if self._injected_dispatcher:
            return out
        import tempfile
        from types import SimpleNamespace

        with tempfile.TemporaryDirectory(prefix="saucer-worker-check-") as where:
            probe = SimpleNamespace(
                workspace=where, mode="follower", task="worker-check", session_id="worker-check", interactor=None
            )
            try:
                # engine types dispatcher_factory as Callable[[Session], ...]; the factories read only the
                # probe's fields (workspace, mode, task, session_id, interactor) before a session exists.
                async with self.factory.dispatcher_factory(cast("Session", probe)) as dispatcher:
                    await dispatcher.list_tools()
                    # The default factory's dispatcher says which tool servers did not start; another has no such list.
                    errors = dict(dispatcher.server_errors) if isinstance(dispatcher, LocalCommandDispatcher) else {}
            except Exception as exc:  # noqa: BLE001  # any failure to start the tools is what the worker reports
                errors = {"tools": failure_reason(exc)}
        for name, why in errors.items():
            out.append(f"plans using tool server {name!r} (it does not start): {' '.join(str(why).split())}")
        return out

    def _agents_for(self, args: dict[str, Any]) -> Any:
        plan = args.get("plan")
        steps = (plan or {}).get("steps") or []
        text = [s for s in steps if isinstance(s, str)]
        if plan is not None and steps and not text:
            return None
        return self.factory.agent_provider()

    def _settings(self, args: dict[str, Any]) -> Settings:
        """The worker's settings with the job's own (``--max-step``... given to the enqueuer) on top."""
        overrides = {k: v for k, v in (args.get("settings") or {}).items() if v is not None}
        if not overrides:
            return self.settings
        settings = self.settings.model_copy(deep=True)
        for dotted, value in overrides.items():
            section, _, key = dotted.partition(".")
            setattr(getattr(settings, section), key, value)  # sections validate on assignment
        return settings

    def _common(self, args: dict[str, Any]) -> dict[str, Any]:
        return {
            "agents": self._agents_for(args),
            "dispatcher_factory": self.factory.dispatcher_factory,
            "interactor": NonInteractiveInteractor(assume_yes=bool(args.get("yes"))),
            "observer": self.observer,
            "lease_wait": self.settings.store.lease_ttl + 1.0,
        }

    def _session(self, args: dict[str, Any]) -> Session:
        sid = args["session_id"]
        if self.store.exists(sid):
            info = self.store.session_info(sid)
            if not (info.version == 0 and info.meta.get(_QUEUE_ERROR)):
                return self._resume(sid, args)
            self.store.delete_session(sid)  # only the record of a failure before it started: start it afresh
        return Session(
            args["task"],
            mode=args["mode"],
            settings=self._settings(args),
            store=self.store,
            session_id=sid,
            plan=args.get("plan"),
            plan_file=args.get("plan_file"),
            request=args.get("request") or "",
            ask_new_requests=False,
            workspace=args.get("workspace") or self.factory.workspace,
            context_vars=args.get("vars"),
            participants=args.get("participants"),
            user=args.get("user"),
            **self._common(args),
        )

    def _resume(self, sid: str, args: dict[str, Any]) -> Session:
        state = stored_status(self.store, sid)
        retry = state.status in (SessionStatus.FAILED, SessionStatus.ERROR)
        session = Session.resume(
            sid, store=self.store, settings=self._settings(args), retry_failed=retry, **self._common(args)
        )
        # A session whose worker died before its start was committed starts with the job's variables.
        session.context_vars = dict(args.get("vars") or {})
        return session

    async def run_session(self, args: dict[str, Any]) -> SessionResult:
        """Run or continue the job's session to its end (see the module docs)."""
        if args.get("workspace"):
            Path(args["workspace"]).mkdir(parents=True, exist_ok=True)
        session = self._session(args)
        try:
            if not session.resumed:
                try:
                    await self.factory.check_plans([session])
                except PlanError as exc:
                    raise SessionJobFailed(f"session {args['session_id']!r}: {exc}") from None
            result = await session.run()
        except SessionExistsError:  # created by another runner between the check and the create
            result = await self._resume(args["session_id"], args).run()
        except LeaseHeldError as exc:
            raise SessionBusy(
                f"session {args['session_id']!r} is being run by {exc.holder}", self.settings.store.lease_ttl
            ) from None
        self.finished.append(result)
        return result

    async def run_job(self, context: job_context.JobContext, args: dict[str, Any]) -> dict[str, Any]:
        """The body of a session job: the session under ``queue.job_timeout``, handed back on shutdown.

        A job that fails leaves its reason, one line, in the queue (``saucer queue status``) and, when
        it failed before its session existed (no ``[llm]`` for a request...), as that session's
        ``error`` status with the reason (``saucer show``)."""
        try:
            out = await self._run_job(context, args)
        except (HandedBack, SessionBusy):
            raise
        except Exception as exc:
            reason = failure_reason(exc)
            await asyncio.to_thread(self._record_session_error, args, reason)
            await self._set_reason(context, reason)
            raise
        await self._set_reason(context, None)
        return out

    async def _set_reason(self, context: job_context.JobContext, reason: str | None) -> None:
        await context.app.connector.execute_query_async(
            "UPDATE saucer_jobs SET reason = %(reason)s WHERE job_id = %(job_id)s",
            reason=reason,
            job_id=context.job.id,
        )

    def _record_session_error(self, args: dict[str, Any], reason: str) -> None:
        """A job that failed before its session was created: the session is created with status ``error``
        and the reason, and no events, so every reader of the store sees why (a retry starts it afresh)."""
        sid = args["session_id"]
        if self.store.exists(sid):
            return  # the session recorded its own end (or was taken over); its status says what happened
        meta: dict[str, Any] = {
            "task": args.get("task") or sid,
            "mode": args.get("mode") or "normal",
            "request": args.get("request") or "",
            "status": SessionStatus.ERROR,
            "summary": {"status": SessionStatus.ERROR, "rounds": 0, "steps": 0, "cost": 0.0, "reason": reason},
            "error": reason,
            _QUEUE_ERROR: True,
        }
        with contextlib.suppress(SessionExistsError):
            self.store.create_session(sid, meta=meta)

    async def _run_job(self, context: job_context.JobContext, args: dict[str, Any]) -> dict[str, Any]:
        timeout = self.settings.queue.job_timeout
        sid = args["session_id"]
        # The store's calls block the event loop while they wait for the database, and a session that
        # finds its tools at once hardly yields: let the worker fetch its next jobs first, or its slots
        # run one session at a time (and the store cannot group their commits).
        await asyncio.sleep(_LET_THE_WORKER_FETCH)
        try:
            try:
                async with asyncio.timeout(timeout):
                    result = await self.run_session(args)
            except TimeoutError:
                raise SessionJobFailed(f"session {sid!r}: stopped after queue.job_timeout ({timeout:g} s)") from None
        except asyncio.CancelledError:
            if context.abort_reason() == job_context.AbortReason.SHUTDOWN:
                raise HandedBack(f"session {sid!r}: handed back to the queue (the worker is shutting down)") from None
            raise
        if result.status in (SessionStatus.FAILED, SessionStatus.ERROR):
            raise SessionJobFailed(
                f"session {sid!r} ended {result.status}: {result.reason or result.error or ''}".rstrip(": ")
            )
        return {"session_id": sid, "status": result.status, "steps": result.steps}


async def _session_job(context: job_context.JobContext, /, **args: Any) -> dict[str, Any]:
    runner: SessionRunner | None = (context.additional_context or {}).get("runner")
    if runner is None:
        raise RuntimeError("a session job runs in saucer worker (no session runner in this worker's context)")
    return await runner.run_job(context, args)


def _taken_over(exc: BaseException) -> bool:
    """Whether ``exc`` is procrastinate's refusal to end or retry a job that is no longer running here."""
    cause = exc.__cause__
    return isinstance(cause, psycopg.errors.RaiseException) and str(cause).startswith("Job was not found or")


class _SharedJobManager(JobManager):
    """Ends a job only if it is still this worker's to end.

    A live worker that misses its heartbeats (a loaded machine) has its jobs put back on the
    queue by another one (:func:`~saucer.queue.worker.recover_stalled`), and that one may end the
    job first. procrastinate then refuses this worker's outcome, and the refusal would stop the
    whole worker: it is logged instead, and the job stays as the other worker left it (the
    session's lease kept the two runs from committing the same step).
    """

    async def finish_job(self, job: Any, status: Any, delete_job: bool) -> None:
        try:
            await super().finish_job(job=job, status=status, delete_job=delete_job)
        except procrastinate.exceptions.ConnectorException as exc:
            if not _taken_over(exc):
                raise
            _log.warning(
                "job %s (session %s): ended by another worker meanwhile; its outcome here (%s) is dropped",
                job.id,
                job.task_kwargs.get("session_id"),
                status,
            )

    async def retry_job(self, job: Any, *args: Any, **kwargs: Any) -> None:
        try:
            await super().retry_job(job, *args, **kwargs)
        except procrastinate.exceptions.ConnectorException as exc:
            if not _taken_over(exc):
                raise
            _log.warning(
                "job %s (session %s): ended by another worker meanwhile; not put back on the queue",
                job.id,
                job.task_kwargs.get("session_id"),
            )


def make_app(location: QueueLocation, *, pool_size: int = 4) -> procrastinate.App:
    """A procrastinate app on the queue's schema, with the session task registered."""
    connector = procrastinate.PsycopgConnector(
        conninfo=location.conninfo,
        kwargs=location.connect_kwargs(),
        min_size=1,
        max_size=max(2, pool_size),
    )
    app = procrastinate.App(connector=connector)
    app.job_manager = _SharedJobManager(connector=connector)
    app.task(name=TASK_NAME, pass_context=True, retry=_BackToQueue())(_session_job)
    return app
