"""The store contract (:mod:`saucer.store.testing`), part: events: appends and their version checks, reads, streams, forks' lineage."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from saucer.store.base import EventStore
from saucer.store.model import (
    ConflictError,
    Event,
    EventDraft,
    Feature,
    FencedError,
    SessionNotFoundError,
    StoreError,
    ValueNotStorableError,
)
from saucer.store.summary import SummaryDelta
from saucer.store.testing.helpers import base_state, fill, set_op

__all__ = ["EventContract"]


class EventContract:
    """Events: appends and their version checks, reads, streams, forks' lineage. (A part of :class:`~saucer.store.testing.EventStoreContract`.)"""

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
            store.append("s", 0, set_op("x", 1), author="b")
        assert stale.value.expected == 0 and stale.value.actual == 1 and stale.value.session_id == "s"
        assert "another writer" in str(stale.value)
        with pytest.raises(ConflictError):
            store.append("s", 5, set_op("x", 1), author="b")  # from the future
        assert store.head("s") == 1 and len(list(store.read("s"))) == 1
        with pytest.raises(SessionNotFoundError):
            store.append("ghost", 0, set_op("x", 1), author="b")

    def test_async_appends_are_durable_and_reported(self, store: EventStore) -> None:
        store.create_session("a")
        store.create_session("b")
        written: list[Event] = []

        async def commit_both() -> list[Event]:
            return list(
                await asyncio.gather(
                    store.aappend("a", 0, set_op("x", 1), author="t", on_written=written.append),
                    store.aappend("b", 0, set_op("x", 2), author="t", round=1, step=2, on_written=written.append),
                )
            )

        events = asyncio.run(commit_both())
        assert sorted(written, key=lambda e: e.session_id) == events
        assert [(e.session_id, e.version, e.ops) for e in events] == [
            ("a", 1, set_op("x", 1)),
            ("b", 1, set_op("x", 2)),
        ]
        assert [e.ops for e in store.read("b")] == [set_op("x", 2)] and store.head("a") == 1

        async def stale() -> None:
            await store.aappend("a", 0, set_op("x", 3), author="t", on_written=written.append)

        with pytest.raises(ConflictError):
            asyncio.run(stale())
        assert len(written) == 2 and store.head("a") == 1

    def test_append_many_writes_consecutive_attributable_events(self, store: EventStore) -> None:
        store.create_session("m")
        fill(store, "m", 1)
        drafts = [
            EventDraft(set_op("a", 1), "system", meta={"kind": "start"}, timestamp=1_700_000_000.5),
            EventDraft(set_op("b", [2]), "agent:x", round=1, step=4, summary=SummaryDelta(status="running")),
            EventDraft([], "evaluator:e", round=1, meta={"kind": "end"}, summary=SummaryDelta(status="finished")),
        ]
        events = store.append_many("m", 1, drafts)
        assert [(e.version, e.author, e.round, e.step) for e in events] == [
            (2, "system", None, None),
            (3, "agent:x", 1, 4),
            (4, "evaluator:e", 1, None),
        ]
        assert events[0].timestamp == 1_700_000_000.5 and events[2].timestamp >= events[1].timestamp > 1.8e9 - 1e9
        read = list(store.read("m", 1))
        assert [(e.version, e.author, e.round, e.step, e.ops, e.meta) for e in read] == [
            (e.version, e.author, e.round, e.step, e.ops, e.meta) for e in events
        ]
        assert read[0].timestamp == 1_700_000_000.5 and store.head("m") == 4
        (row,) = store.list_sessions(ids=["m"])
        assert (row.status, row.steps, row.version) == ("finished", 4, 4)
        with pytest.raises(ValueError):
            store.append_many("m", 4, [])

    def test_append_many_is_all_or_none(self, store: EventStore) -> None:
        store.create_session("m")
        fill(store, "m", 2)
        two = [EventDraft(set_op("x", 1), "t"), EventDraft(set_op("y", 2), "t")]
        with pytest.raises(ConflictError) as stale:
            store.append_many("m", 1, two)  # another writer wrote version 2 meanwhile
        assert (stale.value.expected, stale.value.actual) == (1, 2)
        lease = store.acquire_lease("m", "w", ttl=30)
        with pytest.raises(FencedError):
            store.append_many("m", 2, two, fence=lease.token + 1)
        with pytest.raises(SessionNotFoundError):
            store.append_many("ghost", 0, two)
        assert store.head("m") == 2 and [e.version for e in store.read("m")] == [1, 2]
        assert [e.version for e in store.append_many("m", 2, two, fence=lease.token)] == [3, 4]

    def test_async_append_many_is_durable_and_reported(self, store: EventStore) -> None:
        store.create_session("a")
        store.create_session("b")
        written: list[list[Event]] = []
        drafts = [EventDraft(set_op("x", i), "t", round=1, step=i) for i in range(3)]

        async def commit_both() -> tuple[list[Event], Event]:
            many, one = await asyncio.gather(
                store.aappend_many("a", 0, drafts, on_written=written.append),
                store.aappend("b", 0, set_op("x", 9), author="t"),
            )
            return many, one

        many, one = asyncio.run(commit_both())
        assert written == [many] and [e.version for e in many] == [1, 2, 3] and one.version == 1
        assert [e.ops for e in store.read("a")] == [d.ops for d in drafts]

        async def stale() -> None:
            await store.aappend_many("a", 1, drafts, on_written=written.append)

        with pytest.raises(ConflictError):
            asyncio.run(stale())
        assert len(written) == 1 and store.head("a") == 3

    def test_watch_sees_every_event_of_append_many(self, store: EventStore) -> None:
        store.create_session("w")

        async def watch_while_appending() -> list[int]:
            seen: list[int] = []
            stream = store.watch("w", 0, interval=0.02)
            try:
                await store.aappend_many("w", 0, [EventDraft(set_op("i", i), "t") for i in range(3)])
                async for event in stream:
                    seen.append(event.version)
                    if len(seen) == 3:
                        break
            finally:
                await stream.aclose()  # type: ignore[attr-defined]  # watch() is an async generator
            return seen

        assert asyncio.run(asyncio.wait_for(watch_while_appending(), timeout=10)) == [1, 2, 3]

    def test_events_round_trip_exactly(self, store: EventStore) -> None:
        store.create_session("s")
        ops: list[dict[str, Any]] = [
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

    def test_meta_is_encoded_where_it_becomes_durable(self, store: EventStore) -> None:
        store.create_session("s")
        meta: dict[str, Any] = {"results": [{"out": "first"}], "cursor": {"round": 1}}
        store.append("s", 0, [], author="a", meta=meta)
        meta["results"][0]["out"], meta["cursor"]["round"] = "changed", 2  # still the caller's
        [event] = list(store.read("s"))
        assert event.meta == {"results": [{"out": "first"}], "cursor": {"round": 1}}
        event.meta["results"].append("mine")  # what a read gives is the reader's own
        assert next(iter(store.read("s"))).meta == {"results": [{"out": "first"}], "cursor": {"round": 1}}
        # What JSON cannot hold is refused before anything is written, synchronously or not.
        bad_metas: list[dict[Any, Any]] = [{"x": {1, 2}}, {"x": object()}, {1: "an int key"}]
        for bad in bad_metas:
            with pytest.raises(ValueNotStorableError, match="meta"):
                store.append("s", 1, [], author="a", meta=bad)
            with pytest.raises(ValueNotStorableError, match="meta"):
                asyncio.run(store.aappend("s", 1, [], author="a", meta=bad))
        assert store.head("s") == 1 and len(list(store.read("s"))) == 1

    def test_read_ranges(self, store: EventStore) -> None:
        store.create_session("s")
        fill(store, "s", 6)

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
        fill(store, "p", 5)
        store.create_session("c", parent_id="p", parent_version=3)
        fill(store, "c", 4, start=3)
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
        store.append("c", 7, set_op("i", 8), author="test")  # committed after the stream began: not in it
        assert [e.version for e in stream] == [2, 3, 4, 5, 6, 7]
        with pytest.raises(ValueError, match="batch"):
            next(store.iter_events("c", batch=0))
        with pytest.raises(SessionNotFoundError):
            next(store.iter_events("ghost"))

    def test_iter_events_refuses_a_log_pruned_under_it(self, store: EventStore) -> None:
        store.create_session("s")
        fill(store, "s", 10)
        store.create_session("gone")
        fill(store, "gone", 6)
        stream = store.iter_events("gone", batch=2)
        assert [next(stream).version for _ in range(3)] == [1, 2, 3]
        store.delete_session("gone")
        with pytest.raises(StoreError):  # never a stream that silently stops early
            list(stream)
        if Feature.REPLACE_HISTORY not in store.features:
            return
        stream = store.iter_events("s", batch=2)
        assert [next(stream).version for _ in range(3)] == [1, 2, 3]
        ops, state = base_state(8)
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
        fill(store, "p", 5)
        child = store.create_session("c", parent_id="p", parent_version=3)
        assert (child.parent_id, child.parent_version, child.version) == ("p", 3, 3)
        assert store.head("c") == 3
        with pytest.raises(ConflictError):
            store.append("c", 0, set_op("x", 1), author="c")
        store.append("c", 3, set_op("i", 100), author="c")
        store.append("c", 4, set_op("i", 101), author="c")
        lineage = list(store.read("c"))
        assert [(e.session_id, e.version) for e in lineage] == [("p", 1), ("p", 2), ("p", 3), ("c", 4), ("c", 5)]
        assert [(e.session_id, e.version) for e in store.read("c", 2, 4)] == [("p", 3), ("c", 4)]
        assert [e.version for e in store.read("c", 3)] == [4, 5]
        assert [e.version for e in store.read("c", 0, 2)] == [1, 2]
        assert [e.version for e in store.read("p")] == [1, 2, 3, 4, 5]  # the parent is untouched
        store.create_session("g", parent_id="c")  # at the child's head
        store.append("g", 5, set_op("i", 200), author="g")
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
