"""Resume: a follower run killed with SIGKILL and resumed runs no committed step twice;
in-process interruptions, forks, finished sessions; leases refuse a second runner and fence a stale one."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.support.engine import command_plan
from tests.support.fakes import FakeDispatcher

from saucer.context import Context, ContextNames
from saucer.engine import Agent, AgentSet, AgentStatus, LeaseHeldError, Session
from saucer.engine.logs import read_step_log
from saucer.store import SessionNotFoundError, open_store
from saucer.store.memory import MemoryStore

CHILD = Path(__file__).with_name("follower_child.py")
STEPS = 12


def _lines(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _committed_steps(db_url: str, session_id: str) -> list[int]:
    with open_store(db_url) as store:
        return [e.meta["plan_index"] for e in store.read(session_id) if e.meta.get("kind") == "step"]


def test_sigkill_mid_run_then_resume_runs_no_committed_step_twice(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'saucer.db'}"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(command_plan(STEPS, task="killme")))
    lines = tmp_path / "lines.txt"
    sid = "killme-1"
    args = [str(plan), str(lines), str(tmp_path / "logs")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")}
    child = subprocess.Popen(
        [sys.executable, str(CHILD), "run", db_url, sid, *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while len(_lines(lines)) < 5:
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline, "the child made no progress"
        time.sleep(0.005)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL

    at_kill = _lines(lines)
    committed = _committed_steps(db_url, sid)
    c = len(committed)
    assert committed == list(range(c)), "committed steps are a prefix of the plan, in order"
    # The tool records its line before the step commits, so at most one line is ahead of the store:
    # the step that was in flight when the process died.
    assert at_kill == list(range(len(at_kill)))
    assert len(at_kill) in (c, c + 1)
    in_flight = len(at_kill) == c + 1
    print(f"killed with {c} committed steps, {len(at_kill)} tool lines (in flight: {in_flight})")

    out = subprocess.run(
        [sys.executable, str(CHILD), "resume", db_url, sid, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["status"] == "finished" and result["steps"] == STEPS and result["rounds"] == STEPS

    # Exactly: every committed step once, the in-flight step (if any) twice, every later step once.
    expected = list(range(c)) + ([c] if in_flight else []) + list(range(c, STEPS))
    assert _lines(lines) == expected
    assert _committed_steps(db_url, sid) == list(range(STEPS))
    # response.log holds committed steps only: one line per step, none twice, across both runs.
    records = list(read_step_log(result["log_path"]))
    assert [r.plan_index for r in records] == list(range(STEPS))
    with open_store(db_url) as store:
        ctx = Context.open(store, sid, create=False, at=store.head(sid))
        assert ctx.get(ContextNames.SESSION_STEP) == STEPS
        assert sorted(ctx.get(ContextNames.ROUND_STEP)) == list(range(STEPS))
        kinds = [e.meta.get("kind") for e in store.read(sid)]
        assert kinds.count("session_resume") == 1 and kinds[-1] == "session_end"


class Relay(Agent):
    """Three agents pass a token around; ``die_at`` cancels the run while that step is in flight."""

    die_at: int | None = None
    ran: list[str] = []

    async def act(self, context: Context) -> AgentStatus:
        n = context.incr("hops")
        Relay.ran.append(f"{self.name}:{n}")
        if Relay.die_at == n:
            Relay.die_at = None
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(1)
        if n >= 7:
            return AgentStatus.FINISH
        self.handoff = {"a": "b", "b": "c", "c": "a"}[self.name]
        return AgentStatus.CONTINUE


def _relay() -> AgentSet:
    return AgentSet([Relay("a"), Relay("b"), Relay("c")])


def test_resume_mid_round_continues_with_the_right_agent_and_state(settings: Any) -> None:
    store = MemoryStore()
    Relay.ran = []
    Relay.die_at = 5
    session = Session(
        "relay", settings=settings, store=store, request="pass it on", agents=_relay(), session_id="relay-1"
    )
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(session.run())
    assert Relay.ran == ["a:1", "b:2", "c:3", "a:4", "b:5"]
    ctx = Context.open(store, "relay-1", create=False)
    assert ctx.get_var("hops") == 4  # step 5 never committed
    result = asyncio.run(Session.resume("relay-1", store=store, settings=settings, agents=_relay()).run())
    assert result.status == "finished" and result.steps == 7
    # Step 5 (agent b) was in flight: it runs again; steps 1-4 do not.
    assert Relay.ran == ["a:1", "b:2", "c:3", "a:4", "b:5", "b:5", "c:6", "a:7"]
    authors = [e.author for e in store.read("relay-1") if e.meta.get("kind") == "step"]
    assert authors == ["a", "b", "c", "a", "b", "c", "a"]


def test_resuming_a_finished_session_returns_its_result(settings: Any) -> None:
    store = MemoryStore()
    dispatcher = FakeDispatcher()
    first = asyncio.run(
        Session(
            "done", mode="follower", settings=settings, store=store, plan=command_plan(2), dispatcher=dispatcher
        ).run()
    )
    again = asyncio.run(Session.resume(first.session_id, store=store, settings=settings, dispatcher=dispatcher).run())
    assert (again.status, again.steps, again.rounds) == ("finished", 2, 2)
    assert len(dispatcher.ran) == 2


def test_a_fork_resumes_from_where_it_was_forked(settings: Any) -> None:
    store = MemoryStore()
    dispatcher = FakeDispatcher()
    first = asyncio.run(
        Session(
            "fork", mode="follower", settings=settings, store=store, plan=command_plan(4), dispatcher=dispatcher
        ).run()
    )
    # The version right after step 1 (plan index 1) committed.
    version = next(
        e.version for e in store.read(first.session_id) if e.meta.get("kind") == "step" and e.meta["plan_index"] == 1
    )
    parent = Context.open(store, first.session_id, create=False)
    parent.fork("fork-b", at=version).close()
    dispatcher.ran.clear()
    result = asyncio.run(Session.resume("fork-b", store=store, settings=settings, dispatcher=dispatcher).run())
    assert result.status == "finished" and result.steps == 4
    assert [c.parameters["i"] for c in dispatcher.ran] == [2, 3]


def test_a_resume_reads_the_stored_plan_only_when_a_step_needs_it(
    make_settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from saucer.store.base import EventStore

    reads: list[str] = []
    original = EventStore.session_plan
    monkeypatch.setattr(EventStore, "session_plan", lambda self, sid: reads.append(sid) or original(self, sid))
    url = f"sqlite:///{tmp_path / 'plans.db'}"
    dispatcher = FakeDispatcher()
    cut = asyncio.run(
        Session(
            "cut",
            mode="follower",
            settings=make_settings(system__max_step=2),
            store=url,
            plan=command_plan(4),
            dispatcher=dispatcher,
        ).run()
    )
    assert (cut.status, cut.steps) == ("stopped", 2) and reads == []
    resumed = Session.resume(cut.session_id, store=url, settings=make_settings(), dispatcher=dispatcher)
    assert reads == []  # task, mode and workspace are read; the plan is not
    assert resumed.plan is not None and [s.subtask for s in resumed.plan.steps] == [
        s["subtask"] for s in command_plan(4)["steps"]
    ]
    assert reads == [cut.session_id] and resumed.plan is resumed.plan and len(reads) == 1  # read once, then kept
    result = asyncio.run(resumed.run())
    assert (result.status, result.steps) == ("finished", 4)
    assert [c.parameters["i"] for c in dispatcher.ran] == [0, 1, 2, 3]
    # A session that has ended gives its stored result: its plan is never read.
    reads.clear()
    again = asyncio.run(
        Session.resume(cut.session_id, store=url, settings=make_settings(), dispatcher=dispatcher).run()
    )
    assert (again.status, again.steps) == ("finished", 4) and reads == []
    # Resumed with an open store (no probe) and no plan touched before run: read when its first round starts.
    cut2 = asyncio.run(
        Session(
            "cut2",
            mode="follower",
            settings=make_settings(system__max_step=1),
            store=url,
            plan=command_plan(3),
            dispatcher=dispatcher,
        ).run()
    )
    with open_store(url) as store:
        result = asyncio.run(
            Session.resume(cut2.session_id, store=store, settings=make_settings(), dispatcher=dispatcher).run()
        )
    assert (result.status, result.steps) == ("finished", 3) and reads == [cut2.session_id]


def test_a_stored_plan_that_no_longer_parses_stops_a_resume_before_anything_is_written(
    make_settings: Any, tmp_path: Path
) -> None:
    import sqlite3

    from saucer.engine import PlanError

    url = f"sqlite:///{tmp_path / 'bad-plan.db'}"
    dispatcher = FakeDispatcher()
    cut = asyncio.run(
        Session(
            "cut",
            mode="follower",
            settings=make_settings(system__max_step=2),
            store=url,
            plan=command_plan(4),
            dispatcher=dispatcher,
        ).run()
    )
    assert cut.status == "stopped"
    with sqlite3.connect(tmp_path / "bad-plan.db") as conn:
        conn.execute("UPDATE session_meta SET plan = ? WHERE session_id = ?", ('{"steps": 5}', cut.session_id))
    conn.close()
    with open_store(url) as store:
        head = store.session_info(cut.session_id).version
    resumed = Session.resume(cut.session_id, store=url, settings=make_settings(), dispatcher=dispatcher)
    with pytest.raises(PlanError):
        asyncio.run(resumed.run())
    with open_store(url) as store:
        assert store.session_info(cut.session_id).version == head  # nothing written, still 'stopped'
        lease = store.lease_of(cut.session_id)
        assert lease is None or lease.expires_at < time.time()  # and the lease is let go


def test_a_session_that_closed_its_own_store_still_reads_its_plan(make_settings: Any, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'owned.db'}"
    dispatcher = FakeDispatcher()
    done = asyncio.run(
        Session(
            "done", mode="follower", settings=make_settings(), store=url, plan=command_plan(2), dispatcher=dispatcher
        ).run()
    )
    ended = Session.resume(done.session_id, store=url, settings=make_settings(), dispatcher=dispatcher)
    assert asyncio.run(ended.run()).status == "finished"  # its stored result; the plan was not needed
    assert ended.plan is not None and len(ended.plan.steps) == 2  # read after the session closed its store


class _DiesBeforeItsStart(FakeDispatcher):
    """Its runner dies after the session is created, before its start is committed (a worker killed then)."""

    def list_tools(self) -> list[dict[str, Any]]:
        raise asyncio.CancelledError


def test_a_session_whose_runner_died_before_its_start_is_started_by_the_next_run(settings: Any) -> None:
    store = MemoryStore()
    plan = {**command_plan(2, task="early"), "vars": {"greeting": "hi", "who": "plan"}}
    first = Session(
        "early",
        mode="follower",
        settings=settings,
        store=store,
        plan=plan,
        session_id="early-1",
        dispatcher=_DiesBeforeItsStart(),
        context_vars={"who": "caller"},
    )
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(first.run())
    assert store.exists("early-1") and not [e for e in store.read("early-1") if e.meta.get("kind")]

    dispatcher = FakeDispatcher()
    again = Session.resume("early-1", store=store, settings=settings, dispatcher=dispatcher)
    again.context_vars = {"who": "caller"}  # what the queue job holds (the creation meta keeps no variables)
    result = asyncio.run(again.run())
    assert (result.status, result.steps) == ("finished", 2)
    kinds = [e.meta.get("kind") for e in store.read("early-1")]
    assert kinds.count("session_start") == 1 and "session_resume" not in kinds, kinds
    ctx = Context.open(store, "early-1", create=False)
    assert ctx.get_var("greeting") == "hi" and ctx.get_var("who") == "caller"  # the plan's, then the caller's
    assert ctx.get(ContextNames.MODE) == "follower"
    assert [c.parameters["i"] for c in dispatcher.ran] == [0, 1]


def test_resuming_an_unknown_session_raises(settings: Any) -> None:
    with pytest.raises(SessionNotFoundError):
        asyncio.run(Session.resume("nope", store=MemoryStore(), settings=settings).run())


class Slow(Agent):
    async def act(self, context: Context) -> AgentStatus:
        await asyncio.sleep(0.2)
        return AgentStatus.FINISH


def test_a_second_runner_is_refused_with_the_holder_named(settings: Any) -> None:
    store = MemoryStore()

    async def both() -> tuple[Any, BaseException | None]:
        first = Session("leased", settings=settings, store=store, request="go", agents=Slow(), session_id="leased-1")
        task = asyncio.create_task(first.run())
        await asyncio.sleep(0.05)
        error = None
        try:
            await Session.resume("leased-1", store=store, settings=settings, agents=Slow()).run()
        except LeaseHeldError as exc:
            error = exc
        return await task, error, first.owner

    result, error, owner = asyncio.run(both())
    assert result.status == "finished"
    assert isinstance(error, LeaseHeldError)
    assert f"session 'leased-1' is being run by {owner!r}" in str(error)
    assert owner.count(":") == 2 and owner.split(":")[1] == str(os.getpid())
    # Once released, the session can be opened again (it is finished: its stored result).
    again = asyncio.run(Session.resume("leased-1", store=store, settings=settings).run())
    assert again.status == "finished"


def test_a_runner_whose_lease_was_taken_over_cannot_commit(make_settings: Any) -> None:
    settings = make_settings(**{"store.lease_ttl": 0.2})
    store = MemoryStore()

    class Blocker(Agent):
        async def act(self, context: Context) -> AgentStatus:
            n = context.incr("n")
            if n == 2:
                time.sleep(0.3)  # blocks the loop: no renewal, the lease expires
                store.acquire_lease("fenced-1", "intruder:1:x", 30)
            return AgentStatus.FINISH if n >= 3 else AgentStatus.CONTINUE

    result = asyncio.run(
        Session("fenced", settings=settings, store=store, request="go", agents=Blocker(), session_id="fenced-1").run()
    )
    assert result.status == "error"
    assert "intruder:1:x" in result.error
    ctx = Context.open(store, "fenced-1", create=False)
    assert ctx.get_var("n") == 1  # step 2's commit was refused


class _ClosingStore(MemoryStore):
    """Records how a run gives its lease back; ``fail_snapshot``: its last snapshot cannot be written."""

    def __init__(self, *, fail_snapshot: bool = False) -> None:
        super().__init__()
        self.fail_snapshot = fail_snapshot
        self.calls: list[str] = []

    def save_snapshot_released(self, snapshot: Any, keep: int, lease: Any) -> None:
        self.calls.append("snapshot+release")
        if self.fail_snapshot:
            raise OSError("disk full")
        self.save_snapshot_pruned(snapshot, keep)
        super().release_lease(lease)  # as one statement would: not recorded as a release of its own

    def release_lease(self, lease: Any) -> None:
        self.calls.append("release")
        super().release_lease(lease)


@pytest.mark.parametrize("fail_snapshot", [False, True])
def test_a_run_gives_its_lease_back_with_its_last_snapshot_or_alone(settings: Any, fail_snapshot: bool) -> None:
    store = _ClosingStore(fail_snapshot=fail_snapshot)
    session = Session(
        "close", mode="follower", settings=settings, store=store, plan=command_plan(1), dispatcher=FakeDispatcher()
    )
    if fail_snapshot:
        with pytest.warns(RuntimeWarning, match="snapshot at version"):
            result = asyncio.run(session.run())
    else:
        result = asyncio.run(session.run())
    assert result.status == "finished"
    # One call gives both back (one statement on PostgreSQL); when the snapshot fails, the lease goes alone.
    assert store.calls == (["snapshot+release", "release"] if fail_snapshot else ["snapshot+release"])
    lease = store.lease_of(result.session_id)
    assert lease is not None and lease.expires_at <= time.time()  # free at once
    assert store.acquire_lease(result.session_id, "next:1:x", 30).owner == "next:1:x"
