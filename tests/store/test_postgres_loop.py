"""The event loop never waits on PostgreSQL in the store's async commit path (issue 29, item 2).

A detector wraps psycopg's synchronous Connection and Cursor methods and records
each call made on a thread whose event loop is running: such a call blocks
every other session of that loop while the database answers.
"""

from __future__ import annotations

import asyncio
import functools
import traceback
from collections.abc import Iterator
from typing import Any

import pytest

from saucer.store import open_store

postgres = pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)

_METHODS = {
    "Connection": ("execute", "commit", "rollback", "cursor", "transaction", "pipeline"),
    "Cursor": ("execute", "executemany", "fetchone", "fetchmany", "fetchall", "copy", "stream"),
}


def _on_a_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.fixture
def loop_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every synchronous psycopg call made while an event loop runs in the calling thread
    (the method and where it was called from)."""
    import psycopg

    calls: list[str] = []
    for cls_name, names in _METHODS.items():
        cls = getattr(psycopg, cls_name)
        for name in names:
            original = getattr(cls, name)

            def wrapper(
                *args: Any, __original: Any = original, __name: str = f"{cls_name}.{name}", **kwargs: Any
            ) -> Any:
                if _on_a_loop():
                    where = [
                        f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}"
                        for f in traceback.extract_stack(limit=8)[:-1]
                    ]
                    calls.append(f"{__name} from {' < '.join(reversed(where))}")
                return __original(*args, **kwargs)

            monkeypatch.setattr(cls, name, functools.wraps(original)(wrapper))
    yield calls


def test_the_detector_sees_a_synchronous_call_on_a_loop(loop_calls: list[str]) -> None:
    """The detector itself: a psycopg call made from a coroutine is recorded (without a server)."""
    import psycopg

    async def main() -> None:
        with pytest.raises(AttributeError):  # None has no cursor: the call fails after the detector saw it
            psycopg.Connection.execute(None, "SELECT 1")  # type: ignore[arg-type]

    asyncio.run(main())
    assert len(loop_calls) == 1 and loop_calls[0].startswith("Connection.execute")


@postgres
def test_async_appends_never_call_psycopg_synchronously_on_the_loop(store_url: str, loop_calls: list[str]) -> None:
    store = open_store(store_url)
    try:
        sessions = [f"s{i}" for i in range(20)]
        for sid in sessions:
            store.create_session(sid)
        loop_calls.clear()

        async def main() -> None:
            async def one(sid: str) -> None:
                for k in range(5):
                    await store.aappend(sid, k, [{"op": "set", "var": "x", "value": k}], author="t", step=k)

            await asyncio.gather(*(one(s) for s in sessions))

        asyncio.run(main())
        assert loop_calls == [], "\n".join(loop_calls[:5])
        assert [store.head(s) for s in sessions] == [5] * 20
        assert store._group_committer().largest_batch > 1  # the sessions of the loop still share transactions
    finally:
        store.close()


@postgres
def test_the_loop_runs_while_a_batch_is_written_and_a_cancelled_leader_reports_its_outcome(store_url: str) -> None:
    """The leader's batch is written on the writer thread: the loop's other tasks run meanwhile;
    cancelled then, the commit waits for the write, and the Context knows it was written."""
    import threading

    from saucer.context import Context

    store = open_store(store_url)
    try:
        ctx = Context.open(store, "s")
        committer = store._group_committer()  # type: ignore[attr-defined]
        original = committer._write_one
        taken, gate = threading.Event(), threading.Event()

        def slow_one(entry: Any) -> None:
            taken.set()
            assert gate.wait(5), "the loop was blocked while the batch was written"
            original(entry)

        committer._write_one = slow_one

        async def main() -> int:
            ctx.incr("n")
            commit = asyncio.ensure_future(ctx.acommit())
            ticks = 0
            while not taken.is_set():
                await asyncio.sleep(0.001)
            for _ in range(5):  # the batch is being written: the loop still runs this task
                await asyncio.sleep(0.001)
                ticks += 1
            commit.cancel()
            threading.Timer(0.2, gate.set).start()
            with pytest.raises(asyncio.CancelledError):
                await commit
            return ticks

        assert asyncio.run(main()) == 5
        assert ctx.version == 1 and not ctx.pending  # written, and the Context says so
        assert store.head("s") == 1
    finally:
        store.close()


@postgres
def test_a_runner_s_lease_and_snapshots_never_call_psycopg_synchronously_on_the_loop(
    store_url: str, loop_calls: list[str]
) -> None:
    """What the engine does on the loop besides its commits: take and renew the session's lease,
    commit with its token, and store a snapshot every few events."""
    from saucer.context import Context
    from saucer.engine.lease import LeaseKeeper

    store = open_store(store_url)
    try:
        ctx = Context.open(store, "run", snapshot_every=2)
        tokens: list[int] = []
        keeper = LeaseKeeper(store, "run", "runner", 0.3, tokens.append)
        loop_calls.clear()

        async def main() -> None:
            lease = await keeper.acquire()
            ctx.fence = lease.token
            keeper.start_renewing()
            for k in range(6):
                ctx.incr("n")
                await ctx.acommit(step=k)
            await asyncio.sleep(0.35)  # the keeper renews every 0.1 s
            keeper.stop()

        asyncio.run(main())
        assert loop_calls == [], "\n".join(loop_calls[:5])
        assert store.head("run") == 6 and store.latest_snapshot("run") is not None
        assert keeper.lease is not None and keeper._renewed > 0
    finally:
        store.close()


def test_a_renewal_in_flight_when_the_runner_stops_does_not_take_the_lease_back(tmp_path: Any) -> None:
    """The renewal runs in a thread that a cancellation does not stop: release() waits for it,
    so the lease is free afterwards (another runner takes it at once)."""
    import threading

    from saucer.engine.lease import LeaseKeeper

    store = open_store(f"sqlite:///{tmp_path / 'l.db'}")
    store.create_session("s")
    keeper = LeaseKeeper(store, "s", "runner", 0.15, lambda token: None)
    in_renewal, finish = threading.Event(), threading.Event()
    original = store.acquire_lease

    def slow_acquire(*args: Any) -> Any:
        if keeper.lease is not None:  # a renewal: hold it in flight
            in_renewal.set()
            finish.wait(5)
        return original(*args)

    store.acquire_lease = slow_acquire  # type: ignore[method-assign]

    async def main() -> None:
        await keeper.acquire()
        keeper.start_renewing()
        while not in_renewal.is_set():
            await asyncio.sleep(0.01)
        keeper.stop()
        threading.Timer(0.2, finish.set).start()
        keeper.release()  # after the renewal in flight

    asyncio.run(main())
    assert original("s", "other", 10.0).owner == "other"  # free: not taken back by the late renewal
    store.close()


class _InstantTool:
    """An in-process tool answering at once (what bench/queue_bench.py's sessions use)."""

    async def execute_commands(self, commands: list[Any], timeout: float | None = None) -> list[Any]:
        from saucer.dispatch.messages import Result, ResultStatus

        return [Result(status=ResultStatus.SUCCESS, result="ok", call_id=c.call_id) for c in commands]

    def list_tools(self) -> list[dict[str, Any]]:
        return [{"name": "files.write"}]


def _job(sid: str) -> dict[str, Any]:
    step = {"subtask": "one", "commands": [{"tool_name": "files.write", "parameters": {"path": "f", "content": "x"}}]}
    return {
        "session_id": sid,
        "task": "loop",
        "mode": "follower",
        "plan": {"task": "loop", "steps": [step]},
        "participants": ["human:bob"],
    }


@postgres
def test_a_worker_s_sessions_never_call_psycopg_synchronously_on_the_loop(
    store_url: str, loop_calls: list[str], tmp_path: Any
) -> None:
    """What a queue worker does for a job, on its loop: create the session with its lease, open its Context,
    commit its steps, snapshot and release it at the end; a job run again finds it (its row read, its
    participants and status) and reports it; a job whose session is only a failure's record deletes it."""
    from saucer.config import load_settings
    from saucer.queue.jobs import SessionRunner

    store = open_store(store_url)
    try:
        settings = load_settings(overrides={"logs.enabled": False, "store.url": store_url})
        runner = SessionRunner(
            settings, store, dispatcher_factory=lambda session: _InstantTool(), workspace=str(tmp_path)
        )
        store.create_session("failed-early", meta={"task": "loop", "mode": "follower", "queue_error": True})
        loop_calls.clear()

        async def main() -> list[str]:
            ends = await asyncio.gather(*(runner.run_session(_job(f"job{i}")) for i in range(4)))
            again = await runner.run_session(_job("job0"))  # the job run twice: the session exists, and ended
            fresh = await runner.run_session(_job("failed-early"))
            return [r.status for r in (*ends, again, fresh)]

        assert asyncio.run(main()) == ["finished"] * 6
        assert loop_calls == [], "\n".join(sorted(set(loop_calls)))
        for sid in ("job0", "job3", "failed-early"):
            assert store.latest_snapshot(sid) is not None and store.lease_of(sid).expires_at == 0  # type: ignore[union-attr]
            assert store.session_info(sid).participants == {"human:bob"}
    finally:
        store.close()
