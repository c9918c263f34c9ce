"""The SQLite store and the event loop: coroutines' commits are written by the committer's writer
thread, so the loop runs on while a batch waits for its fsync; a lease release and a snapshot are
written without an fsync of their own, and the connection is back at ``synchronous=FULL`` after them."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from saucer.context import Context
from saucer.store import open_store
from saucer.store.base import Snapshot
from saucer.store.sqlite import SQLiteStore


def _synchronous(store: SQLiteStore) -> int:
    with store._lock:
        return int(store._conn.execute("PRAGMA synchronous").fetchone()[0])


def test_the_loop_runs_on_while_a_coroutine_commit_is_written(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'x.db'}")
    assert isinstance(store, SQLiteStore)
    committer = store._group_committer()
    started, gate = threading.Event(), threading.Event()
    original = committer._write_one

    def held(entry: Any) -> None:
        started.set()
        assert gate.wait(30)
        original(entry)

    committer._write_one = held
    try:
        ctx = Context.open(store, "s", author="a")
        ticks: list[str] = []

        async def main() -> int:
            ctx.incr("n")
            commit = asyncio.ensure_future(ctx.acommit())
            while not started.is_set():
                await asyncio.sleep(0.005)
            assert not commit.done()
            # The write is blocked in the writer thread: the loop still runs other work.
            for _ in range(3):
                await asyncio.sleep(0)
                ticks.append(threading.current_thread().name)
            gate.set()
            return await commit

        version = asyncio.run(main())
        assert version == 1 and store.head("s") == 1
        assert ticks == [threading.main_thread().name] * 3
    finally:
        gate.set()
        store.close()


def test_a_lease_release_and_a_snapshot_leave_the_connection_at_synchronous_full(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'x.db'}")
    assert isinstance(store, SQLiteStore)
    try:
        ctx = Context.open(store, "s", author="a")
        ctx.incr("n")
        ctx.commit()
        assert _synchronous(store) == 2  # FULL
        lease = store.acquire_lease("s", "runner-1", 30.0)
        store.release_lease(lease)
        assert _synchronous(store) == 2
        # Released at once: another owner takes it without waiting for the expiry.
        assert store.acquire_lease("s", "runner-2", 30.0).owner == "runner-2"
        store.save_snapshot(Snapshot("s", 1, 0.0, {"n": 1}))
        assert _synchronous(store) == 2
    finally:
        store.close()
    reopened = open_store(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        held = reopened.lease_of("s")
        assert held is not None and held.owner == "runner-2"
    finally:
        reopened.close()
