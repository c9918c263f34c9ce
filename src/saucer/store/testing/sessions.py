"""The store contract (:mod:`saucer.store.testing`), part: sessions: creation, listing by recency and prefix, heads, leases as readers see them, deletion."""

from __future__ import annotations

import time

import pytest

from saucer.store.base import EventStore
from saucer.store.model import (
    SessionExistsError,
    SessionInfo,
    SessionNotFoundError,
    Snapshot,
    StoreError,
)
from saucer.store.testing.helpers import fill, set_op

__all__ = ["SessionContract"]


class SessionContract:
    """Sessions: creation, listing by recency and prefix, heads, leases as readers see them, deletion. (A part of :class:`~saucer.store.testing.EventStoreContract`.)"""

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
        store.append("a", 0, set_op("x", 1), author="t")
        listed = store.sessions()
        assert [i.session_id for i in listed] == ["a", "c", "b"]
        assert [i.version for i in listed] == [1, 0, 0]
        assert listed[0].updated_at > listed[1].updated_at

    def test_find_sessions_by_prefix_most_recent_first(self, store: EventStore) -> None:
        for sid in ("run-a1", "run-a2", "run-b1", "Run-a3", "r_n", "rxn", "other"):
            store.create_session(sid)
            time.sleep(0.002)
        store.append("run-a1", 0, set_op("x", 1), author="t")  # now the most recently updated

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
        fill(store, "p", 3)
        store.append(
            "p", 3, set_op("done", True), author="engine", round=2, step=5, meta={"kind": "session_end", "n": [1]}
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
        fill(store, "parent", 3)
        store.create_session("child", parent_id="parent", parent_version=2)
        with pytest.raises(StoreError, match="forks that read its log \\(child\\)"):
            store.delete_session("parent")
        assert store.head("parent") == 3 and [e.version for e in store.read("child")] == [1, 2]
        store.delete_session("child")
        store.delete_session("parent")
        assert not store.exists("parent") and not store.exists("child")

    def test_delete_session(self, store: EventStore) -> None:
        store.create_session("s")
        fill(store, "s", 3)
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
