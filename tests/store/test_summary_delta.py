"""The summary delta a commit carries (saucer.store.summary.SummaryDelta): its stored form, how it
counts, and that the engine's deltas and the upcast ones of older records mean the same."""

from __future__ import annotations

from typing import Any

import pytest

from saucer.engine.summaries import summary_of
from saucer.store.summary import Counters, SummaryDelta, apply
from saucer.store.upcast import summary_of_v5_meta

METAS: list[dict[str, Any]] = [
    {},
    {"kind": "session_start", "session_status": "running"},
    {"kind": "step", "session_status": "running", "cost": 0.25},
    {"kind": "step", "cost": None},
    {"kind": "step", "cost": True},  # not a number: counts nothing
    {"kind": "round_end", "cost": 9.0, "reason": "round 1 ok", "session_status": "running"},
    {"kind": "evaluation", "cost": 0.5},
    {"kind": "vars", "session_status": "finished", "reason": "carried", "summary": {"rounds": 3}},
    {
        "kind": "session_end",
        "session_status": "failed",
        "reason": "meta's",
        "summary": {"rounds": 2, "steps": 5, "cost": 1.5, "reason": "its own"},
        "cost_summary": {"unknown": True},
    },
    {"kind": "session_end", "session_status": "stopped", "summary": {"cost": None, "steps": "x"}},
    {"kind": "approval_request", "approval": {"kind": "question"}},
    # Status-only deltas (most steps): shared between commits, equal to a fresh one.
    {"kind": "step", "session_status": "running", "cost": 0.0},
    {"kind": "step", "session_status": "running", "cost": 0.0, "reason": ""},
    {"kind": "session_end", "session_status": "finished", "summary": "not a mapping"},
    {"session_status": 7},
]


@pytest.mark.parametrize("meta", METAS)
def test_the_engines_delta_is_what_an_older_record_of_the_same_meta_is_upcast_to(meta: dict[str, Any]) -> None:
    engine = summary_of(meta)
    upcast = SummaryDelta.from_wire(summary_of_v5_meta(meta))
    assert engine == upcast
    assert SummaryDelta.from_wire(engine.to_wire()) == engine  # the stored form keeps it whole


def test_the_stored_form_leaves_out_defaults_and_a_bad_field_reads_as_its_default() -> None:
    assert SummaryDelta().to_wire() == {}
    assert SummaryDelta("running", rounds_add=1).to_wire() == {"status": "running", "rounds_add": 1}
    assert SummaryDelta.from_wire(None) is None and SummaryDelta.from_wire([1]) is None
    odd = SummaryDelta.from_wire({"status": 3, "rounds_add": "1", "cost_add": 0.5, "unknown": 1, "final_cost": "9"})
    assert odd == SummaryDelta(cost_add=0.5)  # a damaged summary never makes a record unreadable


def test_apply_counts_steps_from_the_event_and_the_rest_from_the_delta() -> None:
    c = apply(Counters("running"), 4, SummaryDelta(cost_add=0.5, reason="r"))
    assert c == Counters("running", 0, 4, 0.5, False, "r")
    c = apply(c, 2, None)  # steps never go back; no delta: the reason is gone, the rest stays
    assert c == Counters("running", 0, 4, 0.5, False, None)
    c = apply(c, True, SummaryDelta(unknown=True, rounds_add=1))  # type: ignore[arg-type]  # a bool is no step
    assert (c.steps, c.rounds, c.cost_unknown) == (4, 1, True)
    c = apply(c, None, SummaryDelta("finished", final_rounds=3, final_steps=7, final_cost=2.0))
    assert c == Counters("finished", 3, 7, 2.0, False, None)  # final figures replace, and are known


@pytest.mark.parametrize("status", [None, "running", "finished", "failed", "error", "stopped", "not started", "odd"])
def test_the_listings_sql_says_interrupted_exactly_where_listed_status_does(status: str | None) -> None:
    import sqlite3

    from saucer.store.summary import listed_sql, listed_status

    sql_status, sql_runner = listed_sql("?")
    with sqlite3.connect(":memory:") as conn:
        conn.execute("CREATE TABLE s (status TEXT)")
        conn.execute("CREATE TABLE l (owner TEXT, expires_at REAL)")
        conn.execute("INSERT INTO s VALUES (?)", (status,))
        for lease in (None, ("w", 50.0), ("w", 150.0)):  # none, expired, live (now = 100)
            conn.execute("DELETE FROM l")
            if lease is not None:
                conn.execute("INSERT INTO l VALUES (?, ?)", lease)
            row = conn.execute(f"SELECT {sql_status}, {sql_runner} FROM s LEFT JOIN l ON 1", (100.0, 100.0)).fetchone()
            expected = listed_status(status, *(lease or (None, None)), 100.0)
            assert tuple(row) == expected, (status, lease)
