"""SessionPool: 20 sessions at concurrency 4, 2 of them fail, 18 succeed; isolation, order, bounds."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

from rich.console import Console
from tests.support.engine import command_plan
from tests.support.fakes import FakeDispatcher

from saucer.context import Context, ContextNames
from saucer.engine import Session, SessionPool
from saucer.store import open_store


class ConcurrencyProbe:
    """Counts sessions running at once (through the observer hooks)."""

    def __init__(self) -> None:
        self.running = 0
        self.peak = 0
        self.started: list[str] = []
        self.ended: list[tuple[str, str]] = []

    def on_session_start(self, session: Any) -> None:
        self.running += 1
        self.peak = max(self.peak, self.running)
        self.started.append(session.session_id)

    def on_session_end(self, session: Any, result: Any) -> None:
        if session.session_id in self.started:
            self.running -= 1
        self.ended.append((session.session_id, result.status))


def test_pool_of_20_at_concurrency_4_with_2_failures(make_settings: Any, tmp_path: Path) -> None:
    settings = make_settings(**{"store.url": f"sqlite:///{tmp_path / 'pool.db'}"})
    store = open_store(settings.store.url)
    sessions = []
    for i in range(20):
        plan = command_plan(3, task=f"t{i}", fail_at=1 if i == 7 else None)
        sessions.append(
            Session(
                f"pool-{i}",
                mode="follower",
                settings=settings,
                store=store,
                plan=plan,
                session_id=f"pool-{i}",
                dispatcher=FakeDispatcher(fail=("broken",), delay=0.003),
            )
        )
    # Session 13 is not this pool's to run: another runner holds its lease.
    store.create_session("pool-13", meta={"task": "pool-13", "mode": "follower"})
    store.acquire_lease("pool-13", "elsewhere:1:abc", 60)
    sessions[13] = Session.resume("pool-13", store=store, settings=settings, dispatcher=FakeDispatcher())
    probe = ConcurrencyProbe()
    out = io.StringIO()
    pool = SessionPool(sessions, max_concurrency=4, observer=probe, progress=True, console=Console(file=out, width=120))
    results = asyncio.run(pool.run_all())

    assert [r.session_id for r in results] == [f"pool-{i}" for i in range(20)]  # input order
    statuses = [r.status for r in results]
    assert statuses.count("finished") == 18
    assert statuses[7] == "failed" and "broken failure" in results[7].reason
    assert statuses[13] == "skipped" and "claimed by another run" in results[13].reason
    assert "elsewhere:1:abc" in results[13].reason
    assert pool.counts() == {"finished": 18, "failed": 1, "skipped": 1}
    assert probe.peak == 4  # concurrent, and never more than 4 at once
    assert len(probe.ended) == 20
    for r in results:
        if r.ok:
            ctx = Context.open(store, r.session_id, create=False)
            assert ctx.get(ContextNames.SESSION_STEP) == 3 and r.steps == 3
    table = io.StringIO()
    Console(file=table, width=200).print(pool.summary_table())
    text = table.getvalue()
    assert "20 session(s): failed 1, finished 18, skipped 1" in text and "pool-13" in text
    assert "20/20" in out.getvalue()  # the progress bar reached the end
    store.close()


class OverlapDispatcher(FakeDispatcher):
    """A FakeDispatcher that counts the commands in flight at once (each waits ``delay`` seconds)."""

    def __init__(self, counter: dict[str, int]) -> None:
        super().__init__(delay=0.05)
        self.counter = counter

    async def execute_commands(self, commands: Any, timeout: float | None = None) -> Any:
        self.counter["now"] += 1
        self.counter["peak"] = max(self.counter["peak"], self.counter["now"])
        try:
            return await super().execute_commands(commands, timeout)
        finally:
            self.counter["now"] -= 1


def test_pool_runs_sessions_concurrently_not_one_by_one(settings: Any) -> None:
    counter = {"now": 0, "peak": 0}
    sessions = [
        Session(
            f"c{i}", mode="follower", settings=settings, plan=command_plan(2), dispatcher=OverlapDispatcher(counter)
        )
        for i in range(8)
    ]
    pool = SessionPool(sessions, max_concurrency=8)
    results = asyncio.run(pool.run_all())
    assert all(r.ok for r in results)
    # One by one, never more than one command would wait at a time (the wall time is not asserted: under
    # load it says more about the machine than about the pool).
    assert counter["peak"] > 1, counter
