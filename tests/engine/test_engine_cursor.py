"""The resume cursor as a typed, versioned record: written compactly, read back the same, a newer format refused."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tests.support.engine import command_plan
from tests.support.fakes import FakeDispatcher

from saucer.context import Context
from saucer.engine import EngineError, Session
from saucer.engine.accounting import Limits
from saucer.engine.cursor import CURSOR_VERSION, Progress, ResumePoint, cursor_meta
from saucer.store.memory import MemoryStore


def test_a_cursor_round_trips_through_its_stored_form() -> None:
    point = ResumePoint(
        "step",
        3,
        2,
        "follower",
        "CONTINUE",
        Progress(
            rounds=3,
            failed=1,
            requests=4,
            eval_cost=0.5,
            exp_cost=0.25,
            unknown_cost=True,
            error=None,
            stopped="max_step (5) reached",
            reason="r",
        ),
        limit_base=(7, 2),
    )
    stored = point.to_meta()
    assert ResumePoint.from_meta(stored) == point
    # Version 1 is written without "v"; zero counters are left out.
    assert "v" not in stored and CURSOR_VERSION == 1
    assert cursor_meta("start", None, None, None, None, Progress(), Limits()) == {
        "phase": "start",
        "round": None,
        "plan_index": None,
        "agent": None,
        "state": None,
    }


def test_cursors_stored_before_the_record_had_a_version_read_as_version_1() -> None:
    old = {
        "phase": "round_end",
        "round": 1,
        "plan_index": 1,
        "agent": None,
        "state": None,
        "rounds": 2,
        "evaluated": False,
        "limit_base": {"steps": 4, "rounds": 1},
    }
    point = ResumePoint.from_meta(old)
    assert (point.version, point.phase, point.round, point.evaluated, point.limit_base) == (
        1,
        "round_end",
        1,
        False,
        (4, 1),
    )
    assert point.progress.rounds == 2 and point.progress.error is None


@pytest.mark.parametrize("version", [CURSOR_VERSION + 1, 0, "2"])
def test_a_cursor_of_an_unknown_version_is_refused_not_guessed(version: Any) -> None:
    with pytest.raises(EngineError, match="format version"):
        ResumePoint.from_meta({"phase": "step", "round": 0, "v": version})


def test_resuming_a_session_whose_cursor_is_newer_fails_before_writing(settings: Any) -> None:
    store = MemoryStore()
    session = Session(
        "newer", mode="follower", settings=settings, store=store, plan=command_plan(3), dispatcher=FakeDispatcher()
    )
    first = asyncio.run(session.run())
    head = store.head(first.session_id)
    ctx = Context.open(store, first.session_id, create=False)
    ctx.commit(meta={"kind": "session_resume", "cursor": {"phase": "step", "round": 9, "v": CURSOR_VERSION + 1}})
    ctx.close()
    with pytest.raises(EngineError, match=f"format version {CURSOR_VERSION + 1}"):
        asyncio.run(Session.resume(first.session_id, store=store, settings=settings, dispatcher=FakeDispatcher()).run())
    assert store.head(first.session_id) == head + 1  # nothing written by the refused resume
