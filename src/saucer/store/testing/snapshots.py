"""The store contract (:mod:`saucer.store.testing`), part: snapshots, leases and watching a session."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from saucer.store.base import EventStore
from saucer.store.model import (
    ConflictError,
    Feature,
    FencedError,
    LeaseHeldError,
    SessionExistsError,
    SessionNotFoundError,
    Snapshot,
)
from saucer.store.testing.helpers import fill, latest, set_op, snapshot_at

__all__ = ["SnapshotLeaseContract"]


class SnapshotLeaseContract:
    """Snapshots, leases and watching a session. (A part of :class:`~saucer.store.testing.EventStoreContract`.)"""

    # ---------------------------------------------------------- snapshots

    def test_snapshots_latest_and_upto(self, store: EventStore) -> None:
        store.create_session("s")
        fill(store, "s", 6)
        assert store.latest_snapshot("s") is None
        store.save_snapshot(snapshot_at("s", 2))
        store.save_snapshot(snapshot_at("s", 4))
        newest = store.latest_snapshot("s")
        assert newest is not None and newest.version == 4 and newest.session_id == "s"
        assert newest.state == {"names": {"ROUND_STEP": {"1": 4}}, "vars": {"i": 4}}
        assert latest(store, "s", 3).version == 2
        assert latest(store, "s", 4).version == 4
        assert store.latest_snapshot("s", 1) is None
        assert store.events_since_snapshot("s") == 2
        replacement = Snapshot("s", 4, time.time(), {"names": {}, "vars": {"i": "again"}})
        store.save_snapshot(replacement)
        assert latest(store, "s").state["vars"] == {"i": "again"}
        big = Snapshot("s", 6, time.time(), {"names": {}, "vars": {"log": ["x" * 100] * 500}})
        store.save_snapshot(big)
        assert latest(store, "s").state == big.state

    def test_forks_use_their_parents_snapshots_up_to_the_fork_point(self, store: EventStore) -> None:
        store.create_session("p")
        fill(store, "p", 6)
        store.save_snapshot(snapshot_at("p", 2))
        store.save_snapshot(snapshot_at("p", 5))
        store.create_session("c", parent_id="p", parent_version=4)
        assert latest(store, "c").version == 2
        store.save_snapshot(snapshot_at("c", 4))
        own = store.latest_snapshot("c")
        assert own is not None and own.session_id == "c" and own.version == 4
        assert latest(store, "c", 3).version == 2

    def test_prune_snapshots_keeps_the_newest(self, store: EventStore) -> None:
        store.create_session("s")
        store.create_session("t")
        fill(store, "s", 8)
        fill(store, "t", 2)
        for v in (2, 4, 6, 8):
            store.save_snapshot(snapshot_at("s", v))
        store.save_snapshot(snapshot_at("t", 2))
        store.prune_snapshots("s", 2)
        assert latest(store, "s").version == 8
        if Feature.SNAPSHOT_PRUNING not in store.features:
            return  # a cache it may keep whole: the newest is what counts
        assert latest(store, "s", 7).version == 6
        assert store.latest_snapshot("s", 5) is None
        store.prune_snapshots("s", 0)
        assert store.latest_snapshot("s") is None
        assert latest(store, "t").version == 2  # other sessions untouched

    def test_a_snapshot_saved_pruned_keeps_itself_and_the_newest_others(self, store: EventStore) -> None:
        store.create_session("s")
        store.create_session("t")
        fill(store, "s", 8)
        fill(store, "t", 2)
        for v in (2, 4, 6):
            store.save_snapshot(snapshot_at("s", v))
        store.save_snapshot(snapshot_at("t", 2))
        store.save_snapshot_pruned(snapshot_at("s", 8), 1)  # the newest other (6) and this one
        store.save_snapshot_pruned(snapshot_at("s", 8), 2)  # again at its own version: replaced, never dropped
        assert latest(store, "s").version == 8 and latest(store, "t").version == 2
        if Feature.SNAPSHOT_PRUNING not in store.features:
            return
        assert latest(store, "s", 7).version == 6
        assert store.latest_snapshot("s", 5) is None
        store.save_snapshot_pruned(snapshot_at("s", 8), 0)
        assert latest(store, "s").version == 8 and store.latest_snapshot("s", 7) is None

    def test_quarantine_leaves_readable_records_alone(self, store: EventStore) -> None:
        store.create_session("s")
        fill(store, "s", 2)
        assert store.quarantine_record("s", 2) is False  # readable: nothing to do
        assert store.quarantine_record("s", 9) is False  # no such record
        assert [e.ops for e in store.read("s")] == [set_op("i", 1), set_op("i", 2)]

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

    def test_a_session_created_leased_is_its_runner_s_at_once(self, store: EventStore) -> None:
        info, lease = store.create_session_leased(
            "s", owner="worker-1", ttl=30, meta={"task": "t"}, participants=["human:bob"]
        )
        assert info.session_id == "s" and info.version == 0 and info.participants == frozenset({"human:bob"})
        assert store.session_info("s").meta["task"] == "t" and store.session_info("s").participants == frozenset(
            {"human:bob"}
        )
        assert lease.owner == "worker-1" and lease.token >= 1 and lease.expires_at > time.time() + 20
        with pytest.raises(LeaseHeldError, match="worker-1"):
            store.acquire_lease("s", "worker-2", ttl=30)
        store.append("s", 0, set_op("x", 1), author="w1", fence=lease.token)  # its token fences commits
        with pytest.raises(SessionExistsError):  # taken: nothing is created, nor leased
            store.create_session_leased("s", owner="worker-2", ttl=30)
        assert store.lease_of("s").owner == "worker-1" and store.head("s") == 1  # type: ignore[union-attr]
        store.release_lease(lease)
        assert store.acquire_lease("s", "worker-2", ttl=30).token > lease.token

    def test_an_expired_lease_is_taken_over_and_fences_the_old_holder(self, store: EventStore) -> None:
        store.create_session("s")
        old = store.acquire_lease("s", "worker-1", ttl=0.05)
        store.append("s", 0, set_op("x", 1), author="w1", fence=old.token)
        time.sleep(0.1)
        new = store.acquire_lease("s", "worker-2", ttl=30)
        assert new.token > old.token and new.owner == "worker-2"
        with pytest.raises(FencedError, match="worker-2") as fenced:
            store.append("s", 1, set_op("x", 2), author="w1", fence=old.token)
        assert isinstance(fenced.value, ConflictError)
        assert store.head("s") == 1
        store.append("s", 1, set_op("x", 3), author="w2", fence=new.token)
        assert store.head("s") == 2
        store.release_lease(old)  # taken over already: releasing it changes nothing
        with pytest.raises(LeaseHeldError):
            store.acquire_lease("s", "worker-3", ttl=30)
        store.release_lease(new)
        third = store.acquire_lease("s", "worker-3", ttl=30)
        assert third.token > new.token

    def test_a_last_snapshot_gives_the_lease_back_with_it(self, store: EventStore) -> None:
        _, lease = store.create_session_leased("s", owner="worker-1", ttl=30)
        fill(store, "s", 4)
        store.save_snapshot(snapshot_at("s", 2))
        store.save_snapshot_released(snapshot_at("s", 4), 1, lease)  # the newest other (2) and this one kept
        assert latest(store, "s").version == 4 and latest(store, "s", 3).version == 2
        assert store.acquire_lease("s", "worker-2", ttl=30).token > lease.token  # free at once

    def test_a_last_snapshot_never_gives_back_a_lease_taken_over(self, store: EventStore) -> None:
        _, old = store.create_session_leased("s", owner="worker-1", ttl=0.05)
        fill(store, "s", 2)
        time.sleep(0.1)
        new = store.acquire_lease("s", "worker-2", ttl=30)
        store.save_snapshot_released(snapshot_at("s", 2), 1, old)  # a cache: stored; the lease is worker-2's
        assert latest(store, "s").version == 2
        with pytest.raises(LeaseHeldError, match="worker-2"):
            store.acquire_lease("s", "worker-3", ttl=30)
        assert store.lease_of("s").token == new.token  # type: ignore[union-attr]

    # -------------------------------------------------------------- watch

    def test_watch_yields_new_events(self, store_factory: Callable[[], EventStore], store: EventStore) -> None:
        store.create_session("s")
        fill(store, "s", 2)

        def writer() -> None:
            other = store_factory()
            try:
                for i in range(2, 5):
                    time.sleep(0.05)
                    other.append("s", i, set_op("i", i + 1), author="writer")
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
                await stream.aclose()  # type: ignore[attr-defined]  # watch() is an async generator
            return seen

        thread = threading.Thread(target=writer)
        thread.start()
        try:
            seen = asyncio.run(asyncio.wait_for(collect(), timeout=10))
        finally:
            thread.join()
        assert seen == [2, 3, 4, 5]
