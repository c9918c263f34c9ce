"""Commits from coroutines: ``Context.acommit`` and ``EventStore.aappend``.

The sessions of one event loop that commit at the same time share one
transaction, without a thread per session; each commit is durable when it
returns; a refused commit fails only itself; cancellation never leaves the
Context and the store disagreeing; synchronous and asynchronous callers of
one store never deadlock each other.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from saucer.context import Context
from saucer.store import ConflictError, Feature, FencedError, open_store
from saucer.store._group import Pending

backends = pytest.mark.parametrize("store_url", ["sqlite", "postgresql"], indirect=True)
every_backend = pytest.mark.parametrize("store_url", ["memory", "sqlite", "postgresql"], indirect=True)


def _gate_next_write(store: Any) -> tuple[threading.Event, threading.Event]:
    """Make the committer's next write block until ``gate`` is set; ``started`` is set when it begins."""
    committer = store._group_committer()
    committer.max_inflight = 1  # one batch in flight: the others queue behind the held one
    started, gate = threading.Event(), threading.Event()
    first = [True]
    originals = committer._write_one, committer._write_batch

    def hold(original: Any) -> Any:
        def write(arg: Any) -> None:
            if first[0]:
                first[0] = False
                started.set()
                assert gate.wait(30)
            original(arg)

        return write

    committer._write_one, committer._write_batch = hold(originals[0]), hold(originals[1])
    return started, gate


@every_backend
def test_sessions_of_one_loop_commit_durably_and_share_transactions(store_url: str) -> None:
    store = open_store(store_url)
    observer = open_store(store_url)  # another connection: sees only what is committed
    sessions, commits = 40, 15

    async def session(i: int) -> None:
        ctx = Context.open(store, f"s{i}", author=f"agent{i}")
        for k in range(commits):
            ctx.incr("n")
            ctx.append("seen", k)
            ctx.set("REQUEST", f"request {k}")
            version = await ctx.acommit(step=k)
            assert version == ctx.version == k + 1
            assert observer.head(f"s{i}") >= version  # durable when acommit returns
        ctx.close()

    async def main() -> None:
        await asyncio.gather(*(session(i) for i in range(sessions)))

    try:
        asyncio.run(main())
        if Feature.GROUP_COMMIT in store.features:
            committer = store._group_committer()  # type: ignore[attr-defined]
            assert committer.entries == sessions * commits
            assert committer.largest_batch >= sessions // 2, "the loop's commits did not share transactions"
    finally:
        store.close()
        observer.close()
    with open_store(store_url) as fresh:
        for i in range(sessions):
            ctx = Context.open(fresh, f"s{i}", create=False)
            assert ctx.get_var("n") == commits and ctx.get_var("seen") == list(range(commits))
            assert [e.step for e in ctx.history()] == list(range(commits))
            assert {e.author for e in ctx.history()} == {f"agent{i}"}


@backends
def test_a_refused_async_commit_fails_only_itself(store_url: str) -> None:
    store = open_store(store_url)
    try:
        for sid in ("ok1", "ok2", "stale", "fenced"):
            store.create_session(sid)
        store.append("stale", 0, [{"op": "set", "var": "x", "value": 0}], author="other")
        lease = store.acquire_lease("fenced", "owner", 60)
        store.release_lease(lease)
        store.acquire_lease("fenced", "thief", 60)

        async def main() -> list[Any]:
            return await asyncio.gather(
                store.aappend("ok1", 0, [{"op": "set", "var": "x", "value": 1}], author="a"),
                store.aappend("stale", 0, [{"op": "set", "var": "x", "value": 1}], author="a"),
                store.aappend("fenced", 0, [{"op": "set", "var": "x", "value": 1}], author="a", fence=lease.token),
                store.aappend("ok2", 0, [{"op": "set", "var": "x", "value": 1}], author="a"),
                return_exceptions=True,
            )

        ok1, stale, fenced, ok2 = asyncio.run(main())
        assert ok1.version == 1 and ok2.version == 1
        assert type(stale) is ConflictError and stale.actual == 1
        assert isinstance(fenced, FencedError) and fenced.holder == "thief"
        assert [store.head(s) for s in ("ok1", "ok2", "stale", "fenced")] == [1, 1, 1, 0]
        assert store._group_committer().largest_batch == 4  # type: ignore[attr-defined]
    finally:
        store.close()


@every_backend
def test_atomic_async_commits_to_one_session_are_rebased_not_lost(store_url: str) -> None:
    store = open_store(store_url)
    try:
        Context.open(store, "shared").close()

        async def writer(name: str) -> None:
            ctx = Context.open(store, "shared", author=name)
            for _ in range(25):
                ctx.incr("n")
                ctx.append("by", name)
                await ctx.acommit()
            ctx.close()

        async def main() -> None:
            await asyncio.gather(*(writer(f"w{i}") for i in range(4)))

        asyncio.run(main())
        ctx = Context.open(store, "shared", create=False)
        assert ctx.get_var("n") == 100 and sorted(ctx.get_var("by")) == sorted(
            f"w{i}" for i in range(4) for _ in range(25)
        )
        assert ctx.version == 100
    finally:
        store.close()


@every_backend
def test_a_plain_write_based_on_a_stale_version_is_refused_with_its_keys(store_url: str) -> None:
    store = open_store(store_url)
    try:
        a = Context.open(store, "s", author="a")
        b = Context.open(store, "s", author="b")
        a.update_vars(set={"x": 1})
        a.commit()
        b.update_vars(set={"x": 2})
        with pytest.raises(ConflictError) as info:
            asyncio.run(b.acommit())
        assert info.value.keys == ["vars.x"]
        b.reload()
        assert b.get_var("x") == 1
    finally:
        store.close()


@every_backend
def test_the_context_refuses_changes_while_its_commit_is_in_flight(store_url: str) -> None:
    store = open_store(store_url)
    try:
        ctx = Context.open(store, "s")

        async def main() -> None:
            ctx.incr("n")
            commit = asyncio.ensure_future(ctx.acommit())
            await asyncio.sleep(0)  # the commit has started
            if store_url.startswith("memory"):
                assert commit.done()  # the memory store writes at once
            else:
                assert not commit.done()  # waiting for its batch
                with pytest.raises(RuntimeError, match="in flight"):
                    ctx.incr("n")
                with pytest.raises(RuntimeError, match="in flight"):
                    ctx.commit()
            await commit
            ctx.incr("n")  # allowed again
            await ctx.acommit()

        asyncio.run(main())
        assert Context.open(store, "s", create=False).get_var("n") == 2
    finally:
        store.close()


@backends
def test_a_commit_cancelled_while_queued_writes_nothing(store_url: str) -> None:
    store = open_store(store_url)
    try:
        ctx = Context.open(store, "s")
        store.create_session("blocker")
        started, gate = _gate_next_write(store)
        holder = threading.Thread(target=lambda: store.append("blocker", 0, [], author="x"))
        holder.start()
        assert started.wait(10)

        async def main() -> None:
            ctx.incr("n")
            commit = asyncio.ensure_future(ctx.acommit())
            while not store._group_committer()._queue:  # type: ignore[attr-defined]
                await asyncio.sleep(0.001)
            commit.cancel()
            with pytest.raises(asyncio.CancelledError):
                await commit

        asyncio.run(main())
        gate.set()
        holder.join(10)
        assert ctx.version == 0 and ctx.pending  # nothing written: the change is still pending
        assert store.head("s") == 0
        ctx.commit()
        assert store.head("s") == 1 and Context.open(store, "s", create=False).get_var("n") == 1
    finally:
        store.close()


@backends
def test_a_commit_cancelled_while_being_written_reports_its_outcome(store_url: str) -> None:
    """Cancelled once its batch was taken: the cancellation waits for the write; the Context knows it."""
    store = open_store(store_url)
    try:
        ctx = Context.open(store, "s")
        store.create_session("other")
        committer = store._group_committer()  # type: ignore[attr-defined]
        committer.steal_after = 0.05
        original = committer._write_batch
        taken, gate = threading.Event(), threading.Event()

        def slow_batch(entries: list[Pending]) -> None:
            taken.set()
            assert gate.wait(30)
            original(entries)

        committer._write_batch = slow_batch
        # The coroutine's commit is made leader, but its loop is kept busy; a
        # thread's append takes over (after steal_after) and writes both in a
        # held batch; the coroutine is cancelled while that batch is written.
        thread = threading.Thread(target=lambda: store.append("other", 0, [], author="t"))

        async def main() -> None:
            ctx.incr("n")
            commit = asyncio.ensure_future(ctx.acommit())
            await asyncio.sleep(0)  # the commit queued its entry and yielded to lead next
            thread.start()
            assert taken.wait(10)  # blocks the loop until the thread writes the batch
            commit.cancel()
            threading.Timer(0.2, gate.set).start()
            with pytest.raises(asyncio.CancelledError):
                await commit

        asyncio.run(main())
        thread.join(10)
        assert committer.largest_batch == 2
        assert ctx.version == 1 and not ctx.pending  # it was written, and the Context says so
        assert store.head("s") == 1 and store.head("other") == 1
    finally:
        store.close()


@backends
def test_a_synchronous_commit_inside_the_loop_does_not_wait_for_the_loop(store_url: str) -> None:
    """A sync commit() in a coroutine, while the loop's own appends are queued, is written directly."""
    store = open_store(store_url)
    try:
        contexts = [Context.open(store, f"s{i}") for i in range(5)]
        sync_ctx = Context.open(store, "sync")
        store._group_committer().steal_after = 30  # type: ignore[attr-defined]
        took: list[float] = []

        async def one(ctx: Context) -> None:
            ctx.incr("n")
            await ctx.acommit()

        async def main() -> None:
            tasks = [asyncio.ensure_future(one(c)) for c in contexts]
            await asyncio.sleep(0)  # they have queued; the leader waits for its turn in the loop
            sync_ctx.incr("n")
            t0 = time.monotonic()
            sync_ctx.commit()  # waiting for the loop's batch would block until steal_after
            took.append(time.monotonic() - t0)
            await asyncio.gather(*tasks)

        asyncio.run(main())
        assert took[0] < 5, f"the commit waited {took[0]:.1f} s for its own, blocked, loop"
        assert [store.head(f"s{i}") for i in range(5)] == [1] * 5 and store.head("sync") == 1
    finally:
        store.close()


@backends
def test_a_thread_takes_over_from_a_loop_that_stopped_running(store_url: str) -> None:
    """A coroutine made leader on a loop that never runs again must not block other threads forever."""
    store = open_store(store_url)
    try:
        committer = store._group_committer()  # type: ignore[attr-defined]
        committer.steal_after = 0.05
        store.create_session("stuck")
        store.create_session("thread")
        loop = asyncio.new_event_loop()
        coro = store.aappend("stuck", 0, [{"op": "set", "var": "x", "value": 1}], author="a")
        task = loop.create_task(coro)
        loop.call_soon(loop.stop)
        loop.run_forever()  # the task queued its entry and was made leader, then the loop stopped
        assert committer._scheduled is not None
        done = threading.Event()

        def append() -> None:
            store.append("thread", 0, [], author="t")
            done.set()

        threading.Thread(target=append, daemon=True).start()
        assert done.wait(10), "the thread waited forever for a loop that does not run"
        assert store.head("stuck") == 1 and store.head("thread") == 1  # the thread wrote both
        loop.run_until_complete(task)  # the coroutine, run again, finds its entry written
        assert task.result().version == 1
        loop.close()
    finally:
        store.close()


@backends
def test_an_entry_whose_loop_closed_does_not_stall_the_committer(store_url: str) -> None:
    store = open_store(store_url)
    try:
        committer = store._group_committer()  # type: ignore[attr-defined]
        store.create_session("blocker")
        store.create_session("orphan")
        store.create_session("later")
        started, gate = _gate_next_write(store)
        holder = threading.Thread(target=lambda: store.append("blocker", 0, [], author="x"))
        holder.start()
        assert started.wait(10)
        loop = asyncio.new_event_loop()
        task = loop.create_task(store.aappend("orphan", 0, [], author="a"))
        loop.call_soon(loop.stop)
        loop.run_forever()  # queued behind the held write
        assert len(committer._queue) == 1
        task._log_destroy_pending = False  # type: ignore[attr-defined]
        loop.close()  # its loop is gone: it can neither be woken nor lead
        gate.set()
        holder.join(10)
        # Leadership passed to the orphan could not reach its loop: it was
        # dropped unwritten (nobody could ever learn its outcome), and the
        # committer went on.
        assert store.head("orphan") == 0 and not committer._queue
        store.append("later", 0, [], author="t")
        assert store.head("later") == 1 and not committer._busy
    finally:
        store.close()


def test_sqlite_moves_recent_events_into_the_events_table_in_bulk(tmp_path: Any) -> None:
    from saucer.store.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "x.db")
    store.fold_every = 7
    try:

        async def session(i: int) -> None:
            ctx = Context.open(store, f"s{i}", snapshot_every=10**6)
            for k in range(20):
                ctx.append("seen", k)
                await ctx.acommit(step=k)
            ctx.close()

        async def main() -> None:
            await asyncio.gather(*(session(i) for i in range(3)))

        asyncio.run(main())
        conn = store._conn
        main_rows = conn.execute("SELECT count(*) FROM events").fetchone()[0]
        recent_rows = conn.execute("SELECT count(*) FROM events_recent").fetchone()[0]
        assert main_rows + recent_rows == 60 and main_rows >= 42 and recent_rows < 7 + 3
        for i in range(3):
            events = list(store.read(f"s{i}"))
            assert [e.version for e in events] == list(range(1, 21))  # in order across both tables
            assert [e.step for e in events] == list(range(20))
            assert Context.open(store, f"s{i}", create=False).get_var("seen") == list(range(20))
            assert Context.open(store, f"s{i}", at=13).get_var("seen") == list(range(13))
    finally:
        store.close()


def test_sqlite_a_fold_that_fails_is_undone_alone_and_the_commit_goes_through(tmp_path: Any) -> None:
    from saucer.store.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "x.db")
    store.fold_every = 3
    try:
        store.create_session("s")
        store.append("s", 0, [], author="w")
        # A hand-edited duplicate of the recent row in the events table makes the move fail.
        store._conn.execute("INSERT INTO events SELECT * FROM events_recent")
        store.append("s", 1, [], author="w")
        with pytest.warns(RuntimeWarning, match="could not move recent events"):
            store.append("s", 2, [], author="w")
        assert store.head("s") == 3
        assert store._conn.execute("SELECT count(*) FROM events_recent").fetchone()[0] == 3
    finally:
        store.close()


def test_sqlite_store_of_schema_1_is_migrated(tmp_path: Any) -> None:
    """A file written before ``events_recent`` existed opens, migrates and reads its old events."""
    import sqlite3

    from saucer.store.sqlite import SCHEMA_VERSION

    path = tmp_path / "old.db"
    with open_store(f"sqlite:///{path}") as store:
        ctx = Context.open(store, "s")
        for _k in range(5):
            ctx.incr("n")
            ctx.commit()
        ctx.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("INSERT INTO events SELECT * FROM events_recent")  # as schema 1 kept them
    conn.execute("DROP TABLE events_recent")
    conn.execute("UPDATE saucer_schema SET version = 1")
    conn.close()
    with open_store(f"sqlite:///{path}") as store:
        assert store._conn.execute("SELECT version FROM saucer_schema").fetchone()[0] == SCHEMA_VERSION  # type: ignore[attr-defined]
        ctx = Context.open(store, "s", create=False)
        assert ctx.get_var("n") == 5
        ctx.incr("n")
        ctx.commit()
        assert [e.version for e in store.read("s")] == list(range(1, 7))
