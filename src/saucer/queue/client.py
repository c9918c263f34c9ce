"""Putting sessions on the queue, once each.

A *job identity* is a plan's resolved path plus the SHA-256 of its content
(:class:`~saucer.engine.plan.PlanIdentity`; its session id is made from it, the
same id ``saucer run --plan DIR`` uses without a queue), or, for a request,
its generated session id. :meth:`QueueClient.enqueue` claims an identity in
``saucer_jobs`` before it defers the job:

- no row yet: ``INSERT ... ON CONFLICT DO NOTHING`` — of any number of
  concurrent enqueuers, on any hosts, exactly one inserts it and queues;
- a row whose job is queued or running, or whose session finished (or is
  being run by another process): skipped, with the reason;
- a row whose job failed, was cancelled or ended with the session stopped or
  interrupted: re-claimed with a compare-and-set on the row (its job id and
  claim time), so again only one enqueuer queues it; the worker continues
  the session (a failed step runs again);
- claims and their jobs are written in one transaction (procrastinate defers
  on the enqueuer's connection), so no claim is left without its job.

procrastinate's ``queueing_lock`` (the identity) is a second guard: it allows
one waiting job per identity.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import procrastinate
import psycopg_pool

from saucer.config import SettingsModel
from saucer.engine.plan import load_plan_folder_with_identity, plan_identity
from saucer.engine.session import SessionStatus, new_session_id
from saucer.engine.status import status_of
from saucer.queue.jobs import TASK_NAME, make_app
from saucer.queue.schema import QueueLocation, ensure_queue, queue_location
from saucer.store import EventStore, open_store

__all__ = [
    "JobSpec",
    "Enqueued",
    "QueueClient",
    "plan_jobs",
    "request_job",
    "seed_args",
    "enqueue_task",
    "ORPHAN_CLAIM_SECONDS",
    "lock_for",
]

#: A claim without a job (left by an older saucer, which wrote them in two steps) is taken over after this long.
ORPHAN_CLAIM_SECONDS = 60.0
#: Identities claimed and queued per transaction.
BATCH = 500


@dataclass(frozen=True)
class JobSpec:
    """One session to queue: its identity, session id, where it comes from, and the job's arguments."""

    key: str
    session_id: str
    kind: str  # "plan" or "request"
    source: str  # the plan file, or "request"
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class Enqueued:
    """What :meth:`QueueClient.enqueue` did with one :class:`JobSpec`."""

    spec: JobSpec
    outcome: str  # "queued", "requeued" or "skipped"
    why: str = ""
    job_id: int | None = None


def plan_jobs(
    path: str | Path,
    *,
    task: str | None = None,
    workspace: str | Path | None = None,
    yes: bool = False,
    overrides: dict[str, Any] | None = None,
    context_vars: dict[str, Any] | None = None,
    participants: list[str] | None = None,
    user: str | None = None,
) -> list[JobSpec]:
    """One job per plan of a folder (mode ``batch_normal``), or the one plan of a file (mode ``follower``).

    ``context_vars``, ``participants`` and ``user`` are what each new session starts with
    (see :class:`~saucer.engine.Session`), as :func:`seed_args` puts them in the job."""
    p = Path(path)
    if p.is_dir():
        found = load_plan_folder_with_identity(p)
        mode, default_task = "batch_normal", p.resolve().name
    else:
        from saucer.engine.plan import load_plan

        plan = load_plan(p)
        found = [(p, plan, plan_identity(p))]
        mode, default_task = "follower", plan.task
    where = str(Path(workspace).resolve()) if workspace is not None else os.getcwd()
    specs = []
    for file, plan, identity in found:
        args = {
            "session_id": identity.session_id(),
            "task": task or default_task,
            "mode": mode,
            "plan": plan.model_dump(mode="json", exclude_defaults=True),
            "plan_file": identity.path,
            "workspace": where,
            "yes": yes,
            "settings": dict(overrides or {}),
            **seed_args(context_vars, participants, user),
        }
        specs.append(JobSpec(identity.key, identity.session_id(), "plan", str(file), args))
    return specs


def request_job(
    request: str,
    *,
    task: str = "request",
    session_id: str | None = None,
    workspace: str | Path | None = None,
    yes: bool = False,
    overrides: dict[str, Any] | None = None,
    context_vars: dict[str, Any] | None = None,
    participants: list[str] | None = None,
    user: str | None = None,
) -> JobSpec:
    """A job for a request in plain language (mode ``normal``, answered by the LLM agents on the worker)."""
    sid = session_id or new_session_id(task)
    args = {
        "session_id": sid,
        "task": task,
        "mode": "normal",
        "request": request,
        "workspace": str(Path(workspace).resolve()) if workspace is not None else os.getcwd(),
        "yes": yes,
        "settings": dict(overrides or {}),
        **seed_args(context_vars, participants, user),
    }
    return JobSpec(sid, sid, "request", "request", args)


def seed_args(context_vars: dict[str, Any] | None, participants: list[str] | None, user: str | None) -> dict[str, Any]:
    """The job arguments a worker's new session starts from: ``vars`` (checked now, so a
    value that cannot be stored is refused before it is queued), ``participants``, ``user``."""
    from saucer.engine.plan import declared_participants, initial_vars

    out: dict[str, Any] = {}
    if context_vars:
        out["vars"] = initial_vars(None, context_vars)
    if participants:
        out["participants"] = declared_participants(None, participants, None)
    if user:
        out["user"] = user
    return out


def lock_for(settings: SettingsModel, queue: str, spec: JobSpec) -> str:
    """The job's procrastinate lock: one of ``queue.limits[queue]`` slots, else the session id.

    Jobs sharing a lock never run at the same time, on any worker, so N
    slots let at most N sessions of that queue run at once.
    """
    limit = settings.queue.limits.get(queue)
    if not limit:
        return f"session:{spec.session_id}"
    return f"queue:{queue}:{int(hashlib.sha256(spec.key.encode()).hexdigest()[:8], 16) % limit}"


class QueueClient:
    """The queue of the store ``settings.store.url``: enqueue, and what :mod:`saucer.queue.admin` reads.

    ``async with QueueClient(settings, store) as q: await q.enqueue(specs)``.
    :class:`~saucer.queue.schema.QueueUnavailableError` for a store that is not PostgreSQL.
    """

    def __init__(self, settings: SettingsModel, store: EventStore | None = None) -> None:
        self.settings = settings
        self.location: QueueLocation = queue_location(settings.store.url)
        self.store = store
        self.me = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.app: procrastinate.App | None = None

    async def __aenter__(self) -> QueueClient:
        await asyncio.to_thread(ensure_queue, self.location)
        self.app = make_app(self.location)
        await self.app.open_async()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.app is not None:
            await self.app.close_async()
            self.app = None

    @property
    def pool(self) -> psycopg_pool.AsyncConnectionPool:
        """The connection pool of the queue's schema."""
        assert self.app is not None, "use QueueClient in 'async with'"
        connector = self.app.connector
        assert isinstance(connector, procrastinate.PsycopgConnector), "make_app makes a PsycopgConnector"
        return connector.pool

    async def enqueue(
        self, specs: list[JobSpec], *, queue: str | None = None, priority: int | None = None
    ) -> list[Enqueued]:
        """Claim and queue each spec not already queued, running or finished; say why for the others.

        Claims and jobs are written in one transaction per batch of :data:`BATCH`
        (identities in key order, so concurrent enqueuers never deadlock):
        a claim never exists without its job, nor a job without its claim.
        """
        name = queue or self.settings.queue.name
        prio = self.settings.queue.priority if priority is None else priority
        settled = await asyncio.to_thread(self._settled, specs)
        done: dict[str, Enqueued] = {
            spec.key: Enqueued(spec, "skipped", why) for spec, why in zip(specs, settled, strict=False) if why
        }
        todo = sorted((spec for spec in specs if spec.key not in done), key=lambda spec: spec.key)
        for i in range(0, len(todo), BATCH):
            batch = todo[i : i + BATCH]
            try:
                results = await self._enqueue_batch(batch, name, prio)
            except procrastinate.exceptions.AlreadyEnqueued:  # the second guard: one by one, to say which
                results = []
                for spec in batch:
                    try:
                        results += await self._enqueue_batch([spec], name, prio)
                    except procrastinate.exceptions.AlreadyEnqueued:
                        results.append(Enqueued(spec, "skipped", "already queued"))
            done.update((r.spec.key, r) for r in results)
        return [done[spec.key] for spec in specs]

    def _settled(self, specs: list[JobSpec]) -> list[str | None]:
        """For each spec, why its session needs no job (finished, or a live runner outside the queue holds
        it), else None: the sessions that exist, their newest events and leases read in ONE query."""
        if self.store is None or not specs:
            return [None] * len(specs)
        heads = {head.info.session_id: head for head in self.store.session_heads([s.session_id for s in specs])}
        out: list[str | None] = []
        for spec in specs:
            head = heads.get(spec.session_id)
            state = None if head is None else status_of(head)
            if state is None:
                out.append(None)
            elif state.status == SessionStatus.FINISHED:
                out.append("already finished")
            elif state.holder is not None:
                out.append(f"being run by {state.holder}")
            else:
                out.append(None)
        return out

    async def _enqueue_batch(self, batch: list[JobSpec], queue: str, priority: int) -> list[Enqueued]:
        assert self.app is not None
        out: list[Enqueued] = []
        claimed: list[tuple[JobSpec, str]] = []
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "INSERT INTO saucer_jobs (key, session_id, kind, source, queue_name, claimed_by) "
                "SELECT k, s, kd, src, %s, %s FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[]) AS t(k, s, kd, src) "
                "ON CONFLICT (key) DO NOTHING RETURNING key",
                (
                    queue,
                    self.me,
                    [b.key for b in batch],
                    [b.session_id for b in batch],
                    [b.kind for b in batch],
                    [b.source for b in batch],
                ),
            )
            new = {row[0] for row in await cur.fetchall()}
            for spec in batch:
                why = "" if spec.key in new else await self._reclaim(conn, spec, queue)
                if why:
                    out.append(Enqueued(spec, "skipped", why))
                else:
                    claimed.append((spec, "queued" if spec.key in new else "requeued"))
            if not claimed:
                return out
            jobs = [
                procrastinate.jobs.Job(
                    queue=queue,
                    priority=priority,
                    lock=lock_for(self.settings, queue, spec),
                    queueing_lock=spec.key,
                    task_name=TASK_NAME,
                    task_kwargs=spec.args,
                )
                for spec, _ in claimed
            ]
            deferred = await self.app.job_manager.batch_defer_jobs_async(jobs, connection=conn)
            ids = [_job_id(job) for job in deferred]
            await conn.execute(
                "UPDATE saucer_jobs AS s SET job_id = t.id FROM unnest(%s::text[], %s::bigint[]) AS t(k, id) WHERE s.key = t.k",
                ([spec.key for spec, _ in claimed], ids),
            )
        return out + [
            Enqueued(spec, outcome, job_id=job_id) for (spec, outcome), job_id in zip(claimed, ids, strict=False)
        ]

    async def _reclaim(self, conn: Any, spec: JobSpec, queue: str) -> str:
        """Take over an existing identity if its job is over and its session is not; '' when taken, else why not."""
        # The row is locked first and the job read after, in its own statement: a join in the locking
        # statement would re-check the row after a concurrent claimer commits but read the job as it was before.
        cur = await conn.execute(
            "SELECT job_id, claimed_at, extract(epoch FROM clock_timestamp() - claimed_at) FROM saucer_jobs WHERE key = %s FOR UPDATE",
            (spec.key,),
        )
        job_id, claimed_at, age = await cur.fetchone()
        cur = await conn.execute("SELECT status::text FROM procrastinate_jobs WHERE id = %s", (job_id,))
        found = await cur.fetchone()
        status = found[0] if found else None
        if status == "todo":
            return "already queued"
        if status in ("doing", "aborting"):
            return "running"
        if job_id is None and status is None and float(age) < ORPHAN_CLAIM_SECONDS:
            return "being queued by another run"
        cur = await conn.execute(
            "UPDATE saucer_jobs SET job_id = NULL, claimed_by = %s, claimed_at = now(), requeues = requeues + 1, queue_name = %s "
            "WHERE key = %s AND job_id IS NOT DISTINCT FROM %s AND claimed_at = %s RETURNING key",
            (self.me, queue, spec.key, job_id, claimed_at),
        )
        return "" if await cur.fetchone() is not None else "being queued by another run"


async def enqueue_task(
    settings: SettingsModel,
    task: dict[str, Any],
    *,
    session_id: str | None = None,
    yes: bool = False,
    user: str | None = None,
) -> Enqueued:
    """Queue one task as the service receives it (``{"task": ..., "steps": [...], "vars": {...},
    "participants": [...]}``): a plan when it has steps, else its ``task`` as a request. Used by
    ``POST /api/sessions`` with ``"queue": true``; ``user`` is the principal that submitted it."""
    from saucer.engine.plan import parse_plan

    steps = [
        {k: v for k, v in step.items() if k != "timeout"} for step in task.get("steps") or []
    ]  # tools' own timeouts apply
    if steps:
        plan = parse_plan({"task": task["task"], "steps": steps}, "the submitted task")
        sid = session_id or new_session_id(plan.task)
        args = {
            "session_id": sid,
            "task": plan.task,
            "mode": "follower",
            "plan": plan.model_dump(mode="json", exclude_defaults=True),
            "plan_file": None,
            "workspace": None,
            "yes": yes,
            "settings": {},
            **seed_args(task.get("vars"), task.get("participants"), user),
        }
        spec = JobSpec(sid, sid, "plan", "service", args)
    else:
        spec = request_job(
            task["task"],
            task="request",
            session_id=session_id,
            yes=yes,
            context_vars=task.get("vars"),
            participants=task.get("participants"),
            user=user,
        )
        spec.args["workspace"] = None
    with open_store(settings.store.url) as store:
        async with QueueClient(settings, store) as client:
            [done] = await client.enqueue([spec])
    return done


def _job_id(job: procrastinate.jobs.Job) -> int:
    """The id the database gave a job that was just deferred."""
    if job.id is None:
        raise RuntimeError(f"procrastinate deferred job {job.queueing_lock!r} without an id")
    return job.id
