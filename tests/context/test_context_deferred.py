"""Deferred commits (``acommit_step(defer=True)``): events written with the next commit in ONE
transaction, each with its own version, author, time and meta; all or none; re-based as one."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from saucer.context import Context, ContextNames
from saucer.store import ConflictError, Event, OutcomeUnknownError, open_store
from saucer.store.memory import MemoryStore


def _defer(ctx: Context, **kw: Any) -> int:
    return asyncio.run(_await(ctx.acommit_step(defer=True, **kw)))


async def _await(awaitable: Any) -> int:
    result: int = await awaitable
    return result


class _Counting(MemoryStore):
    """Counts write transactions (one per write_event / write_events call)."""

    def __init__(self) -> None:
        super().__init__()
        self.transactions = 0
        self.fail_after: bool = False

    def write_event(self, event: Event, expected_version: int, fence: int | None) -> None:
        self.transactions += 1
        super().write_event(event, expected_version, fence)

    def write_events(self, events: Sequence[Event], expected_version: int, fence: int | None) -> None:
        self.transactions += 1
        super().write_events(events, expected_version, fence)
        if self.fail_after:
            self.fail_after = False
            raise OutcomeUnknownError(events[0].session_id, events[0].version, "connection reset", event=events[0])


def test_deferred_events_are_written_with_the_next_commit_each_with_its_own_attributes() -> None:
    store = _Counting()
    ctx = Context.open(store, "s", serialise=True)
    ctx.set(ContextNames.MODE, "follower")
    assert _defer(ctx, author="system", meta={"kind": "session_start"}) == 1
    ctx.set(ContextNames.REQUEST, "do it")
    assert _defer(ctx, author="agent:a", round=1, meta={"kind": "round_start"}) == 2
    assert store.transactions == 0 and ctx.version == 0 and ctx.get(ContextNames.REQUEST) == "do it"
    ctx.incr(ContextNames.SESSION_STEP)
    assert asyncio.run(ctx.acommit(author="system", meta={"kind": "session_end"})) == 3
    assert store.transactions == 1 and ctx.version == 3 and ctx.pending == []
    events = list(store.read("s"))
    assert [(e.version, e.author, e.round, e.meta["kind"]) for e in events] == [
        (1, "system", 0, "session_start"),
        (2, "agent:a", 1, "round_start"),
        (3, "system", 0, "session_end"),
    ]
    assert [e.keys() for e in events] == [["MODE"], ["REQUEST"], ["SESSION_STEP"]]
    assert events[0].timestamp <= events[1].timestamp <= events[2].timestamp
    fresh = Context.open(store, "s")
    assert fresh.get(ContextNames.REQUEST) == "do it" and fresh.get(ContextNames.SESSION_STEP) == 1


def test_a_commit_with_nothing_of_its_own_writes_only_the_deferred_events() -> None:
    store = _Counting()
    ctx = Context.open(store, "s")
    ctx.set(ContextNames.MODE, "x")
    _defer(ctx, meta={"kind": "round_end"})
    assert asyncio.run(ctx.acommit()) == 1 and store.transactions == 1
    assert [e.meta for e in store.read("s")] == [{"kind": "round_end"}]
    assert asyncio.run(ctx.acommit()) == 1 and store.transactions == 1  # nothing left


def test_rollback_keeps_the_deferred_events_and_drops_what_came_after() -> None:
    store = _Counting()
    ctx = Context.open(store, "s")
    ctx.set(ContextNames.MODE, "kept")
    _defer(ctx, meta={"kind": "round_end"})
    ctx.set(ContextNames.REQUEST, "dropped")
    ctx.rollback()
    assert ctx.get(ContextNames.MODE) == "kept" and ctx.get(ContextNames.REQUEST) == ""
    assert ctx.commit(meta={"kind": "session_end"}) == 2
    assert [e.meta["kind"] for e in store.read("s")] == ["round_end", "session_end"]
    ctx.reload()  # a reload drops them: nothing is left to write
    assert ctx.pending == [] and ctx.version == 2


def test_abort_writes_the_deferred_events_and_discards_the_unfinished_step() -> None:
    store = _Counting()
    ctx = Context.open(store, "s")
    ctx.set(ContextNames.MODE, "kept")
    _defer(ctx, meta={"kind": "round_end"})
    ctx.set(ContextNames.REQUEST, "half a step")
    ctx.abort()
    events = list(store.read("s"))
    assert [e.meta for e in events] == [{"kind": "round_end"}] and events[0].keys() == ["MODE"]


def test_a_batch_meeting_a_concurrent_writer_is_ordered_after_it_whole() -> None:
    store = MemoryStore()
    engine = Context.open(store, "s", author="engine", serialise=True)
    engine.commit(meta={"kind": "session_start"})
    other = Context.open(store, "s", author="human:me")
    engine.set(ContextNames.SUBTASK, "mine")
    engine.incr("n")
    engine.compare_and_set("flag", None, "engine")  # no longer holds once the other writer sets it: left out
    _defer(engine, meta={"kind": "round_end"})
    engine.incr("n", 10)
    other.update_vars(set={"flag": "theirs"})
    other.incr("n", 100)
    assert other.commit() == 2
    assert asyncio.run(engine.acommit(meta={"kind": "session_end"})) == 4
    first, second = list(store.read("s", 2))
    assert (first.version, first.meta["kind"], second.version, second.meta["kind"]) == (
        3,
        "round_end",
        4,
        "session_end",
    )
    assert first.meta["serialised"] == {
        "based_on": 1,
        "ordered_after": [2],
        "changed": ["vars.flag", "vars.n"],
        "dropped": ["vars.flag"],
    }
    assert "serialised" not in second.meta
    assert first.keys() == ["SUBTASK", "vars.n"] and second.keys() == ["vars.n"]
    fresh = Context.open(store, "s")
    assert (fresh.get_var("n"), fresh.get_var("flag"), fresh.get(ContextNames.SUBTASK)) == (111, "theirs", "mine")


def test_a_plain_context_gets_a_conflict_and_writes_nothing() -> None:
    store = MemoryStore()
    ctx = Context.open(store, "s")
    ctx.commit()
    ctx.set(ContextNames.MODE, "a")
    _defer(ctx, meta={"kind": "round_end"})
    ctx.set(ContextNames.REQUEST, "b")
    other = Context.open(store, "s")
    other.update_vars(set={"x": 2})
    other.commit()
    with pytest.raises(ConflictError):
        ctx.commit(meta={"kind": "session_end"})
    assert store.head("s") == 1 and ctx.version == 0  # (the first commit had nothing to write)


def test_an_unknown_outcome_of_a_batch_is_adopted_whole_never_written_twice() -> None:
    store = _Counting()
    ctx = Context.open(store, "s", serialise=True)
    ctx.set(ContextNames.MODE, "m")
    _defer(ctx, meta={"kind": "round_end"})
    ctx.incr("n")
    store.fail_after = True  # written, then the connection "breaks"
    with pytest.raises(OutcomeUnknownError):
        asyncio.run(ctx.acommit(meta={"kind": "session_end"}))
    assert ctx.version == 0 and store.head("s") == 2
    assert asyncio.run(ctx.acommit()) == 2  # adopts both: nothing is written again
    assert store.head("s") == 2 and ctx.pending == [] and Context.open(store, "s").get_var("n") == 1


def test_snapshots_stay_correct_when_a_batch_crosses_every_k(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    ctx = Context.open(url, "s", serialise=True)
    ctx._snapshots.every = 3  # (a snapshot every 3 events)
    for i in range(4):
        ctx.incr("n")
        _defer(ctx, meta={"i": i})
    ctx.incr("n")
    assert asyncio.run(ctx.acommit()) == 5  # versions 1..5 in one transaction: past K = 3
    with open_store(url) as store:
        snap = store.latest_snapshot("s")
        assert snap is not None and snap.version == 5 and snap.state["vars"]["n"] == 5
        assert [e.version for e in store.read("s")] == [1, 2, 3, 4, 5]
        assert Context.open(store, "s", at=3).get_var("n") == 3
    ctx.close()
