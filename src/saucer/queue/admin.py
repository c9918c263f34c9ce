"""What is on the queue, and retry / cancel: the reads and writes behind ``saucer queue``.

Each job identity has one row in ``saucer_jobs`` and, once queued, a
procrastinate job. Its *state* as shown:

========== =================================================================
queueing   claimed, its job not deferred yet (or its enqueuer died between)
queued     waiting for a worker
running    taken by a worker; ``worker`` is the session's lease holder (HOST:PID:...)
done       the worker ran the session to an end (``session`` says which)
failed     the session ended failed or error, or ran past ``queue.job_timeout``
cancelling cancel asked while it runs
cancelled  cancelled before or while it ran
========== =================================================================

``retried`` counts jobs that ran more than once: taken back from a dead
worker, handed back on shutdown, or queued again (``retry``, a re-run).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from typing import Any

from saucer.engine.status import stored_status
from saucer.queue.client import JobSpec, QueueClient

__all__ = ["JobRow", "QueueStatus", "queue_status", "retry_jobs", "cancel_jobs", "STATES"]

STATES = ("queueing", "queued", "running", "done", "failed", "cancelling", "cancelled")

_STATE_OF = {
    None: "queueing",
    "todo": "queued",
    "doing": "running",
    "succeeded": "done",
    "failed": "failed",
    "aborting": "cancelling",
    "cancelled": "cancelled",
    "aborted": "cancelled",
}


@dataclass
class JobRow:
    """One job identity and where its job is."""

    session_id: str
    source: str
    kind: str
    queue: str
    state: str
    job_id: int | None
    retries: int  # times it went back to the queue (dead worker, hand-back, retry, re-run)
    priority: int | None
    worker: str | None = None
    session: str | None = None  # the session's status in the store, when it has one
    reason: str | None = None  # why it failed, one line: the worker's, else the session's own (failed or error)

    @property
    def retried(self) -> bool:
        return self.retries > 0


@dataclass
class QueueStatus:
    """Every job of the queue's schema and the count in each state."""

    jobs: list[JobRow]

    def counts(self) -> dict[str, int]:
        out = {state: 0 for state in STATES}
        for job in self.jobs:
            out[job.state] += 1
        out["retried"] = sum(1 for job in self.jobs if job.retried)
        out["total"] = len(self.jobs)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"counts": self.counts(), "jobs": [asdict(j) | {"retried": j.retried} for j in self.jobs]}


_SELECT = (
    "SELECT s.key, s.session_id, s.source, s.kind, s.queue_name, s.job_id, s.requeues, j.status::text, j.attempts, "
    "j.priority, j.args, s.reason FROM saucer_jobs s LEFT JOIN procrastinate_jobs j ON j.id = s.job_id"
)


async def _rows(client: QueueClient, where: str = "", params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    async with client.pool.connection() as conn:
        cur = await conn.execute(f"{_SELECT} {where} ORDER BY s.claimed_at, s.key", params)
        return list(await cur.fetchall())


def _retries(requeues: int, status: str | None, attempts: int | None) -> int:
    """Times the identity went back to the queue: re-queued rows, plus procrastinate's retries of its job.

    procrastinate counts an attempt when a job is retried and when it ends, so an ended job has run ``attempts`` times.
    """
    runs_counted = int(attempts or 0)
    ended = status in ("succeeded", "failed", "cancelled", "aborted")
    return int(requeues) + max(0, runs_counted - 1 if ended else runs_counted)


def _describe(client: QueueClient, rows: list[tuple[Any, ...]], sessions: bool = True) -> list[JobRow]:
    out = []
    store = client.store if sessions else None
    for _key, sid, source, kind, queue, job_id, requeues, status, attempts, priority, _args, reason in rows:
        row = JobRow(
            sid,
            source,
            kind,
            queue,
            _STATE_OF.get(status, str(status)),
            job_id,
            _retries(requeues, status, attempts),
            priority,
        )
        row.reason = reason if row.state == "failed" else None
        if store is not None and store.exists(sid):
            state = stored_status(store, sid)
            row.session = state.status
            if row.reason is None and state.status in ("failed", "error"):
                row.reason = state.summary.get("reason") or None
            if row.state in ("running", "cancelling"):
                row.worker = state.holder
        out.append(row)
    return out


async def queue_status(client: QueueClient, *, sessions: bool = True) -> QueueStatus:
    """Every job identity of the queue, with its state and, with ``sessions`` (one store read per job), its
    worker and its session's status."""
    rows = await _rows(client)
    return QueueStatus(await asyncio.to_thread(_describe, client, rows, sessions))


async def _select(client: QueueClient, sessions: list[str], states: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """Rows for the named sessions (whole ids or unique prefixes), or every row in ``states`` when none are named."""
    rows = await _rows(client)
    if not sessions:
        return [r for r in rows if _STATE_OF.get(r[7], r[7]) in states]
    picked = []
    for name in sessions:
        exact = [r for r in rows if r[1] == name]
        found = exact or [r for r in rows if r[1].startswith(name)]
        if not found:
            raise LookupError(f"no queued session {name!r} (saucer queue status lists them)")
        if len(found) > 1:
            raise LookupError(
                f"{name!r} fits {len(found)} queued sessions: {', '.join(r[1] for r in found[:5])}; give more of the id"
            )
        picked.append(found[0])
    return picked


async def retry_jobs(client: QueueClient, sessions: list[str]) -> list[tuple[str, str]]:
    """Queue again the named jobs (default: every failed and cancelled one); (session id, what happened) each.

    The worker continues each session at its first uncommitted step (a
    failed session runs its failed step again). A job still queued or
    running, or whose session finished, is left as it is.
    """
    out = []
    for key, sid, source, kind, queue, _job, _req, _status, _att, priority, args, _reason in await _select(
        client, sessions, ("failed", "cancelled")
    ):
        if args is None:
            out.append((sid, "has no job to retry yet (being queued)"))
            continue
        [done] = await client.enqueue([JobSpec(key, sid, kind, source, dict(args))], queue=queue, priority=priority)
        out.append(
            (sid, f"queued again as job {done.job_id}" if done.outcome != "skipped" else f"not retried: {done.why}")
        )
    return out


async def cancel_jobs(client: QueueClient, sessions: list[str]) -> list[tuple[str, str]]:
    """Cancel the named jobs (default: every queued one); a running one is stopped within seconds.

    It is stopped where it is (its step in flight runs again when it is continued); its session keeps
    what it committed: ``retry`` (or a re-run) continues it.
    """
    assert client.app is not None
    out = []
    for _key, sid, *_rest in await _select(client, sessions, ("queued",)):
        job_id, status = _rest[3], _rest[5]
        if status not in ("todo", "doing"):
            out.append((sid, f"not cancelled: it is {_STATE_OF.get(status, status)}"))
            continue
        cancelled = await client.app.job_manager.cancel_job_by_id_async(job_id, abort=True)
        out.append(
            (
                sid,
                (
                    "cancelled"
                    if status == "todo"
                    else "stop asked; it stops within seconds, keeping the steps it committed"
                )
                if cancelled
                else "not cancelled: it just ended",
            )
        )
    return out
