"""The SQLite store's single append: one UPDATE that checks the head (and the lease token) and
counts the summary in SQL, then the event's INSERT. Its counters must be what
:func:`saucer.store.summary.apply` counts (the memory store's, in Python) for every shape of delta,
and a refused append must say why, as the store did when it read the row first."""

from __future__ import annotations

from pathlib import Path

import pytest

from saucer.store import ConflictError, FencedError, SessionNotFoundError
from saucer.store.memory import MemoryStore
from saucer.store.sqlite import SQLiteStore
from saucer.store.summary import SummaryDelta

DELTAS: list[SummaryDelta | None] = [
    None,
    SummaryDelta("running"),
    SummaryDelta(rounds_add=2),
    SummaryDelta(cost_add=0.25),
    SummaryDelta(cost_add=0.1, unknown=True),
    SummaryDelta("failed", reason="x" * 700),  # cut to REQUEST_CHARS
    SummaryDelta(reason=""),
    SummaryDelta("finished", final_rounds=3, final_steps=2, final_cost=1.5),
    SummaryDelta(final_cost=0.0, unknown=True),
    SummaryDelta(final_cost=2.0),  # a known total again
    SummaryDelta(rounds_add=1, cost_add=0.5, reason="ok"),
]
STEPS: list[int | None] = [None, 5, 3, True, 9, None, 2**62, 1, 4, None, 12]


def test_every_shape_of_delta_counts_as_apply_does(tmp_path: Path) -> None:
    sqlite = SQLiteStore(tmp_path / "s.db")
    memory = MemoryStore()
    try:
        tokens = {}
        for store in (sqlite, memory):
            store.create_session("s", meta={"status": "created"})
            store.create_session("f", meta={})
            tokens[store] = store.acquire_lease("f", "me", 60.0).token
        for i, (delta, step) in enumerate(zip(DELTAS, STEPS, strict=True)):
            for store in (sqlite, memory):
                store.append("s", i, [{"op": "set", "var": "x", "value": i}], author="a", step=step, summary=delta)
                store.append("f", i, [], author="a", round=i, step=i, summary=delta, fence=tokens[store])
            assert sqlite.kept_counters("s") == memory.kept_counters("s"), (delta, step)
        for sid in ("s", "f"):
            assert sqlite.kept_counters(sid) == memory.kept_counters(sid)
            assert sqlite.head(sid) == memory.head(sid) == len(DELTAS)
            assert [(e.round, e.step, e.ops) for e in sqlite.read(sid)] == [
                (e.round, e.step, e.ops) for e in memory.read(sid)
            ]
    finally:
        sqlite.close()


def test_a_refused_append_says_why_and_writes_nothing(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    try:
        store.create_session("s", meta={})
        store.append("s", 0, [], author="a")
        with pytest.raises(ConflictError):
            store.append("s", 0, [], author="a")
        with pytest.raises(SessionNotFoundError):
            store.append("nobody", 0, [], author="a")
        lease = store.acquire_lease("s", "me", 60.0)
        with pytest.raises(FencedError):
            store.append("s", 1, [], author="a", fence=lease.token + 1)
        store.append("s", 1, [], author="a", fence=lease.token)
        assert store.head("s") == 2
        assert [e.version for e in store.read("s")] == [1, 2]
    finally:
        store.close()


def test_make_event_is_the_events_own_constructor() -> None:
    from dataclasses import fields

    from saucer.store.model import Event, make_event
    from saucer.store.summary import SummaryDelta as Delta

    values = ("s", 3, 1.5, "me", 2, None, [{"op": "set", "var": "x", "value": 1}], {"kind": "step"}, Delta("running"))
    assert len(fields(Event)) == len(values)  # a field added to Event must be added to make_event too
    made = make_event(*values)
    assert made == Event(*values) and type(made) is Event
    assert [getattr(made, f.name) for f in fields(Event)] == list(values)
