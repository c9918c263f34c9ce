"""``saucer worker``: a long-running process that takes session jobs from the queue and runs them.

Any number of workers on any number of hosts share one queue (in the
store's PostgreSQL database). Each one:

- takes up to ``concurrency`` jobs at once, highest priority first, from its
  queues (``queue.name`` by default), and runs each one's session through the
  engine under the store's lease (see :mod:`saucer.queue.jobs`);
- sends a heartbeat every ``queue.heartbeat`` seconds;
- every heartbeat, puts back on the queue the jobs of workers silent for
  ``queue.stalled_after`` seconds (a SIGKILL, a lost host). Whichever worker
  takes such a job waits for the dead runner's session lease to expire
  (``store.lease_ttl``), then continues at the first uncommitted step: a
  committed step never runs again; the step that was in flight, whose
  commands may have run, runs again (so it can show twice). A worker taken
  for dead that is alive after all (its heartbeats late on a loaded machine)
  registers again at its next heartbeat or fetch, and runs on;
- on SIGTERM (or SIGINT) takes no new job, lets its sessions run on for
  ``queue.shutdown_timeout`` seconds, then stops the rest where they are (uncommitted work is dropped)
  and hands their jobs back to the queue, and exits 0.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from saucer.config import SettingsModel
from saucer.queue.jobs import SessionRunner, make_app
from saucer.queue.schema import ensure_queue, queue_location
from saucer.store import open_store

__all__ = ["run_worker", "recover_stalled"]

_log = logging.getLogger("saucer.queue")


async def recover_stalled(app: Any, stalled_after: float) -> list[int]:
    """Put back on the queue the running jobs of workers silent for ``stalled_after`` seconds; their ids."""
    back = []
    for job in await app.job_manager.get_stalled_jobs(seconds_since_heartbeat=stalled_after):
        try:
            # By id: the app's retry_job passes over a job ended meanwhile, and this one must know it.
            await app.job_manager.retry_job_by_id_async(job_id=job.id, retry_at=datetime.now(UTC))
        except Exception as exc:  # noqa: BLE001 - another worker took it back first
            _log.debug("stalled job %s: not retried here (%s)", job.id, exc)
            continue
        back.append(job.id)
        _log.warning(
            "job %s (session %s): its worker stopped sending heartbeats; back on the queue",
            job.id,
            job.task_kwargs.get("session_id"),
        )
    await app.job_manager.prune_stalled_workers(stalled_after)
    return back


async def _recovery_loop(app: Any, settings: SettingsModel) -> None:
    while True:
        try:
            await recover_stalled(app, settings.queue.stalled_after)
        except Exception as exc:  # noqa: BLE001 - the next beat tries again
            _log.warning("stalled-job recovery failed: %s", exc)
        await asyncio.sleep(settings.queue.heartbeat)


def _warm_up() -> None:
    """Import what the first session needs before the worker registers: a first job that imports the engine's
    dispatcher would hold the event loop for seconds and delay the heartbeats, so other workers think it died."""
    import saucer.dispatch.local  # noqa: F401
    import saucer.engine.round  # noqa: F401


async def run_worker(
    settings: SettingsModel,
    *,
    queues: Sequence[str] | None = None,
    concurrency: int | None = None,
    dispatcher_factory: Callable[[Any], Any] | None = None,
    agents: Any = None,
    observer: Any = None,
    until_idle: bool = False,
    report: Callable[[str], None] | None = None,
) -> SessionRunner:
    """Run a worker on the queue of ``settings.store.url`` until SIGTERM/SIGINT (or, ``until_idle``, until no job is left).

    Returns its :class:`SessionRunner` (``finished`` holds the results). ``report(line)`` is told, at
    start, what this worker cannot run (:meth:`SessionRunner.cannot_run`).
    """
    location = queue_location(settings.store.url)
    await asyncio.to_thread(ensure_queue, location)
    await asyncio.to_thread(_warm_up)
    slots = concurrency or settings.queue.concurrency
    store = await asyncio.to_thread(open_store, settings.store.url)  # it connects (and may migrate): off the loop
    runner = SessionRunner(settings, store, dispatcher_factory=dispatcher_factory, agents=agents, observer=observer)
    if report is not None:
        for line in await runner.cannot_run():
            report(f"this worker cannot run {line}")
    app = make_app(location, pool_size=slots + 3)
    try:
        async with app.open_async():
            recovery = asyncio.create_task(_recovery_loop(app, settings), name="saucer-stalled-recovery")
            try:
                await app.run_worker_async(
                    queues=list(queues or [settings.queue.name]),
                    concurrency=slots,
                    wait=not until_idle,
                    name="saucer-worker",
                    additional_context={"runner": runner},
                    update_heartbeat_interval=settings.queue.heartbeat,
                    stalled_worker_timeout=settings.queue.stalled_after,
                    shutdown_graceful_timeout=settings.queue.shutdown_timeout,
                    fetch_job_polling_interval=min(5.0, settings.queue.heartbeat),
                    abort_job_polling_interval=min(5.0, settings.queue.heartbeat),
                    install_signal_handlers=True,
                    listen_notify=True,
                )
            finally:
                recovery.cancel()
                await asyncio.gather(recovery, return_exceptions=True)
    finally:
        runner.factory.close()
        await asyncio.to_thread(store.close)  # it joins its pools' threads: off the loop
    return runner
