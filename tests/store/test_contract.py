"""The contract every event store backend passes (memory, SQLite, PostgreSQL).

Everything here goes through ``open_store(store_url)`` and the public
:class:`~saucer.store.EventStore` API, then through ``Context.open(store_url)``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Iterator

import pytest

from saucer.context import Context, ContextNames
from saucer.store import (
    ConflictError,
    EventStore,
    FencedError,
    LeaseHeldError,
    SessionExistsError,
    SessionNotFoundError,
    Snapshot,
    StoreError,
    open_store,
)

N = ContextNames


@pytest.fixture
def store(store_url: str) -> Iterator[EventStore]:
    s = open_store(store_url)
    yield s
    s.close()


def _set(key: str, value: Any) -> list[dict[str, Any]]:
    return [{"op": "set", "var": key, "value": value}]


def _fill(store: EventStore, sid: str, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        store.append(sid, i, _set("i", i + 1), author="test")


# ------------------------------------------------------------- sessions


def test_create_exists_and_info(store: EventStore) -> None:
    assert not store.exists("s")
    before = time.time()
    info = store.create_session("s", meta={"purpose": "contract", "n": [1, 2]})
    assert store.exists("s")
    again = store.session_info("s")
    assert again.session_id == "s" and again.version == 0 == store.head("s")
    assert again.parent_id is None and again.parent_version is None
    assert again.meta == {"purpose": "contract", "n": [1, 2]}
    assert before - 1 <= again.created_at <= again.updated_at <= time.time() + 1
    assert info.session_id == "s"
    with pytest.raises(SessionExistsError, match="'s'"):
        store.create_session("s")
    with pytest.raises(SessionNotFoundError, match="'ghost'") as missing:
        store.session_info("ghost")
    assert isinstance(missing.value, KeyError) and isinstance(missing.value, StoreError)
    with pytest.raises(SessionNotFoundError):
        store.head("ghost")
    with pytest.raises(ValueError):
        store.create_session("")


def test_sessions_most_recently_updated_first(store: EventStore) -> None:
    for sid in ("a", "b", "c"):
        store.create_session(sid)
        time.sleep(0.002)
    assert [i.session_id for i in store.sessions()] == ["c", "b", "a"]
    time.sleep(0.002)
    store.append("a", 0, _set("x", 1), author="t")
    listed = store.sessions()
    assert [i.session_id for i in listed] == ["a", "c", "b"]
    assert [i.version for i in listed] == [1, 0, 0]
    assert listed[0].updated_at > listed[1].updated_at


def test_find_sessions_by_prefix_most_recent_first(store: EventStore) -> None:
    for sid in ("run-a1", "run-a2", "run-b1", "Run-a3", "r_n", "rxn", "other"):
        store.create_session(sid)
        time.sleep(0.002)
    store.append("run-a1", 0, _set("x", 1), author="t")  # now the most recently updated
    ids = lambda infos: [i.session_id for i in infos]  # noqa: E731
    assert ids(store.find_sessions("run-a")) == ["run-a1", "run-a2"]  # case-sensitive, newest first
    assert ids(store.find_sessions("run-")) == ["run-a1", "run-b1", "run-a2"]
    assert ids(store.find_sessions("r_")) == ["r_n"]  # "_" is a character, not a pattern
    assert ids(store.find_sessions("run-a1")) == ["run-a1"] and store.find_sessions("nope") == []
    assert ids(store.find_sessions(limit=1)) == ["run-a1"]  # the last updated session
    assert ids(store.find_sessions()) == ids(store.sessions())
    assert store.find_sessions("run", limit=0) == []


def test_lease_of_tells_a_live_runner_from_a_gone_one(store: EventStore) -> None:
    store.create_session("s")
    assert store.lease_of("s") is None and store.lease_of("ghost") is None
    lease = store.acquire_lease("s", "worker-1", ttl=30)
    seen = store.lease_of("s")
    assert seen is not None and (seen.owner, seen.token) == ("worker-1", lease.token)
    assert abs(seen.expires_at - lease.expires_at) < 5 and seen.expires_at > time.time() + 20
    store.release_lease(lease)
    released = store.lease_of("s")
    assert released is not None and released.expires_at <= time.time()
    short = store.acquire_lease("s", "worker-2", ttl=0.05)
    time.sleep(0.1)
    expired = store.lease_of("s")
    assert expired is not None and expired.token == short.token and expired.expires_at <= time.time()


def test_a_session_with_forks_cannot_be_deleted(store: EventStore) -> None:
    store.create_session("parent")
    _fill(store, "parent", 3)
    store.create_session("child", parent_id="parent", parent_version=2)
    with pytest.raises(StoreError, match="forks that read its log \\(child\\)"):
        store.delete_session("parent")
    assert store.head("parent") == 3 and [e.version for e in store.read("child")] == [1, 2]
    store.delete_session("child")
    store.delete_session("parent")
    assert not store.exists("parent") and not store.exists("child")


def test_delete_session(store: EventStore) -> None:
    store.create_session("s")
    _fill(store, "s", 3)
    store.save_snapshot(Snapshot("s", 2, time.time(), {"names": {}, "vars": {"i": 2}}))
    lease = store.acquire_lease("s", "w", ttl=30)
    store.create_session("other")
    store.delete_session("s")
    assert not store.exists("s")
    assert [i.session_id for i in store.sessions()] == ["other"]
    with pytest.raises(SessionNotFoundError):
        list(store.read("s"))
    store.delete_session("s")  # already gone: no error
    store.create_session("s")  # the id can be used again, from scratch
    assert store.head("s") == 0 and list(store.read("s")) == [] and store.latest_snapshot("s") is None
    new = store.acquire_lease("s", "someone-else", ttl=30)  # the old lease went with the session
    assert new.owner == "someone-else" and lease.owner == "w"


# --------------------------------------------------------------- events


def test_append_checks_the_version(store: EventStore) -> None:
    store.create_session("s")
    event = store.append(
        "s", 0, [{"op": "set", "name": "REQUEST", "value": "hi"}], author="agent:a", round=3, step=7, meta={"why": "test"}
    )
    assert (event.session_id, event.version, event.author, event.round, event.step) == ("s", 1, "agent:a", 3, 7)
    assert event.meta == {"why": "test"} and event.timestamp > 0
    assert store.head("s") == 1
    with pytest.raises(ConflictError) as stale:
        store.append("s", 0, _set("x", 1), author="b")
    assert stale.value.expected == 0 and stale.value.actual == 1 and stale.value.session_id == "s"
    assert "another writer" in str(stale.value)
    with pytest.raises(ConflictError):
        store.append("s", 5, _set("x", 1), author="b")  # from the future
    assert store.head("s") == 1 and len(list(store.read("s"))) == 1
    with pytest.raises(SessionNotFoundError):
        store.append("ghost", 0, _set("x", 1), author="b")


def test_events_round_trip_exactly(store: EventStore) -> None:
    store.create_session("s")
    ops = [
        {"op": "set", "var": "v", "value": {"nested": [1, 2.5, -0.0, None, True, "ünïcødé ✓", {"k": []}]}},
        {"op": "set", "name": "ROUND_COST", "path": [3], "value": 0.1},
        {"op": "incr", "var": "big", "by": 2**62},
        {"op": "append", "name": "STRUCTURAL_LOGS", "path": [1, 0], "value": {"Action": "x"}},
        {"op": "cas", "var": "c", "expected": None, "value": 1e-300},
        {"op": "delete", "var": "gone"},
    ]
    store.append("s", 0, ops, author="a")
    store.append("s", 1, [], author="b", meta={"only": "meta"})
    first, second = list(store.read("s"))
    assert first.ops == ops
    assert first.round is None and first.step is None and first.meta == {}
    assert type(first.ops[1]["path"][0]) is int
    assert second.ops == [] and second.meta == {"only": "meta"}


def test_read_ranges(store: EventStore) -> None:
    store.create_session("s")
    _fill(store, "s", 6)

    def versions(after: int = 0, upto: int | None = None) -> list[int]:
        return [e.version for e in store.read("s", after, upto)]

    assert versions() == [1, 2, 3, 4, 5, 6]
    assert versions(2) == [3, 4, 5, 6]
    assert versions(0, 3) == [1, 2, 3]
    assert versions(2, 4) == [3, 4]
    assert versions(6) == [] and versions(3, 3) == [] and versions(4, 2) == []
    assert versions(0, 100) == [1, 2, 3, 4, 5, 6]
    assert [e.ops[0]["value"] for e in store.read("s", 4)] == [5, 6]
    with pytest.raises(SessionNotFoundError):
        list(store.read("ghost"))


def test_forks_read_their_lineage(store: EventStore) -> None:
    store.create_session("p")
    _fill(store, "p", 5)
    child = store.create_session("c", parent_id="p", parent_version=3)
    assert (child.parent_id, child.parent_version, child.version) == ("p", 3, 3)
    assert store.head("c") == 3
    with pytest.raises(ConflictError):
        store.append("c", 0, _set("x", 1), author="c")
    store.append("c", 3, _set("i", 100), author="c")
    store.append("c", 4, _set("i", 101), author="c")
    lineage = list(store.read("c"))
    assert [(e.session_id, e.version) for e in lineage] == [("p", 1), ("p", 2), ("p", 3), ("c", 4), ("c", 5)]
    assert [(e.session_id, e.version) for e in store.read("c", 2, 4)] == [("p", 3), ("c", 4)]
    assert [e.version for e in store.read("c", 3)] == [4, 5]
    assert [e.version for e in store.read("c", 0, 2)] == [1, 2]
    assert [e.version for e in store.read("p")] == [1, 2, 3, 4, 5]  # the parent is untouched
    store.create_session("g", parent_id="c")  # at the child's head
    store.append("g", 5, _set("i", 200), author="g")
    assert [(e.session_id, e.version) for e in store.read("g")] == [
        ("p", 1), ("p", 2), ("p", 3), ("c", 4), ("c", 5), ("g", 6),
    ]
    store.create_session("zero", parent_id="p", parent_version=0)
    assert list(store.read("zero")) == [] and store.head("zero") == 0
    with pytest.raises(ValueError, match="0..5"):
        store.create_session("bad", parent_id="p", parent_version=6)
    with pytest.raises(SessionNotFoundError):
        store.create_session("orphan", parent_id="ghost")
    assert not store.exists("bad") and not store.exists("orphan")


# ------------------------------------------------------------ snapshots


def _snap(sid: str, version: int) -> Snapshot:
    return Snapshot(sid, version, time.time(), {"names": {"ROUND_STEP": {"1": version}}, "vars": {"i": version}})


def test_snapshots_latest_and_upto(store: EventStore) -> None:
    store.create_session("s")
    _fill(store, "s", 6)
    assert store.latest_snapshot("s") is None
    store.save_snapshot(_snap("s", 2))
    store.save_snapshot(_snap("s", 4))
    latest = store.latest_snapshot("s")
    assert latest is not None and latest.version == 4 and latest.session_id == "s"
    assert latest.state == {"names": {"ROUND_STEP": {"1": 4}}, "vars": {"i": 4}}
    assert store.latest_snapshot("s", 3).version == 2  # type: ignore[union-attr]
    assert store.latest_snapshot("s", 4).version == 4  # type: ignore[union-attr]
    assert store.latest_snapshot("s", 1) is None
    assert store.events_since_snapshot("s") == 2
    replacement = Snapshot("s", 4, time.time(), {"names": {}, "vars": {"i": "again"}})
    store.save_snapshot(replacement)
    assert store.latest_snapshot("s").state["vars"] == {"i": "again"}  # type: ignore[union-attr]
    big = Snapshot("s", 6, time.time(), {"names": {}, "vars": {"log": ["x" * 100] * 500}})
    store.save_snapshot(big)
    assert store.latest_snapshot("s").state == big.state  # type: ignore[union-attr]


def test_forks_use_their_parents_snapshots_up_to_the_fork_point(store: EventStore) -> None:
    store.create_session("p")
    _fill(store, "p", 6)
    store.save_snapshot(_snap("p", 2))
    store.save_snapshot(_snap("p", 5))
    store.create_session("c", parent_id="p", parent_version=4)
    assert store.latest_snapshot("c").version == 2  # type: ignore[union-attr]
    store.save_snapshot(_snap("c", 4))
    own = store.latest_snapshot("c")
    assert own is not None and own.session_id == "c" and own.version == 4
    assert store.latest_snapshot("c", 3).version == 2  # type: ignore[union-attr]


def test_prune_snapshots_keeps_the_newest(store: EventStore) -> None:
    store.create_session("s")
    store.create_session("t")
    _fill(store, "s", 8)
    _fill(store, "t", 2)
    for v in (2, 4, 6, 8):
        store.save_snapshot(_snap("s", v))
    store.save_snapshot(_snap("t", 2))
    store.prune_snapshots("s", 2)
    assert store.latest_snapshot("s").version == 8  # type: ignore[union-attr]
    assert store.latest_snapshot("s", 7).version == 6  # type: ignore[union-attr]
    assert store.latest_snapshot("s", 5) is None
    store.prune_snapshots("s", 0)
    assert store.latest_snapshot("s") is None
    assert store.latest_snapshot("t").version == 2  # type: ignore[union-attr]  # other sessions untouched


def test_quarantine_leaves_readable_records_alone(store: EventStore) -> None:
    store.create_session("s")
    _fill(store, "s", 2)
    assert store.quarantine_record("s", 2) is False  # readable: nothing to do
    assert store.quarantine_record("s", 9) is False  # no such record
    assert [e.ops for e in store.read("s")] == [_set("i", 1), _set("i", 2)]


# --------------------------------------------------------------- leases


def test_leases(store: EventStore) -> None:
    store.create_session("s")
    first = store.acquire_lease("s", "worker-1", ttl=30)
    assert first.owner == "worker-1" and first.session_id == "s" and first.token >= 1
    assert first.expires_at > time.time() + 20
    renewed = store.acquire_lease("s", "worker-1", ttl=60)
    assert renewed.token == first.token and renewed.expires_at >= first.expires_at
    with pytest.raises(LeaseHeldError, match="worker-1") as held:
        store.acquire_lease("s", "worker-2", ttl=30)
    assert held.value.holder == "worker-1" and held.value.session_id == "s"
    with pytest.raises(SessionNotFoundError):
        store.acquire_lease("ghost", "worker-1", ttl=30)


def test_an_expired_lease_is_taken_over_and_fences_the_old_holder(store: EventStore) -> None:
    store.create_session("s")
    old = store.acquire_lease("s", "worker-1", ttl=0.05)
    store.append("s", 0, _set("x", 1), author="w1", fence=old.token)
    time.sleep(0.1)
    new = store.acquire_lease("s", "worker-2", ttl=30)
    assert new.token > old.token and new.owner == "worker-2"
    with pytest.raises(FencedError, match="worker-2") as fenced:
        store.append("s", 1, _set("x", 2), author="w1", fence=old.token)
    assert isinstance(fenced.value, ConflictError)
    assert store.head("s") == 1
    store.append("s", 1, _set("x", 3), author="w2", fence=new.token)
    assert store.head("s") == 2
    store.release_lease(old)  # taken over already: releasing it changes nothing
    with pytest.raises(LeaseHeldError):
        store.acquire_lease("s", "worker-3", ttl=30)
    store.release_lease(new)
    third = store.acquire_lease("s", "worker-3", ttl=30)
    assert third.token > new.token


# ---------------------------------------------------------------- watch


def test_watch_yields_new_events(store_url: str, store: EventStore) -> None:
    store.create_session("s")
    _fill(store, "s", 2)

    def writer() -> None:
        other = open_store(store_url)
        try:
            for i in range(2, 5):
                time.sleep(0.05)
                other.append("s", i, _set("i", i + 1), author="writer")
        finally:
            other.close()

    async def collect() -> list[int]:
        seen: list[int] = []
        stream = store.watch("s", 1, interval=0.02)
        try:
            async for event in stream:
                seen.append(event.version)
                if len(seen) == 4:
                    break
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        return seen

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        seen = asyncio.run(asyncio.wait_for(collect(), timeout=10))
    finally:
        thread.join()
    assert seen == [2, 3, 4, 5]


# ---------------------------------------------------- the Context on top


def test_context_commit_and_hydrate(store_url: str) -> None:
    ctx = Context.open(store_url, "s", author="agent:a", snapshot_every=3)
    ctx.set(N.CURRENT_ROUND_ID, 2)
    ctx.current_round_cost += 0.5
    ctx.add_to_structural_logs({"Round": 2, "SubtaskIndex": 1, "Action": "click"})
    ctx.update_vars(set={"status": "ok", "t": (1, 2)})
    assert ctx.commit() == 1
    for i in range(5):
        with ctx.step(step=i):
            ctx.incr("n")
            ctx.append(N.PREVIOUS_SUBTASKS, f"task {i}")
    expected = ctx.to_dict()
    other = Context.open(store_url, "s")  # another client, before close: snapshot + tail
    assert other.version == 6 and other.to_dict() == expected
    ctx.close()
    again = Context.open(store_url, "s")
    assert again.to_dict() == expected
    assert again.get(N.ROUND_COST) == {2: 0.5} and again.filter_structural_logs(2, 1, "Action") == ["click"]
    assert again.get_var("t") == [1, 2]
    assert [e.author for e in again.history("n")] == ["agent:a"] * 5
    assert [e.step for e in again.history("n")] == [0, 1, 2, 3, 4]
    old = Context.open(store_url, "s", at=1)
    assert old.get_var("n") is None and old.read_only
    other.close()
    again.close()


def test_context_fork_and_history(store_url: str) -> None:
    ctx = Context.open(store_url, "p")
    for i in range(4):
        ctx.update_vars(set={"i": i})
        ctx.commit()
    child = ctx.fork("c", at=2)
    assert child.get_var("i") == 1
    child.update_vars(set={"i": "child"})
    child.commit()
    ctx.close()
    child.close()
    reopened = Context.open(store_url, "c")
    assert reopened.get_var("i") == "child" and reopened.version == 3
    assert [(e.session_id, e.version) for e in reopened.history("i")] == [("p", 1), ("p", 2), ("c", 3)]
    assert Context.open(store_url, "p").get_var("i") == 3
    assert reopened.diff(2, 3) == {"vars.i": {"before": 1, "after": "child"}}
    reopened.close()


def test_context_conflicts_and_rebase(store_url: str) -> None:
    a = Context.open(store_url, "s")
    b = Context.open(store_url, "s")
    a.update_vars(set={"owner": "a"})
    a.incr("n")
    a.commit()
    b.incr("n")
    b.append("l", "b")
    assert b.commit() == 2 and b.get_var("n") == 2  # atomic only: re-based
    a.update_vars(set={"owner": "a2"})
    with pytest.raises(ConflictError, match="vars.owner"):
        a.commit()
    a.reload()
    assert a.version == 2 and a.get_var("l") == ["b"]
    a.update_vars(set={"owner": "a2"})
    assert a.commit() == 3
    a.close()
    b.close()
