"""Many machines, one queue: sessions spread across ``saucer worker`` processes on any hosts.

The queue is procrastinate (PostgreSQL-backed) in its own schema of the
store's database (:mod:`saucer.queue.schema`), so a PostgreSQL store is the
only infrastructure. :mod:`saucer.queue.client` puts sessions on it once per
job identity, :mod:`saucer.queue.worker` runs them under the store's leases
(a dead worker's sessions continue elsewhere at their first uncommitted
step), :mod:`saucer.queue.admin` reads and steers it.

This package sits beside ``service``: it uses the engine, agents, store and
config, and nothing of ``cli`` or ``service``.
"""

from __future__ import annotations

from saucer.queue.admin import JobRow, QueueStatus, cancel_jobs, queue_status, retry_jobs
from saucer.queue.client import Enqueued, JobSpec, QueueClient, plan_jobs, request_job
from saucer.queue.jobs import HandedBack, SessionBusy, SessionJobFailed, SessionRunner
from saucer.queue.schema import QueueLocation, QueueUnavailableError, ensure_queue, migrate_queue, queue_location
from saucer.queue.worker import recover_stalled, run_worker

__all__ = [
    "Enqueued",
    "HandedBack",
    "JobRow",
    "JobSpec",
    "QueueClient",
    "QueueLocation",
    "QueueStatus",
    "QueueUnavailableError",
    "SessionBusy",
    "SessionJobFailed",
    "SessionRunner",
    "cancel_jobs",
    "ensure_queue",
    "migrate_queue",
    "plan_jobs",
    "queue_location",
    "queue_status",
    "recover_stalled",
    "request_job",
    "retry_jobs",
    "run_worker",
]
