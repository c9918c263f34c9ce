"""Out-of-turn writes (issue 26): a serialised commit is ordered after concurrent writers;
a plain commit on a stale read gets a ConflictError naming the other writer's keys."""

from __future__ import annotations

import asyncio

import pytest

from saucer.context import Context, ContextNames
from saucer.store import ConflictError
from saucer.store.memory import MemoryStore


def _pair(store: MemoryStore) -> tuple[Context, Context]:
    engine = Context.open(store, "s", author="follower", serialise=True)
    engine.commit(meta={"kind": "session_start"})
    other = Context.open(store, "s", author="human:me")
    return engine, other


def test_a_serialised_commit_is_ordered_after_a_concurrent_write_and_keeps_both() -> None:
    store = MemoryStore()
    engine, other = _pair(store)
    engine.set(ContextNames.SUBTASK, "step 1")
    engine.incr(ContextNames.SESSION_STEP)
    other.update_vars(set={"note": "hi"}, delete=["nothing"])
    assert other.commit() == 2
    assert engine.commit(meta={"kind": "step"}) == 3  # not a ConflictError
    assert engine.get_var("note") == "hi" and engine.get(ContextNames.SUBTASK) == "step 1"
    event = list(store.read("s", 2))[0]
    assert event.author == "follower" and event.meta["kind"] == "step"
    assert event.meta["serialised"] == {"based_on": 1, "ordered_after": [2], "changed": ["vars.nothing", "vars.note"]}
    fresh = Context.open(store, "s")
    assert fresh.get_var("note") == "hi" and fresh.get(ContextNames.SESSION_STEP) == 1


def test_a_serialised_set_wins_over_an_older_concurrent_set_and_atomic_ops_lose_nothing() -> None:
    store = MemoryStore()
    engine, other = _pair(store)
    engine.set(ContextNames.SUBTASK, "mine")
    engine.incr("n", 2)
    other.set(ContextNames.SUBTASK, "theirs")
    other.incr("n", 5)
    other.commit()
    engine.commit()
    fresh = Context.open(store, "s")
    assert fresh.get(ContextNames.SUBTASK) == "mine"  # later in the log
    assert fresh.get_var("n") == 7


def test_a_serialised_compare_and_set_that_no_longer_holds_is_left_out_and_named() -> None:
    store = MemoryStore()
    engine, other = _pair(store)
    assert engine.compare_and_set("owner", None, "engine")
    engine.set(ContextNames.SUBTASK, "s1")
    other.update_vars(set={"owner": "human"})
    other.commit()
    engine.commit(meta={"kind": "step"})
    event = list(store.read("s", 2))[0]
    assert event.meta["serialised"]["dropped"] == ["vars.owner"]
    assert engine.get_var("owner") == "human" and engine.get(ContextNames.SUBTASK) == "s1"
    assert [op.get("name") for op in event.ops] == ["SUBTASK"]


def test_a_serialised_commit_over_many_writers_lists_every_version_it_follows() -> None:
    store = MemoryStore()
    engine, other = _pair(store)
    engine.set(ContextNames.SUBTASK, "x")
    for i in range(5):
        other.update_vars(set={f"k{i}": i})
        other.commit()
    version = engine.commit()
    assert version == 7
    meta = list(store.read("s", 6))[0].meta
    assert meta["serialised"]["ordered_after"] == [2, 3, 4, 5, 6]


def test_a_plain_commit_on_a_stale_read_names_the_keys_the_other_writer_changed() -> None:
    store = MemoryStore()
    engine, other = _pair(store)
    engine.set(ContextNames.SUBTASK, "step 1")
    engine.commit()
    other.update_vars(set={"note": "hi"})
    with pytest.raises(ConflictError) as info:
        other.commit()
    assert info.value.keys == ["SUBTASK"]
    assert "keys: SUBTASK" in str(info.value) and "vars.note" not in str(info.value)
    other.reload()
    other.update_vars(set={"note": "hi"})
    assert other.commit() == 3


def test_the_async_commit_is_serialised_too() -> None:
    store = MemoryStore()
    engine, other = _pair(store)
    engine.set(ContextNames.SUBTASK, "a")
    other.update_vars(set={"flag": True})
    other.commit()
    assert asyncio.run(engine.acommit_step(meta={"kind": "step"})) == 3
    assert engine.get_var("flag") is True
    assert list(store.read("s", 2))[0].meta["serialised"]["based_on"] == 1


def test_catch_up_brings_in_other_writers_and_the_commit_still_records_its_base() -> None:
    store = MemoryStore()
    engine, other = _pair(store)
    engine.incr("n")
    engine.set(ContextNames.SUBTASK, "mine")
    other.update_vars(set={"flag": True, "n": 10})
    other.commit()
    assert engine.get_var("flag") is None
    assert engine.catch_up() == 1
    assert engine.get_var("flag") is True and engine.get_var("n") == 11  # its pending incr on top
    assert engine.catch_up() == 0
    assert engine.commit(meta={"kind": "step"}) == 3  # no conflict left: still recorded as ordered after v2
    meta = list(store.read("s", 2))[0].meta
    assert meta["serialised"] == {"based_on": 1, "ordered_after": [2], "changed": ["vars.flag", "vars.n"]}
    assert Context.open(store, "s").get_var("n") == 11
    # A plain Context does not catch up (its commit raises instead).
    assert other.catch_up() == 0


def test_catch_up_without_pending_changes_just_reloads() -> None:
    store = MemoryStore()
    engine, other = _pair(store)
    other.update_vars(set={"x": 1})
    other.commit()
    assert engine.catch_up() == 1 and engine.get_var("x") == 1 and engine.version == 2
    engine.update_vars(set={"y": 2})
    assert engine.commit() == 3
    assert "serialised" not in list(store.read("s", 2))[0].meta


class _CountingStore(MemoryStore):
    """A memory store that counts the reads of a session's head."""

    def __init__(self) -> None:
        super().__init__()
        self.head_reads = 0

    def head(self, session_id: str) -> int:
        self.head_reads += 1
        return super().head(session_id)


def test_a_fresh_open_reads_nothing_and_meets_a_writer_that_came_first_as_a_concurrent_one() -> None:
    """``Context.open(fresh=True)``: the runner that just made the session opens it empty, without a
    read; an out-of-turn write made in between is met by the first commit (re-based, or refused)."""
    store = _CountingStore()
    store.create_session("s")
    other = Context.open(store, "s", author="human:me", create=False)
    other.update_vars(set={"note": "first"})
    assert other.commit() == 1
    store.head_reads = 0
    engine = Context.open(store, "s", author="follower", create=False, fresh=True, serialise=True)
    assert store.head_reads == 0 and engine.version == 0 and engine.get_var("note") is None
    engine.set(ContextNames.SUBTASK, "step 1")
    assert engine.commit(meta={"kind": "step"}) == 2  # ordered after the write it had not read
    assert engine.get_var("note") == "first" and engine.get(ContextNames.SUBTASK) == "step 1"
    plain = Context.open(store, "s", author="follower", create=False, fresh=True)
    plain.set(ContextNames.SUBTASK, "step 2")
    with pytest.raises(ConflictError):  # not serialised: the stale base is refused, nothing is lost
        plain.commit()
    assert store.head("s") == 2
