"""The contract every event store backend must pass, as a pytest test class.

saucer runs it against its three backends (``tests/store/test_contract.py``);
a third-party backend runs the very same tests. Subclass
:class:`EventStoreContract` in a test module, under a name pytest collects,
and give it a ``store_factory`` fixture: a function that opens *another
handle on the same store*, empty at the start of each test::

    # tests/test_my_store.py
    import pytest
    from saucer.store.testing import EventStoreContract
    from my_package import MyStore

    class TestMyStore(EventStoreContract):
        @pytest.fixture
        def store_factory(self, tmp_path):
            return lambda: MyStore(tmp_path / "events.db")

and, so that a failing ``assert`` shows its values, let pytest rewrite this
module's asserts, in that folder's ``conftest.py``::

    pytest.register_assert_rewrite("saucer.store.testing")

It needs pytest (``pip install 'saucer[test]'``). Everything goes through the
public :class:`~saucer.store.EventStore` API. Optional features (see
:class:`~saucer.store.Feature`) are held to their contract when the backend
declares them in ``EventStore.features``; an undeclared one must be refused
with :class:`~saucer.store.NotSupportedError` (or, for the caches
``prune_snapshots`` and ``quarantine_record``, do nothing harmful).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from saucer.store._testing_listing import SessionListingContract
from saucer.store.base import EventStore
from saucer.store.model import (
    ConflictError,
    Event,
    Feature,
    FencedError,
    LeaseHeldError,
    NotSupportedError,
    SessionExistsError,
    SessionInfo,
    SessionNotFoundError,
    Snapshot,
    StoreError,
    VersionNotFoundError,
    VersionPrunedError,
)

__all__ = ["EventStoreContract"]


def _set(key: str, value: Any) -> list[dict[str, Any]]:
    return [{"op": "set", "var": key, "value": value}]


def _fill(store: EventStore, sid: str, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        store.append(sid, i, _set("i", i + 1), author="test")


def _snap(sid: str, version: int) -> Snapshot:
    return Snapshot(sid, version, time.time(), {"names": {"ROUND_STEP": {"1": version}}, "vars": {"i": version}})


def _base(version: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Base operations and state for a log made by :func:`_fill` (it sets ``i`` to the version)."""
    return _set("i", version), {"names": {}, "vars": {"i": version}}


class EventStoreContract(SessionListingContract):
    """The tests every backend passes; subclass it and define the ``store_factory`` fixture."""

    @pytest.fixture
    def store_factory(self) -> Callable[[], EventStore]:
        """Opens another handle on the same store, empty at the start of each test (define it)."""
        pytest.fail(f"{type(self).__name__} must define the store_factory fixture (see saucer.store.testing)")

    @pytest.fixture
    def store(self, store_factory: Callable[[], EventStore]) -> Iterator[EventStore]:
        s = store_factory()
        yield s
        s.close()

    # ----------------------------------------------------------- sessions

    def test_create_exists_and_info(self, store: EventStore) -> None:
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

    def test_sessions_most_recently_updated_first(self, store: EventStore) -> None:
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

    def test_find_sessions_by_prefix_most_recent_first(self, store: EventStore) -> None:
        for sid in ("run-a1", "run-a2", "run-b1", "Run-a3", "r_n", "rxn", "other"):
            store.create_session(sid)
            time.sleep(0.002)
        store.append("run-a1", 0, _set("x", 1), author="t")  # now the most recently updated

        def ids(infos: list[SessionInfo]) -> list[str]:
            return [i.session_id for i in infos]

        assert ids(store.find_sessions("run-a")) == ["run-a1", "run-a2"]  # case-sensitive, newest first
        assert ids(store.find_sessions("run-")) == ["run-a1", "run-b1", "run-a2"]
        assert ids(store.find_sessions("r_")) == ["r_n"]  # "_" is a character, not a pattern
        assert ids(store.find_sessions("run-a1")) == ["run-a1"] and store.find_sessions("nope") == []
        assert ids(store.find_sessions(limit=1)) == ["run-a1"]  # the last updated session
        assert ids(store.find_sessions()) == ids(store.sessions())
        assert store.find_sessions("run", limit=0) == []
        for prefix, limit in (
            ("run-", None),
            ("run-a", 1),
            ("", 2),
            ("nope", None),
            ("run", 0),
        ):  # the ids alone, same order
            assert store.find_session_ids(prefix, limit) == ids(store.find_sessions(prefix, limit))

    def test_lease_of_tells_a_live_runner_from_a_gone_one(self, store: EventStore) -> None:
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

    def test_session_heads_are_rows_with_their_newest_event_and_lease(self, store: EventStore) -> None:
        store.create_session("empty")
        time.sleep(0.002)
        store.create_session("p")
        _fill(store, "p", 3)
        store.append(
            "p", 3, _set("done", True), author="engine", round=2, step=5, meta={"kind": "session_end", "n": [1]}
        )
        time.sleep(0.002)
        store.create_session("f", parent_id="p", parent_version=2)  # its head is in its parent's log
        lease = store.acquire_lease("p", "runner", ttl=30)
        heads = store.session_heads()
        assert [h.info for h in heads] == store.sessions()
        by_id = {h.info.session_id: h for h in heads}
        assert by_id["empty"].last is None and by_id["empty"].lease is None
        last = by_id["p"].last
        assert last == next(store.read("p", 3)) and last is not None
        assert (last.version, last.author, last.round, last.step, last.meta) == (
            4,
            "engine",
            2,
            5,
            {"kind": "session_end", "n": [1]},
        )
        held = by_id["p"].lease
        assert (
            held is not None
            and (held.owner, held.token) == ("runner", lease.token)
            and held.expires_at > time.time() + 20
        )
        assert by_id["f"].last == next(store.read("p", 1, 2)) and by_id["f"].lease is None
        some = store.session_heads(["f", "ghost", "empty"])
        assert [h.info.session_id for h in some] == ["f", "empty"] and some[0] == by_id["f"]
        assert store.session_heads([]) == []
        assert [i.session_id for i in store.forks("p")] == ["f"] and store.forks("f") == []

    def test_a_session_with_forks_cannot_be_deleted(self, store: EventStore) -> None:
        store.create_session("parent")
        _fill(store, "parent", 3)
        store.create_session("child", parent_id="parent", parent_version=2)
        with pytest.raises(StoreError, match="forks that read its log \\(child\\)"):
            store.delete_session("parent")
        assert store.head("parent") == 3 and [e.version for e in store.read("child")] == [1, 2]
        store.delete_session("child")
        store.delete_session("parent")
        assert not store.exists("parent") and not store.exists("child")

    def test_delete_session(self, store: EventStore) -> None:
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

    # ------------------------------------------------------------- events

    def test_append_checks_the_version(self, store: EventStore) -> None:
        store.create_session("s")
        event = store.append(
            "s",
            0,
            [{"op": "set", "name": "REQUEST", "value": "hi"}],
            author="agent:a",
            round=3,
            step=7,
            meta={"why": "test"},
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

    def test_async_appends_are_durable_and_reported(self, store: EventStore) -> None:
        store.create_session("a")
        store.create_session("b")
        written: list[Event] = []

        async def commit_both() -> list[Event]:
            return list(
                await asyncio.gather(
                    store.aappend("a", 0, _set("x", 1), author="t", on_written=written.append),
                    store.aappend("b", 0, _set("x", 2), author="t", round=1, step=2, on_written=written.append),
                )
            )

        events = asyncio.run(commit_both())
        assert sorted(written, key=lambda e: e.session_id) == events
        assert [(e.session_id, e.version, e.ops) for e in events] == [("a", 1, _set("x", 1)), ("b", 1, _set("x", 2))]
        assert [e.ops for e in store.read("b")] == [_set("x", 2)] and store.head("a") == 1

        async def stale() -> None:
            await store.aappend("a", 0, _set("x", 3), author="t", on_written=written.append)

        with pytest.raises(ConflictError):
            asyncio.run(stale())
        assert len(written) == 2 and store.head("a") == 1

    def test_events_round_trip_exactly(self, store: EventStore) -> None:
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

    def test_read_ranges(self, store: EventStore) -> None:
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

    def test_iter_events_streams_the_log_in_version_ranges(self, store: EventStore) -> None:
        store.create_session("p")
        _fill(store, "p", 5)
        store.create_session("c", parent_id="p", parent_version=3)
        _fill(store, "c", 4, start=3)
        for sid in ("p", "c"):
            for after, upto in ((0, None), (0, 3), (2, 6), (3, None), (6, None), (4, 2), (0, 100)):
                whole = [(e.session_id, e.version, e.ops) for e in store.read(sid, after, upto)]
                for batch in (1, 2, 3, 1000):
                    streamed = [
                        (e.session_id, e.version, e.ops) for e in store.iter_events(sid, after, upto, batch=batch)
                    ]
                    assert streamed == whole, (sid, after, upto, batch)
        stream = store.iter_events("c", batch=2)
        assert next(stream).version == 1
        store.append("c", 7, _set("i", 8), author="test")  # committed after the stream began: not in it
        assert [e.version for e in stream] == [2, 3, 4, 5, 6, 7]
        with pytest.raises(ValueError, match="batch"):
            next(store.iter_events("c", batch=0))
        with pytest.raises(SessionNotFoundError):
            next(store.iter_events("ghost"))

    def test_iter_events_refuses_a_log_pruned_under_it(self, store: EventStore) -> None:
        store.create_session("s")
        _fill(store, "s", 10)
        store.create_session("gone")
        _fill(store, "gone", 6)
        stream = store.iter_events("gone", batch=2)
        assert [next(stream).version for _ in range(3)] == [1, 2, 3]
        store.delete_session("gone")
        with pytest.raises(StoreError):  # never a stream that silently stops early
            list(stream)
        if Feature.REPLACE_HISTORY not in store.features:
            return
        stream = store.iter_events("s", batch=2)
        assert [next(stream).version for _ in range(3)] == [1, 2, 3]
        ops, state = _base(8)
        store.replace_history("s", 8, ops, state)
        with pytest.raises(StoreError, match="changed while being read"):
            list(stream)
        assert [e.version for e in store.iter_events("s", batch=2)] == [
            8,
            9,
            10,
        ]  # a new stream starts at the first readable version

    def test_forks_read_their_lineage(self, store: EventStore) -> None:
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
            ("p", 1),
            ("p", 2),
            ("p", 3),
            ("c", 4),
            ("c", 5),
            ("g", 6),
        ]
        store.create_session("zero", parent_id="p", parent_version=0)
        assert list(store.read("zero")) == [] and store.head("zero") == 0
        with pytest.raises(ValueError, match="0..5"):
            store.create_session("bad", parent_id="p", parent_version=6)
        with pytest.raises(SessionNotFoundError):
            store.create_session("orphan", parent_id="ghost")
        assert not store.exists("bad") and not store.exists("orphan")

    # ---------------------------------------------------------- snapshots

    def test_snapshots_latest_and_upto(self, store: EventStore) -> None:
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

    def test_forks_use_their_parents_snapshots_up_to_the_fork_point(self, store: EventStore) -> None:
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

    def test_prune_snapshots_keeps_the_newest(self, store: EventStore) -> None:
        store.create_session("s")
        store.create_session("t")
        _fill(store, "s", 8)
        _fill(store, "t", 2)
        for v in (2, 4, 6, 8):
            store.save_snapshot(_snap("s", v))
        store.save_snapshot(_snap("t", 2))
        store.prune_snapshots("s", 2)
        assert store.latest_snapshot("s").version == 8  # type: ignore[union-attr]
        if Feature.SNAPSHOT_PRUNING not in store.features:
            return  # a cache it may keep whole: the newest is what counts
        assert store.latest_snapshot("s", 7).version == 6  # type: ignore[union-attr]
        assert store.latest_snapshot("s", 5) is None
        store.prune_snapshots("s", 0)
        assert store.latest_snapshot("s") is None
        assert store.latest_snapshot("t").version == 2  # type: ignore[union-attr]  # other sessions untouched

    def test_quarantine_leaves_readable_records_alone(self, store: EventStore) -> None:
        store.create_session("s")
        _fill(store, "s", 2)
        assert store.quarantine_record("s", 2) is False  # readable: nothing to do
        assert store.quarantine_record("s", 9) is False  # no such record
        assert [e.ops for e in store.read("s")] == [_set("i", 1), _set("i", 2)]

    # ------------------------------------------------------------- leases

    def test_leases(self, store: EventStore) -> None:
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

    def test_an_expired_lease_is_taken_over_and_fences_the_old_holder(self, store: EventStore) -> None:
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

    # -------------------------------------------------------------- watch

    def test_watch_yields_new_events(self, store_factory: Callable[[], EventStore], store: EventStore) -> None:
        store.create_session("s")
        _fill(store, "s", 2)

        def writer() -> None:
            other = store_factory()
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

    # ------------------------------------------------ optional: history

    def test_replace_history_keeps_every_later_version(self, store: EventStore) -> None:
        store.create_session("s")
        _fill(store, "s", 6)
        store.save_snapshot(_snap("s", 2))
        ops, state = _base(4)
        if Feature.REPLACE_HISTORY not in store.features:
            with pytest.raises(NotSupportedError):
                store.replace_history("s", 4, ops, state)
            return
        original = list(store.read("s", 3, 4))[0]
        assert store.replace_history("s", 4, ops, state) == 4 == store.first_version("s")
        events = list(store.read("s"))
        assert [e.version for e in events] == [4, 5, 6] and [e.ops for e in events[1:]] == [_set("i", 5), _set("i", 6)]
        base = events[0]
        assert (base.author, base.ops, base.meta) == ("system", ops, {"pruned": {"upto": 4, "author": "test"}})
        assert (base.timestamp, base.round, base.step) == (original.timestamp, original.round, original.step)
        snap = store.latest_snapshot("s")
        assert snap is not None and (snap.version, snap.state) == (4, state)
        assert store.latest_snapshot("s", 3) is None  # older snapshots went with their versions
        with pytest.raises(VersionPrunedError) as pruned:
            store.check_readable("s", 3)
        assert pruned.value.first == 4
        assert store.replace_history("s", 3, *_base(3)) == 4  # never goes back
        with pytest.raises(VersionNotFoundError):
            store.replace_history("s", 7, *_base(7))
        store.append("s", 6, _set("i", 7), author="test")  # writing goes on
        assert store.head("s") == 7

    def test_replace_history_gives_forks_their_own_copy(self, store: EventStore) -> None:
        if Feature.REPLACE_HISTORY not in store.features:
            return  # refused: see test_replace_history_keeps_every_later_version
        store.create_session("p")
        _fill(store, "p", 6)
        store.create_session("f", parent_id="p", parent_version=3)
        store.append("f", 3, _set("i", "fork"), author="fork")
        before = [(e.session_id, e.version, e.ops) for e in store.read("f")]
        assert store.replace_history("p", 5, *_base(5)) == 5
        info = store.session_info("f")
        assert info.parent_id is None and info.meta["forked_from"] == "p" and info.meta["at"] == 3
        assert [(e.session_id, e.version, e.ops) for e in store.read("f")] == before
        assert store.first_version("f") == 0
        store.create_session("g", parent_id="f", parent_version=4)
        with pytest.raises(ValueError, match="above"):
            store.replace_history("g", 4, *_base(4))  # a fork is cut only above its branch point

    # ------------------------------------------------- optional: import

    def test_import_log_is_all_or_nothing(self, store: EventStore) -> None:
        now = time.time()
        events = [Event("imp", v, now, "a", None, None, _set("i", v)) for v in (1, 2, 3)]
        info = SessionInfo("imp", 3, now, now, None, None, {"imported_from": "x"})
        snapshots = [Snapshot("imp", 3, now, {"names": {}, "vars": {"i": 3}})]
        if Feature.IMPORT not in store.features:
            with pytest.raises(NotSupportedError):
                store.import_log(info, events, snapshots)
            assert not store.exists("imp")
            return
        with pytest.raises(ValueError):
            store.import_log(info, events[:2], snapshots)  # not consecutive up to the head
        assert not store.exists("imp")
        store.import_log(info, events, snapshots)
        assert store.session_info("imp").meta == {"imported_from": "x"} and store.head("imp") == 3
        assert [e.ops for e in store.read("imp")] == [_set("i", v) for v in (1, 2, 3)]
        assert store.latest_snapshot("imp").version == 3  # type: ignore[union-attr]
        with pytest.raises(SessionExistsError):
            store.import_log(info, events, snapshots)

    # ------------------------------------------------- optional: rewrite

    def test_rewrite_events_in_place_and_report_formats(self, store: EventStore) -> None:
        from dataclasses import replace

        from saucer.store.upcast import FORMAT_VERSION

        store.create_session("rw")
        for v in (1, 2, 3):
            store.append("rw", v - 1, _set("i", v), author="a", round=1, step=v)
        store.save_snapshot(Snapshot("rw", 2, time.time(), {"names": {}, "vars": {"i": 2}}))
        store.create_session("rw-fork", parent_id="rw", parent_version=2)
        store.append("rw-fork", 2, _set("f", 1), author="b")
        if Feature.REWRITE not in store.features:
            with pytest.raises(NotSupportedError):
                store.record_formats("rw")
            with pytest.raises(NotSupportedError):
                store.rewrite_events("rw", [])
            return
        events, snaps = store.record_formats("rw")
        assert set(events) == {1, 2, 3} and set(snaps) == {2}
        assert set(events.values()) | set(snaps.values()) <= set(range(1, FORMAT_VERSION + 1))
        assert set(store.record_formats("rw-fork")[0]) == {3}  # own events only
        old = list(store.read("rw"))
        store.rewrite_events("rw", [replace(old[1], ops=_set("i", 20))])
        after = list(store.read("rw"))
        assert [e.ops for e in after] == [_set("i", 1), _set("i", 20), _set("i", 3)]
        assert (after[1].author, after[1].timestamp, after[1].step) == (old[1].author, old[1].timestamp, old[1].step)
        assert store.head("rw") == 3
        with pytest.raises(ValueError, match="no own events at versions"):
            store.rewrite_events("rw-fork", [replace(old[0], session_id="rw-fork")])  # the parent's, not its own
        with pytest.raises(ValueError):
            store.rewrite_events("rw", [replace(old[0], version=4)])
        assert [e.ops for e in store.read("rw")] == [e.ops for e in after]  # nothing changed
