"""Participants (issue 26): a session that declares who may write refuses every other
author, on every backend (memory, SQLite, PostgreSQL), with one sentence and nothing written."""

from __future__ import annotations

import pytest

from saucer.context import Context
from saucer.store import NotParticipantError, open_store


def _declared(store_url: str, *names: str) -> None:
    with open_store(store_url) as store:
        store.create_session("s", meta={"task": "t"}, participants=list(names))


def test_a_non_participant_is_refused_in_one_sentence_and_nothing_is_written(store_url: str) -> None:
    _declared(store_url, "human:alice")
    alice = Context.open(store_url, "s", author="human:alice")
    alice.update_vars(set={"x": 1})
    assert alice.commit() == 1
    eve = Context.open(store_url, "s", author="human:eve")
    eve.update_vars(set={"x": 666})
    with pytest.raises(NotParticipantError) as info:
        eve.commit()
    message = str(info.value)
    assert "'human:eve'" in message and "'s'" in message and message.count(". ") == 0
    assert eve.pending  # kept, as after any failed commit
    # Eve cannot let herself in either.
    eve.rollback()
    with pytest.raises(NotParticipantError):
        eve.add_participants("human:eve")
        eve.commit()
    with open_store(store_url) as store:
        assert store.head("s") == 1 and [e.author for e in store.read("s")] == ["human:alice"]
    assert Context.open(store_url, "s").get_var("x") == 1
    for ctx in (alice, eve):
        ctx.abort()


def test_a_participant_adds_another_and_the_runner_always_writes(store_url: str) -> None:
    _declared(store_url, "human:alice")
    bob = Context.open(store_url, "s", author="human:bob")
    bob.update_vars(set={"bob": True})
    with pytest.raises(NotParticipantError):
        bob.commit()
    bob.rollback()
    alice = Context.open(store_url, "s", author="human:alice")
    alice.add_participants("human:bob", "human:alice")  # alice is one already: only bob is added
    assert alice.commit() == 1
    assert alice.participants == {"human:alice", "human:bob"}
    assert [e.author for e in alice.history("vars.saucer.participants")] == ["human:alice"]
    bob.reload()
    bob.update_vars(set={"bob": True})
    assert bob.commit() == 2
    # The session's runner (its lease token) is not named, and writes.
    with open_store(store_url) as store:
        lease = store.acquire_lease("s", "runner", 30)
        runner = Context.open(store, "s", author="follower", fence=lease.token)
        runner.update_vars(set={"ran": True})
        assert runner.commit() == 3
        runner.close()
    for ctx in (alice, bob):
        ctx.close()


def test_a_participant_removed_meanwhile_is_refused_after_the_rebase(store_url: str) -> None:
    _declared(store_url, "human:alice")
    alice = Context.open(store_url, "s", author="human:alice")
    alice.add_participants("human:bob")
    alice.commit()
    bob = Context.open(store_url, "s", author="human:bob", serialise=True)  # sees himself added (v1)
    bob.update_vars(set={"late": True})
    alice.update_vars(set={"saucer.participants": []})  # removed, at v2
    alice.commit()
    with pytest.raises(NotParticipantError):
        bob.commit()  # based on v1, where he was one: re-based on v2, checked again
    with open_store(store_url) as store:
        assert store.head("s") == 2
    alice.close()
    bob.abort()


def test_a_session_that_declares_none_is_open_to_every_writer(store_url: str) -> None:
    ctx = Context.open(store_url, "open", author="anyone")
    ctx.update_vars(set={"a": 1})
    assert ctx.commit() == 1
    assert ctx.participants is None
    with pytest.raises(ValueError, match="declares no participants"):
        ctx.add_participants("x")
    ctx.close()


def test_a_refused_first_commit_leaves_no_empty_session_behind(store_url: str) -> None:
    ctx = Context.open(store_url, "new", author="human:eve", participants=["human:alice"])
    ctx.update_vars(set={"a": 1})
    with pytest.raises(NotParticipantError):
        ctx.commit()
    with open_store(store_url) as store:
        assert not store.exists("new")
    # The Context stays usable: as another author, its next commit makes the session again.
    ctx.author = "human:alice"
    assert ctx.commit() == 1
    ctx.close()
    with open_store(store_url) as store:
        assert store.session_info("new").participants == {"human:alice"}


def test_participants_given_to_open_an_existing_session_are_not_silently_ignored(store_url: str) -> None:
    _declared(store_url, "human:alice")
    same = Context.open(store_url, "s", author="human:alice", participants=["human:alice"])  # as declared: fine
    same.close()
    with pytest.raises(ValueError, match="exists, and its participants were declared when it was made"):
        Context.open(store_url, "s", author="human:eve", participants=["human:eve"])
