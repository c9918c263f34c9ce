"""A job that succeeds is ended in the statement that takes the next one for its slot (one round trip,
one commit), only while the worker is taking jobs; a job taken so and not started yet goes back to the
queue when the worker stops; an end that is refused (the job taken over) takes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from saucer.queue.jobs import TASK_NAME, make_app
from saucer.queue.schema import ensure_queue, queue_location

pytestmark = [pytest.mark.postgres]


async def _status(app: Any, job_id: int) -> str:
    row = await app.connector.execute_query_one_async(
        "SELECT status FROM procrastinate_jobs WHERE id = %(id)s", id=job_id
    )
    return str(row["status"])


def _app(pg_url: str) -> Any:
    location = queue_location(pg_url)
    ensure_queue(location)
    return make_app(location)


def test_a_job_that_succeeds_takes_the_next_one_and_wakes_the_worker(pg_url: str) -> None:
    from procrastinate import jobs

    app = _app(pg_url)
    woken: list[dict[str, Any]] = []

    async def wake(*, channel: str, notification: dict[str, Any]) -> None:
        woken.append(notification)

    async def main() -> tuple[list[str], list[int | None]]:
        async with app.open_async():
            manager = app.job_manager
            manager._wake = wake  # what listen_for_jobs captures from the worker
            worker = await manager.register_worker()
            first, second, third = [await app.tasks[TASK_NAME].defer_async(session_id=f"s{i}") for i in range(3)]
            job = await manager.fetch_job(queues=None, worker_id=worker)
            assert job.id == first
            await manager.finish_job(job, jobs.Status.SUCCEEDED, delete_job=False)  # and takes the second
            states = [await _status(app, i) for i in (first, second, third)]
            taken = await manager.fetch_job(queues=None, worker_id=worker)  # no query: the one taken
            assert await _status(app, third) == "todo"
            got = [taken.id]
            await manager.finish_job(taken, jobs.Status.SUCCEEDED, delete_job=False)  # and takes the third
            last = await manager.fetch_job(queues=None, worker_id=worker)
            await manager.finish_job(last, jobs.Status.SUCCEEDED, delete_job=False)  # nothing left to take
            got += [
                last.id,
                None if (none := await manager.fetch_job(queues=None, worker_id=worker)) is None else none.id,
            ]
            states.append(await _status(app, third))
            return states, got

    states, got = asyncio.run(main())
    assert states[:3] == ["succeeded", "doing", "todo"] and states[3] == "succeeded"
    assert got[0] is not None and got[1] == got[0] + 1 and got[2] is None
    assert woken == [{"type": "job_inserted"}] * 2


def test_nothing_is_taken_once_a_fetch_found_nothing_and_a_taken_job_goes_back_when_the_worker_stops(
    pg_url: str,
) -> None:
    from procrastinate import jobs

    app = _app(pg_url)

    async def wake(*, channel: str, notification: dict[str, Any]) -> None:
        return None

    async def main() -> list[str]:
        async with app.open_async():
            manager = app.job_manager
            manager._wake = wake
            worker = await manager.register_worker()
            first = await app.tasks[TASK_NAME].defer_async(session_id="a")
            job = await manager.fetch_job(queues=None, worker_id=worker)
            assert await manager.fetch_job(queues=None, worker_id=worker) is None  # the worker goes idle
            late = await app.tasks[TASK_NAME].defer_async(session_id="b")
            await manager.finish_job(job, jobs.Status.SUCCEEDED, delete_job=False)  # ended alone
            idle = [await _status(app, first), await _status(app, late)]
            other = await manager.fetch_job(queues=None, worker_id=worker)  # taking again
            assert other.id == late
            third = await app.tasks[TASK_NAME].defer_async(session_id="c")
            await manager.finish_job(other, jobs.Status.SUCCEEDED, delete_job=False)  # takes the third
            taken = await _status(app, third)
            await manager.unregister_worker(worker)  # stopping before it started: back to the queue
            row = await app.connector.execute_query_one_async(
                "SELECT status, attempts, worker_id FROM procrastinate_jobs WHERE id = %(id)s", id=third
            )
            return [*idle, taken, str(row["status"]), row["attempts"], row["worker_id"]]

    assert asyncio.run(main()) == ["succeeded", "todo", "doing", "todo", 0, None]  # not counted as an attempt


def test_an_end_that_is_refused_takes_nothing(pg_url: str) -> None:
    from procrastinate import jobs

    app = _app(pg_url)

    async def wake(*, channel: str, notification: dict[str, Any]) -> None:
        raise AssertionError("nothing was taken: the worker is not woken")

    async def main() -> list[str]:
        async with app.open_async():
            manager = app.job_manager
            manager._wake = wake
            worker = await manager.register_worker()
            first = await app.tasks[TASK_NAME].defer_async(session_id="a")
            second = await app.tasks[TASK_NAME].defer_async(session_id="b")
            job = await manager.fetch_job(queues=None, worker_id=worker)
            # Another worker put it back and ended it meanwhile (its heartbeats were late).
            await app.connector.execute_query_async(
                "UPDATE procrastinate_jobs SET status = 'failed' WHERE id = %(id)s", id=first
            )
            await manager.finish_job(job, jobs.Status.SUCCEEDED, delete_job=False)  # logged, not raised
            return [await _status(app, first), await _status(app, second)]

    assert asyncio.run(main()) == ["failed", "todo"]


def test_a_jobs_log_context_is_made_once_and_is_procrastinates(pg_url: str) -> None:
    """The worker logs four lines per job with the job's log context (a copy of its arguments, a whole
    plan): the jobs it takes, fetched or taken as another ends, make it once and give the same one."""
    from procrastinate import jobs

    app = _app(pg_url)
    plan = {"task": "t", "steps": [{"subtask": "s", "commands": [{"tool_name": "x", "parameters": {}}]}]}

    async def wake(*, channel: str, notification: dict[str, Any]) -> None:
        pass

    async def main() -> list[Any]:
        async with app.open_async():
            manager = app.job_manager
            manager._wake = wake
            worker = await manager.register_worker()
            for i in range(2):
                await app.tasks[TASK_NAME].defer_async(session_id=f"s{i}", plan=plan)
            fetched = await manager.fetch_job(queues=None, worker_id=worker)
            await manager.finish_job(fetched, jobs.Status.SUCCEEDED, delete_job=False)  # and takes the second
            taken = await manager.fetch_job(queues=None, worker_id=worker)
            await manager.finish_job(taken, jobs.Status.SUCCEEDED, delete_job=False)
            return [fetched, taken]

    for job in asyncio.run(main()):
        made = job.log_context()
        assert job.log_context() is made
        plain = jobs.Job(
            **{name: getattr(job, name) for name in ("id", "status", "queue", "priority", "lock")},
            queueing_lock=job.queueing_lock,
            task_name=job.task_name,
            task_kwargs=job.task_kwargs,
            scheduled_at=job.scheduled_at,
            attempts=job.attempts,
            worker_id=job.worker_id,
        )
        assert made == plain.log_context() and made["task_kwargs"]["plan"] == plan
        assert made["task_kwargs"] is not job.task_kwargs  # a copy, as procrastinate's: a log handler may change it
