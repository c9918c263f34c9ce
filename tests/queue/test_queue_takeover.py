"""A live worker whose job was put back (it missed its heartbeats) and ended by another worker
keeps running: procrastinate's refusal to take its late outcome is logged, not raised (raised,
it stopped the whole worker with exit status 1). Needs PostgreSQL (see conftest)."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

import pytest
from procrastinate.exceptions import ConnectorException
from procrastinate.jobs import Status

from saucer.queue.jobs import TASK_NAME, make_app
from saucer.queue.schema import ensure_queue, queue_location
from saucer.queue.worker import recover_stalled


def test_a_late_outcome_for_a_job_another_worker_ended_is_dropped_not_raised(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    location = queue_location(pg_url)
    ensure_queue(location)

    async def scenario() -> None:
        app = make_app(location)
        async with app.open_async():
            manager = app.job_manager
            await app.tasks[TASK_NAME].defer_async(session_id="s-late")
            slow, fast = await manager.register_worker(), await manager.register_worker()
            job = await manager.fetch_job(queues=None, worker_id=slow)
            assert job is not None
            # The slow worker missed its heartbeats: its job is put back, another worker takes it and ends it.
            await manager.retry_job_by_id_async(job_id=job.id, retry_at=datetime.now(UTC))
            again = await manager.fetch_job(queues=None, worker_id=fast)
            assert again is not None and again.id == job.id
            await manager.finish_job(again, Status.SUCCEEDED, delete_job=False)
            # The slow worker's own outcome comes late: dropped (as a failure or as a hand-back).
            with caplog.at_level(logging.WARNING, logger="saucer.queue"):
                await manager.finish_job(job, Status.FAILED, delete_job=False)
                await manager.retry_job(job)
            assert await manager.get_job_status_async(job.id) == Status.SUCCEEDED
            assert caplog.text.count("session s-late): ended by another worker meanwhile") == 2, caplog.text
            # Nothing stalled is left to put back, and a job that is not there still fails loudly.
            assert await recover_stalled(app, 0) == []
            with pytest.raises(ConnectorException) as refused:  # recover_stalled's call: it must know
                await manager.retry_job_by_id_async(job_id=job.id, retry_at=datetime.now(UTC))
            assert "Job was not found" in str(refused.value.__cause__)

    asyncio.run(scenario())
