"""The worker's procrastinate app on its connections: a worker taken for dead comes back, a connection
the server closed is replaced without a ping per query, and queries run in autocommit."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from saucer.queue.jobs import TASK_NAME, make_app
from saucer.queue.schema import ensure_queue, queue_location

pytestmark = [pytest.mark.postgres]


def test_a_worker_taken_for_dead_registers_again_instead_of_stopping(pg_url: str) -> None:
    """Its row pruned by another worker (late heartbeats), its next fetch or heartbeat registers it again."""
    location = queue_location(pg_url)
    ensure_queue(location)
    app = make_app(location)

    async def main() -> tuple[int, int]:
        async with app.open_async():
            manager = app.job_manager
            worker = await manager.register_worker()
            prune = "DELETE FROM procrastinate_workers WHERE id = %(worker_id)s"
            await app.connector.execute_query_async(prune, worker_id=worker)
            deferred = await app.tasks[TASK_NAME].defer_async(session_id="s")
            job = await manager.fetch_job(queues=None, worker_id=worker)  # it takes the job: no FK error
            assert job is not None and job.id == deferred
            back = await app.connector.execute_query_all_async("SELECT id FROM procrastinate_workers")
            await app.connector.execute_query_async(prune, worker_id=worker)
            await manager.update_heartbeat(worker)
            again = await app.connector.execute_query_all_async("SELECT id FROM procrastinate_workers")
            return worker, len([r for r in back if r["id"] == worker]) + len([r for r in again if r["id"] == worker])

    worker, seen = asyncio.run(main())
    assert worker and seen == 2


def test_a_pooled_connection_the_server_closed_is_replaced_and_queries_autocommit(pg_url: str) -> None:
    location = queue_location(pg_url)
    ensure_queue(location)
    app = make_app(location, pool_size=2)

    async def main() -> list[object]:
        async with app.open_async():
            pool = app.connector.pool  # type: ignore[attr-defined]
            async with pool.connection() as conn:
                assert conn.autocommit  # each of procrastinate's single statements commits at once
                pid = conn.info.backend_pid
            with psycopg.connect(location.conninfo, autocommit=True) as killer:
                killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
            await asyncio.sleep(0.2)  # the server's goodbye reaches the idle connection's socket
            rows = await app.connector.execute_query_all_async("SELECT 1 AS one")
            return [row["one"] for row in rows]

    assert asyncio.run(main()) == [1]
