"""The store contract (:mod:`saucer.store.testing`), part: the optional features: replace_history (prune), import_log, rewrite_events."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from saucer.store.base import EventStore
from saucer.store.model import (
    Event,
    Feature,
    NotSupportedError,
    SessionExistsError,
    SessionInfo,
    Snapshot,
    VersionNotFoundError,
    VersionPrunedError,
)
from saucer.store.testing.helpers import base_state, fill, latest, set_op, snapshot_at

__all__ = ["FeatureContract"]


class FeatureContract:
    """The optional features: replace_history (prune), import_log, rewrite_events. (A part of :class:`~saucer.store.testing.EventStoreContract`.)"""

    # ------------------------------------------------ optional: history

    def test_replace_history_keeps_every_later_version(self, store: EventStore) -> None:
        store.create_session("s")
        fill(store, "s", 6)
        store.save_snapshot(snapshot_at("s", 2))
        ops, state = base_state(4)
        if Feature.REPLACE_HISTORY not in store.features:
            with pytest.raises(NotSupportedError):
                store.replace_history("s", 4, ops, state)
            return
        original = list(store.read("s", 3, 4))[0]
        assert store.replace_history("s", 4, ops, state) == 4 == store.first_version("s")
        events = list(store.read("s"))
        assert [e.version for e in events] == [4, 5, 6] and [e.ops for e in events[1:]] == [
            set_op("i", 5),
            set_op("i", 6),
        ]
        base = events[0]
        assert (base.author, base.ops, base.meta) == ("system", ops, {"pruned": {"upto": 4, "author": "test"}})
        assert (base.timestamp, base.round, base.step) == (original.timestamp, original.round, original.step)
        snap = store.latest_snapshot("s")
        assert snap is not None and (snap.version, snap.state) == (4, state)
        assert store.latest_snapshot("s", 3) is None  # older snapshots went with their versions
        with pytest.raises(VersionPrunedError) as pruned:
            store.check_readable("s", 3)
        assert pruned.value.first == 4
        assert store.replace_history("s", 3, *base_state(3)) == 4  # never goes back
        with pytest.raises(VersionNotFoundError):
            store.replace_history("s", 7, *base_state(7))
        store.append("s", 6, set_op("i", 7), author="test")  # writing goes on
        assert store.head("s") == 7

    def test_replace_history_gives_forks_their_own_copy(self, store: EventStore) -> None:
        if Feature.REPLACE_HISTORY not in store.features:
            return  # refused: see test_replace_history_keeps_every_later_version
        store.create_session("p")
        fill(store, "p", 6)
        store.create_session("f", parent_id="p", parent_version=3)
        store.append("f", 3, set_op("i", "fork"), author="fork")
        before = [(e.session_id, e.version, e.ops) for e in store.read("f")]
        assert store.replace_history("p", 5, *base_state(5)) == 5
        info = store.session_info("f")
        assert info.parent_id is None and info.meta["forked_from"] == "p" and info.meta["at"] == 3
        assert [(e.session_id, e.version, e.ops) for e in store.read("f")] == before
        assert store.first_version("f") == 0
        store.create_session("g", parent_id="f", parent_version=4)
        with pytest.raises(ValueError, match="above"):
            store.replace_history("g", 4, *base_state(4))  # a fork is cut only above its branch point

    # ------------------------------------------------- optional: import

    def test_import_log_is_all_or_nothing(self, store: EventStore) -> None:
        now = time.time()
        events = [Event("imp", v, now, "a", None, None, set_op("i", v)) for v in (1, 2, 3)]
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
        assert [e.ops for e in store.read("imp")] == [set_op("i", v) for v in (1, 2, 3)]
        assert latest(store, "imp").version == 3
        with pytest.raises(SessionExistsError):
            store.import_log(info, events, snapshots)

    # ------------------------------------------------- optional: rewrite

    def test_rewrite_events_in_place_and_report_formats(self, store: EventStore) -> None:

        from saucer.store.upcast import FORMAT_VERSION

        store.create_session("rw")
        for v in (1, 2, 3):
            store.append("rw", v - 1, set_op("i", v), author="a", round=1, step=v)
        store.save_snapshot(Snapshot("rw", 2, time.time(), {"names": {}, "vars": {"i": 2}}))
        store.create_session("rw-fork", parent_id="rw", parent_version=2)
        store.append("rw-fork", 2, set_op("f", 1), author="b")
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
        store.rewrite_events("rw", [replace(old[1], ops=set_op("i", 20))])
        after = list(store.read("rw"))
        assert [e.ops for e in after] == [set_op("i", 1), set_op("i", 20), set_op("i", 3)]
        assert (after[1].author, after[1].timestamp, after[1].step) == (old[1].author, old[1].timestamp, old[1].step)
        assert store.head("rw") == 3
        with pytest.raises(ValueError, match="no own events at versions"):
            store.rewrite_events("rw-fork", [replace(old[0], session_id="rw-fork")])  # the parent's, not its own
        with pytest.raises(ValueError):
            store.rewrite_events("rw", [replace(old[0], version=4)])
        assert [e.ops for e in store.read("rw")] == [e.ops for e in after]  # nothing changed
