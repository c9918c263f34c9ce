"""Pending approvals (saucer.engine.approvals): the fold, decisions and their races, the wait, and a
session with nobody at a terminal (a queue worker's interactor) waiting for one."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from saucer.engine.approvals import (
    ApprovalError,
    ApprovalNotFound,
    approvals_of,
    decide,
    pending_approvals,
    read_approvals,
    request_approval,
    request_question,
    wait_for_decision,
)
from saucer.engine.factory import SessionFactory
from saucer.engine.interactor import NonInteractiveInteractor
from saucer.store import EventStore, open_store
from saucer.store.memory import MemoryStore

POSTGRES_ENV = "SAUCER_TEST_POSTGRES_URL"


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EventStore]:
    """An empty store of each backend (PostgreSQL: a schema of its own, dropped afterwards)."""
    if request.param == "memory":
        url = f"memory://approvals-{uuid.uuid4().hex}"
    elif request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/a.db"
    else:
        base = os.environ.get(POSTGRES_ENV)
        if not base:
            if os.environ.get("CI") == "true":
                pytest.fail(f"{POSTGRES_ENV} is not set under CI=true")
            pytest.skip(f"set {POSTGRES_ENV}=postgresql://postgres@127.0.0.1:5432/test to run the PostgreSQL leg")
        schema = "t_" + uuid.uuid4().hex[:12]
        url = f"{base}{'&' if '?' in base else '?'}schema={schema}"
    opened = open_store(url)
    try:
        yield opened
    finally:
        opened.close()
        if request.param == "postgresql":
            import psycopg
            from psycopg import sql

            with psycopg.connect(os.environ[POSTGRES_ENV], autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _session(store: EventStore, sid: str = "s") -> str:
    store.create_session(sid, meta={"status": "running"})
    store.append(sid, 0, [{"op": "set", "var": "x", "value": 1}], author="agent")
    return sid


def _ask(store: EventStore, sid: str = "s", timeout: float | None = 60) -> Any:
    return request_approval(
        store,
        sid,
        action="run shell.run",
        detail='{"command": "rm -f x"}',
        reason="command 'rm -f x' matches sensitive pattern 'rm *'",
        timeout=timeout,
    )


def test_requests_and_decisions_fold_into_approvals_the_first_decision_counts(store: EventStore) -> None:
    sid = _session(store)
    first, second = _ask(store), _ask(store)
    assert (first.number, second.number) == (2, 3)  # the request's version: unique without a counter
    assert [a.status for a in pending_approvals(store, [sid])] == ["pending", "pending"]
    decide(store, sid, first.number, status="approved", author="user:alice")
    # A decision written around decide() (a second writer racing) is in the log but does not count.
    store.append(
        sid,
        store.head(sid),
        [],
        author="user:bob",
        meta={"kind": "approval_decision", "approval": {"number": first.number, "status": "refused"}},
    )
    decide(store, sid, second.number, status="refused", author="user:bob", note="not now")
    got = read_approvals(store, sid)
    assert [(a.number, a.status, a.decided_by, a.note) for a in got] == [
        (2, "approved", "user:alice", None),
        (3, "refused", "user:bob", "not now"),
    ]
    assert got[1].refusal() == f"refused by user:bob (approval 3 of session {sid}): not now"
    assert approvals_of(store.read(sid)) == got
    assert pending_approvals(store, [sid]) == []
    assert store.session_info(sid).version == 6  # nothing else was written, no state changed
    assert [e.ops for e in store.read(sid)][1:] == [[], [], [], [], []]


def test_a_question_is_answered_not_approved_and_an_approval_not_answered(store: EventStore) -> None:
    sid = _session(store)
    approval, question = _ask(store), request_question(store, sid, "Which file?", author="linux", timeout=60)
    assert (question.kind, question.detail, question.requested_by, approval.kind) == (
        "question",
        "Which file?",
        "linux",
        "approval",
    )
    for status in ("approved", "refused"):
        with pytest.raises(
            ApprovalError,
            match=r"^3 of session 's' is a question, not an approval: answer it \(saucer answer s 3 TEXT\)$",
        ):
            decide(store, sid, question.number, status=status, author="u")  # type: ignore[arg-type]
    with pytest.raises(ApprovalError, match=r"^2 of session 's' is an approval, not a question: approve or refuse it$"):
        decide(store, sid, approval.number, status="answered", author="u", note="yes")
    with pytest.raises(ApprovalError, match=r"^the answer must not be blank$"):
        decide(store, sid, question.number, status="answered", author="u", note="")
    with pytest.raises(ApprovalError, match=r"^the answer has 10001 characters; at most 10000 are taken$"):
        decide(store, sid, question.number, status="answered", author="u", note="x" * 10_001)
    with pytest.raises(ApprovalNotFound, match=r"^session 's' has no question 99$"):
        decide(store, sid, 99, status="answered", author="u", note="x")
    answered = decide(store, sid, question.number, status="answered", author="user:ana", note="notes.txt")
    assert (answered.status, answered.answer, answered.reply()) == (
        "answered",
        "notes.txt",
        "the user (user:ana) answered: notes.txt",
    )
    assert [a.status for a in read_approvals(store, sid)] == ["pending", "answered"]
    later = request_question(store, sid, "And then?", timeout=60)
    store.append(sid, store.head(sid), [], author="system", meta={"kind": "session_end", "session_status": "failed"})
    with pytest.raises(ApprovalError, match=r"has ended \(failed\); its question 5 can no longer be answered$"):
        decide(store, sid, later.number, status="answered", author="u", note="x")


def test_a_participants_session_takes_answers_from_its_participants_only(store: EventStore) -> None:
    store.create_session("p", meta={"status": "running"}, participants=["user:alice"])
    question = request_question(store, "p", "Which file?", timeout=60)
    with pytest.raises(ApprovalError, match=r"^'user:bob' is not a participant of session 'p', so nothing was written"):
        decide(store, "p", question.number, status="answered", author="user:bob", note="secrets.txt")
    assert read_approvals(store, "p")[0].pending and store.head("p") == question.number  # nothing was written
    assert (
        decide(store, "p", question.number, status="answered", author="user:alice", note="notes.txt").answer
        == "notes.txt"
    )


def test_decide_says_what_is_wrong_in_one_sentence(store: EventStore) -> None:
    sid = _session(store)
    approval = _ask(store)
    cases: list[tuple[Any, type[Exception], str]] = [
        (
            lambda: decide(store, "nosuch", 1, status="approved", author="u"),
            ApprovalNotFound,
            "no session 'nosuch' in this store",
        ),
        (
            lambda: decide(store, sid, 99, status="approved", author="u"),
            ApprovalNotFound,
            f"session '{sid}' has no approval 99",
        ),
        (
            lambda: decide(store, sid, 1, status="approved", author="u"),
            ApprovalNotFound,
            f"session '{sid}' has no approval 1",
        ),
    ]
    for call, kind, message in cases:
        with pytest.raises(kind) as caught:
            call()
        assert str(caught.value) == message
    with pytest.raises(ApprovalNotFound):
        read_approvals(store, "nosuch")
    decide(store, sid, approval.number, status="timed_out", author="system")
    with pytest.raises(ApprovalError, match=r"^approval 2 of session 's' was already timed out$"):
        decide(store, sid, approval.number, status="approved", author="u")
    later = _ask(store)
    store.append(sid, store.head(sid), [], author="system", meta={"kind": "session_end", "session_status": "failed"})
    with pytest.raises(ApprovalError, match=r"has ended \(failed\); its approval 4 can no longer run$"):
        decide(store, sid, later.number, status="approved", author="u")
    cancelled = _session(store, "c")
    number = _ask(store, cancelled).number
    store.append(
        cancelled,
        store.head(cancelled),
        [],
        author="system",
        meta={"kind": "session_end", "session_status": "cancelled"},
    )
    with pytest.raises(ApprovalError, match=r"has ended \(cancelled\)"):  # a service session its owner cancelled
        decide(store, cancelled, number, status="approved", author="u")


def test_two_people_deciding_at_once_make_one_decision() -> None:
    store = MemoryStore()
    sid = _session(store)
    approval = _ask(store)
    outcomes: list[str] = []
    start = threading.Barrier(8)

    def person(i: int) -> None:
        start.wait()
        try:
            decide(store, sid, approval.number, status="approved" if i % 2 else "refused", author=f"user:{i}")
            outcomes.append("decided")
        except ApprovalError as exc:
            assert "was already" in str(exc)
            outcomes.append("too late")

    threads = [threading.Thread(target=person, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["decided"] + ["too late"] * 7
    assert sum(1 for e in store.read(sid) if e.meta.get("kind") == "approval_decision") == 1


def test_the_wait_wakes_on_a_decision_and_turns_into_a_refusal_at_its_timeout(store: EventStore) -> None:
    sid = _session(store)

    async def main() -> tuple[Any, float, Any]:
        approval = _ask(store, sid, timeout=30)
        loop = asyncio.get_running_loop()
        loop.call_later(
            0.3,
            lambda: threading.Thread(
                target=decide, args=(store, sid, approval.number), kwargs={"status": "approved", "author": "user:alice"}
            ).start(),
        )
        began = time.monotonic()
        decided = await wait_for_decision(store, approval, interval=0.05)
        took = time.monotonic() - began
        late = _ask(store, sid, timeout=0.3)
        return decided, took, await wait_for_decision(store, late, interval=0.05)

    decided, took, timed_out = asyncio.run(main())
    assert decided.status == "approved" and decided.decided_by == "user:alice" and took < 10
    assert timed_out.status == "timed_out" and timed_out.decided_by == "system"
    assert (
        timed_out.refusal()
        == f"refused by timeout: nobody decided on approval {timed_out.number} of session {sid} within 0.3 s"
    )
    assert [a.status for a in read_approvals(store, sid)] == ["approved", "timed_out"]


def _rm_plan(path: Path) -> Path:
    path.write_text(
        '{"task": "tidy", "steps": [{"subtask": "rm", "commands": '
        '[{"tool_name": "shell.run", "parameters": {"command": "rm -f junk.txt"}}]}]}'
    )
    return path


def test_a_session_nobody_can_ask_waits_for_an_approval_then_runs(make_settings: Any, tmp_path: Path) -> None:
    """A queue worker's interactor (NonInteractiveInteractor): the sensitive step waits instead of being refused."""
    store = MemoryStore()
    (tmp_path / "junk.txt").write_text("junk")
    factory = SessionFactory(
        make_settings(**{"approvals.timeout": 60}),
        store=store,
        interactor=NonInteractiveInteractor(),
        workspace=tmp_path,
    )
    [session] = factory.create_session("tidy", "follower", plan=_rm_plan(tmp_path / "plan.json"), session_id="w1")

    async def approver() -> None:
        while True:
            waiting = await asyncio.to_thread(pending_approvals, store, ["w1"]) if store.exists("w1") else []
            if waiting:
                assert (tmp_path / "junk.txt").exists()  # nothing ran while it waits
                await asyncio.to_thread(decide, store, "w1", waiting[0].number, status="approved", author="user:ops")
                return
            await asyncio.sleep(0.05)

    async def main() -> Any:
        helper = asyncio.create_task(approver())
        result = await session.run()
        await helper
        return result

    result = asyncio.run(main())
    assert result.status == "finished", result.reason
    assert not (tmp_path / "junk.txt").exists()


def test_a_zero_timeout_refuses_at_once_as_before(make_settings: Any, tmp_path: Path) -> None:
    store = MemoryStore()
    (tmp_path / "junk.txt").write_text("junk")
    factory = SessionFactory(
        make_settings(**{"approvals.timeout": 0}),
        store=store,
        interactor=NonInteractiveInteractor(),
        workspace=tmp_path,
    )
    [session] = factory.create_session("tidy", "follower", plan=_rm_plan(tmp_path / "plan.json"), session_id="w0")
    result = asyncio.run(session.run())
    assert result.status == "failed" and (tmp_path / "junk.txt").exists()
    assert read_approvals(store, "w0") == []  # nothing waited


def test_only_participants_decide_in_a_session_that_declares_them(store: EventStore) -> None:
    store.create_session("p", meta={"status": "running"}, participants=["user:alice"])
    approval = _ask(store, "p")
    with pytest.raises(ApprovalError) as caught:
        decide(store, "p", approval.number, status="approved", author="user:mallory")
    assert str(caught.value) == (
        "'user:mallory' is not a participant of session 'p', so nothing was written "
        "(a participant can add it: Context.add_participants)"
    )
    assert read_approvals(store, "p")[0].pending and store.head("p") == approval.number  # nothing was written
    assert decide(store, "p", approval.number, status="refused", author="user:alice").decided_by == "user:alice"
