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
import select
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import procrastinate
import psycopg
import psycopg_pool
from procrastinate import job_context, jobs
from procrastinate.manager import JobManager
from procrastinate.retry import BaseRetryStrategy, RetryDecision

from saucer.config import SettingsModel
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
        settings: SettingsModel,
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

    def _settings(self, args: dict[str, Any]) -> SettingsModel:
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

    def _fresh(self, args: dict[str, Any]) -> Session:
        """The job's session as a new one (its run creates it, or finds it exists: :meth:`_existing`)."""
        return Session(
            args["task"],
            mode=args["mode"],
            settings=self._settings(args),
            store=self.store,
            session_id=args["session_id"],
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

    def _existing(self, args: dict[str, Any]) -> Session | None:
        """The job's session exists: it continues (:meth:`_resume`), unless it is only the record of a
        failure before it started, which is deleted (None: start it afresh). Reads the store: run in a thread."""
        sid = args["session_id"]
        info = self.store.row(sid)
        if info is None:
            return None  # deleted meanwhile
        if info.version == 0 and info.meta.get(_QUEUE_ERROR):
            self.store.delete_session(sid)  # only the record of a failure before it started: start it afresh
            return None
        return self._resume(sid, args)

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
        """Run or continue the job's session to its end (see the module docs).

        A job is most often new: its session is created at once (with its lease, one transaction on
        PostgreSQL), and only when that finds it exists is it read (in a thread) and continued."""
        if args.get("workspace"):
            Path(args["workspace"]).mkdir(parents=True, exist_ok=True)
        try:
            session: Session | None = self._fresh(args)
            for _ in range(3):  # a record of a failure deleted, then made again by another worker: read again
                try:
                    if session is None:
                        session = self._fresh(args)
                    if not session.resumed:
                        try:
                            await self.factory.check_plans([session])
                        except PlanError as exc:
                            raise SessionJobFailed(f"session {args['session_id']!r}: {exc}") from None
                    result = await session.run()
                    break
                except SessionExistsError:  # made by an earlier run of this job, or by another runner
                    session = await asyncio.to_thread(self._existing, args)
            else:
                raise SessionJobFailed(f"session {args['session_id']!r}: made and deleted again and again meanwhile")
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
        return out  # a reason left by an earlier attempt is cleared as the job ends (_SharedJobManager.finish_job)

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


#: procrastinate's ``finish_job`` for a job that succeeded, clearing the reason of an earlier failed attempt.
_SUCCEED_JOB = (
    "WITH cleared AS (UPDATE saucer_jobs SET reason = NULL WHERE job_id = %(job_id)s AND reason IS NOT NULL) "
    "SELECT procrastinate_finish_job_v1(%(job_id)s, %(status)s, %(delete_job)s)"
)


#: :data:`_SUCCEED_JOB` and procrastinate's ``fetch_job`` for the slot it frees, in ONE statement (one round
#: trip, one commit): the fetch's argument names the finish's row, so the finish runs first.
_SUCCEED_AND_FETCH = (
    "WITH cleared AS (UPDATE saucer_jobs SET reason = NULL WHERE job_id = %(job_id)s AND reason IS NOT NULL), "
    "finished AS (SELECT count(*)::bigint AS n FROM (SELECT procrastinate_finish_job_v1(%(job_id)s, %(status)s, "
    "%(delete_job)s)) AS f) "
    "SELECT id, status, task_name, priority, lock, queueing_lock, args, scheduled_at, queue_name, attempts, worker_id "
    "FROM finished, LATERAL procrastinate_fetch_job_v2(%(queues)s::varchar[], %(worker_id)s + 0 * finished.n)"
)


#: Jobs taken as others ended and never started, back on the queue as they were (their attempts not counted),
#: announced as new jobs are (procrastinate's channels), so that a waiting worker takes them at once.
_HAND_BACK = (
    "WITH back AS (UPDATE procrastinate_jobs SET status = 'todo', worker_id = NULL "
    "WHERE id = ANY(%(ids)s::bigint[]) AND status = 'doing' RETURNING id, queue_name), "
    "said AS (SELECT id, queue_name, json_build_object('type', 'job_inserted', 'job_id', id)::text AS payload FROM back) "
    "SELECT pg_notify('procrastinate_queue_v1#' || queue_name, payload), pg_notify('procrastinate_any_queue_v1', payload) "
    "FROM said"
)


#: procrastinate's heartbeat, which also registers again a worker pruned meanwhile (see ``update_heartbeat``).
_HEARTBEAT = (
    "INSERT INTO procrastinate_workers (id, last_heartbeat) OVERRIDING SYSTEM VALUE VALUES (%(worker_id)s, now()) "
    "ON CONFLICT (id) DO UPDATE SET last_heartbeat = now()"
)


#: The fields of procrastinate's job (an attrs class).
_JOB_FIELDS = tuple(field.name for field in jobs.Job.__attrs_attrs__)


class _Job(jobs.Job):
    """procrastinate's job, its log context made once: the worker builds it for each of its four log
    lines per job (started, outcome...), a deep copy of the arguments (a whole plan) each time."""

    def log_context(self) -> dict[str, Any]:
        made = self.__dict__.get("_log_context")  # (frozen: kept as a cached_property keeps its value)
        if made is None:
            made = self.__dict__["_log_context"] = super().log_context()
        return cast("dict[str, Any]", made)

    @classmethod
    def of(cls, job: Any) -> _Job | None:
        """``job`` (procrastinate's, or None) as a :class:`_Job`."""
        if job is None or isinstance(job, cls):
            return job
        return cls(**{name: getattr(job, name) for name in _JOB_FIELDS})


class _SharedJobManager(JobManager):
    """Ends a job only if it is still this worker's to end; takes the next job as it ends one.

    A live worker that misses its heartbeats (a loaded machine) has its jobs put back on the
    queue by another one (:func:`~saucer.queue.worker.recover_stalled`), and that one may end the
    job first. procrastinate then refuses this worker's outcome, and the refusal would stop the
    whole worker: it is logged instead, and the job stays as the other worker left it (the
    session's lease kept the two runs from committing the same step).

    While the worker is taking jobs (its last fetch found one), a job that succeeds is ended in the
    same statement that takes the next one for the slot it frees (:data:`_SUCCEED_AND_FETCH`): that
    job waits here for the worker's next fetch, which the worker is woken for. Once a fetch finds
    nothing (the worker waits, or stops ``until_idle``) jobs are ended alone again; a job still
    waiting here when the worker stops goes back to the queue (:meth:`unregister_worker`); one whose
    worker was killed is recovered as any of its running jobs (:func:`~saucer.queue.worker.recover_stalled`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._taking: tuple[Any, int] | None = None  # (queues, worker id) while the last fetch found a job
        self._taken: list[Any] = []  # jobs taken as others ended, for the next fetches
        self._wake: Callable[..., Any] | None = None  # the worker's notification callback

    async def listen_for_jobs(self, *, on_notification: Any, queues: Any = None) -> None:
        self._wake = on_notification
        await super().listen_for_jobs(on_notification=on_notification, queues=queues)

    async def update_heartbeat(self, worker_id: int) -> None:
        # A worker taken for dead (its heartbeats late, on a loaded machine) that is alive after all is
        # registered again under its id, or its next fetch would fail and stop it.
        await self.connector.execute_query_async(query=_HEARTBEAT, worker_id=worker_id)

    async def fetch_job(self, queues: Any, worker_id: int) -> Any:
        if self._taken:
            return self._taken.pop(0)
        job = await self._fetch(queues, worker_id)
        if job is None and self._taken:  # one was taken as another ended, while this fetch found nothing
            return self._taken.pop(0)
        self._taking = None if job is None else (queues, worker_id)
        return job

    async def _fetch(self, queues: Any, worker_id: int) -> Any:
        try:
            return _Job.of(await super().fetch_job(queues=queues, worker_id=worker_id))
        except procrastinate.exceptions.ConnectorException as exc:
            if not isinstance(exc.__cause__, psycopg.errors.ForeignKeyViolation):
                raise
        _log.warning("worker %s was taken for dead (late heartbeats): registered again", worker_id)
        await self.update_heartbeat(worker_id)
        return _Job.of(await super().fetch_job(queues=queues, worker_id=worker_id))

    async def finish_job(self, job: Any, status: Any, delete_job: bool) -> None:
        try:
            if status == jobs.Status.SUCCEEDED:
                if not await self._succeed_and_fetch(job, status, delete_job):
                    # One statement: the job ends, and the reason an earlier attempt left goes with it.
                    await self.connector.execute_query_async(
                        query=_SUCCEED_JOB, job_id=job.id, status=status.value, delete_job=delete_job
                    )
            else:
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

    async def _succeed_and_fetch(self, job: Any, status: Any, delete_job: bool) -> bool:
        """End ``job`` and take the next one in one statement, while the worker is taking jobs; whether it
        was ended here (False: nothing was done, the caller ends it alone and says why it could not be)."""
        taking, wake = self._taking, self._wake
        if taking is None or wake is None:
            return False
        try:
            row = await self.connector.execute_query_one_async(
                query=_SUCCEED_AND_FETCH,
                job_id=job.id,
                status=status.value,
                delete_job=delete_job,
                queues=taking[0],
                worker_id=taking[1],
            )
        except procrastinate.exceptions.ConnectorException:
            return False  # rolled back whole (the job taken over, the worker pruned): ended alone
        if row["id"] is None:
            self._taking = None
            return True
        self._taken.append(_Job.from_row(row))
        await wake(channel="saucer", notification={"type": "job_inserted"})  # a waiting worker fetches it
        return True

    async def unregister_worker(self, worker_id: int) -> None:
        taken, self._taken, self._taking = self._taken, [], None
        if taken:  # taken as another ended, never started here: back to the queue, not counted as an attempt
            with contextlib.suppress(procrastinate.exceptions.ConnectorException):
                await self.connector.execute_query_async(query=_HAND_BACK, ids=[job.id for job in taken])
        await super().unregister_worker(worker_id)

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


async def _closed_by_server(conn: psycopg.AsyncConnection[Any]) -> None:
    """The pool's check of a connection it hands out: raises if the server closed it meanwhile.

    procrastinate's own check pings every connection it takes (a round trip per query); an idle
    connection has nothing to read unless the server said goodbye, so only then is it pinged."""
    if select.select([conn.fileno()], [], [], 0)[0]:
        await conn.execute("")


async def _autocommit(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.set_autocommit(True)


def _pool_checked_quietly(**kwargs: Any) -> psycopg_pool.AsyncConnectionPool:
    """procrastinate's pool, its check (:func:`_closed_by_server`) without a round trip per query, and its
    connections in autocommit: each of procrastinate's queries is one statement (a function call), which
    otherwise waits for a second round trip, the COMMIT the pool sends when the connection goes back."""
    kwargs["check"] = _closed_by_server
    kwargs["configure"] = _autocommit
    return psycopg_pool.AsyncConnectionPool(**kwargs)


def make_app(location: QueueLocation, *, pool_size: int = 4) -> procrastinate.App:
    """A procrastinate app on the queue's schema, with the session task registered."""
    connector = procrastinate.PsycopgConnector(
        conninfo=location.conninfo,
        kwargs=location.connect_kwargs(),
        min_size=1,
        max_size=max(2, pool_size),
        pool_factory=_pool_checked_quietly,
    )
    app = procrastinate.App(connector=connector)
    app.job_manager = _SharedJobManager(connector=connector)
    app.task(name=TASK_NAME, pass_context=True, retry=_BackToQueue())(_session_job)
    return app
