"""Retention: ``prune`` drops old history but every remaining version stays readable."""

from __future__ import annotations

import time
from typing import Any

import pytest

from saucer.context import Context, prune
from saucer.store import EventStore, StoreError, VersionNotFoundError, VersionPrunedError, open_store


def _plain(ctx: Context) -> dict[str, Any]:
    return ctx._plain()


def _states(store: EventStore, sid: str, versions: range) -> dict[int, dict[str, Any]]:
    return {v: _plain(Context.open(store, sid, at=v)) for v in versions}


def _fill(store: EventStore, sid: str, n: int, **open_kw: Any) -> Context:
    ctx = Context.open(store, sid, author="writer", **open_kw)
    for i in range(n):
        ctx.incr("n")
        ctx.update_vars(set={f"k{i % 4}": i})
        if i % 5 == 2:
            ctx.delete_var(f"k{(i + 1) % 4}")
        ctx.set("REQUEST", f"request {i}")
        ctx.commit(step=i)
    return ctx


@pytest.fixture
def store(store_url: str) -> Any:
    with open_store(store_url) as s:
        yield s


def test_keep_last_keeps_every_remaining_version_readable(store: EventStore) -> None:
    ctx = _fill(store, "s", 20, snapshot_every=7)
    before = _states(store, "s", range(0, 21))
    assert prune(store, "s", keep_last=5) == 15
    assert store.first_version("s") == 15
    events = list(store.read("s"))
    assert [e.version for e in events] == list(range(15, 21))
    assert events[0].author == "system" and events[0].meta["pruned"] == {"upto": 15, "author": "writer"}
    assert [e.author for e in events[1:]] == ["writer"] * 5
    assert _states(store, "s", range(15, 21)) == {v: before[v] for v in range(15, 21)}
    # The remaining log replays on its own, even with every snapshot gone.
    store.prune_snapshots("s", 0)
    assert _states(store, "s", range(15, 21)) == {v: before[v] for v in range(15, 21)}
    # Writing goes on as before.
    ctx.incr("n")
    assert ctx.commit() == 21
    assert Context.open(store, "s").get_var("n") == 21
    ctx.close()


def test_a_snapshot_is_kept_at_the_new_start(store: EventStore) -> None:
    _fill(store, "s", 10, snapshot_every=1000).close()
    store.prune_snapshots("s", 0)
    assert prune(store, "s", keep_last=3) == 7
    snap = store.latest_snapshot("s", 7)
    assert snap is not None and snap.version == 7
    assert store.latest_snapshot("s", 6) is None


def test_older_than_and_both_policies(store: EventStore) -> None:
    ctx = _fill(store, "s", 6)
    split = time.time() + 0.2  # in the middle of the gap between the two groups of commits
    time.sleep(0.4)
    for _ in range(4):
        ctx.incr("n")
        ctx.commit()
    before = _states(store, "s", range(0, 11))

    def older_than_split() -> float:
        # Measured at each call, so a slow machine does not move the line into the second group.
        return time.time() - split

    # Both policies: an event goes only when both allow it.
    assert prune(store, "s", keep_last=8, older_than=older_than_split()) == 2
    assert prune(store, "s", older_than=older_than_split()) == 6
    assert prune(store, "s", older_than=older_than_split()) == 6  # nothing more is old enough
    assert prune(store, "s", keep_last=100) == 6  # never goes back
    assert _states(store, "s", range(6, 11)) == {v: before[v] for v in range(6, 11)}
    ctx.close()


def _readable(store: EventStore, sid: str) -> dict[int, dict[str, Any]]:
    return _states(store, sid, range(store.first_version(sid), store.head(sid) + 1))


def _log(store: EventStore, sid: str) -> list[tuple[Any, ...]]:
    """The session's history as it reads (each event names the session where it was made)."""
    return [(e.session_id, e.version, e.timestamp, e.author, e.round, e.step, e.ops, e.meta) for e in store.read(sid)]


def test_pruning_a_parent_never_changes_what_its_forks_read(store: EventStore) -> None:
    # The case: B forked from A at 6, then A pruned to its last 2 versions.
    a = Context.open(store, "A")
    for i in range(1, 11):
        a.update_vars(set={"i": i})
        a.commit()
    b = a.fork("B", at=6)
    b.update_vars(set={"b": True})
    b.commit()
    c = Context.open(store, "B").fork("C", at=3)  # a fork of the fork, below B's branch point
    before = {sid: (_readable(store, sid), _log(store, sid)) for sid in ("A", "B", "C")}
    b_diff, c_history = b.diff(2, 7), Context.open(store, "C").history()

    assert prune(store, "A", keep_last=2) == 8
    assert _readable(store, "A") == {v: before["A"][0][v] for v in range(8, 11)}
    for sid in ("B", "C"):
        assert (_readable(store, sid), _log(store, sid)) == before[sid]
    assert _plain(Context.open(store, "B", at=2)) == {"vars.i": 2}
    assert Context.open(store, "B").diff(2, 7) == b_diff
    assert [e.version for e in Context.open(store, "C").history()] == [e.version for e in c_history] == [1, 2, 3]
    # B got its own copy of A's versions 1..6 and stands alone; it still says where it came from.
    info = store.session_info("B")
    assert (info.parent_id, info.parent_version) == (None, None)
    assert info.meta["forked_from"] == "A" and info.meta["at"] == 6
    assert store.session_info("C").parent_id == "B"  # C reads B, which is whole
    store.delete_session("A")  # nothing reads A's log any more
    assert (_readable(store, "B"), _log(store, "B")) == before["B"]
    for ctx in (a, b, c):
        ctx.close()


def test_a_pruned_version_is_an_error_naming_the_first_readable_one(store: EventStore) -> None:
    _fill(store, "s", 10).close()
    prune(store, "s", keep_last=3)
    for call in (
        lambda: Context.open(store, "s", at=2),
        lambda: Context.open(store, "s").state_at(6),
        lambda: Context.open(store, "s").diff(1, 9),
        lambda: Context.open(store, "s").fork("f", at=4),
        lambda: store.create_session("f", parent_id="s", parent_version=0),
    ):
        with pytest.raises(VersionPrunedError, match="the first readable version is 7") as caught:
            call()
        assert isinstance(caught.value, StoreError) and caught.value.first == 7
    assert not store.exists("f")
    with pytest.raises(VersionNotFoundError, match="has versions 7..10, not 11"):
        Context.open(store, "s", at=11)
    history = Context.open(store, "s").history()
    assert [e.version for e in history] == [7, 8, 9, 10] and history[0].meta["pruned"]["upto"] == 7


def test_a_fork_of_a_pruned_session_starts_where_its_parent_does(store: EventStore) -> None:
    _fill(store, "s", 10).close()
    prune(store, "s", keep_last=4)
    before = _readable(store, "s")
    child = Context.open(store, "s").fork("child", at=8)
    assert store.first_version("child") == 6
    assert _readable(store, "child") == {v: before[v] for v in range(6, 9)}
    with pytest.raises(VersionPrunedError, match="first readable version is 6"):
        Context.open(store, "child", at=5)
    # Pruning the parent again gives the fork its own copy from its first version on.
    prune(store, "s", keep_last=0)
    assert store.first_version("child") == 6 and store.session_info("child").parent_id is None
    assert _readable(store, "child") == {v: before[v] for v in range(6, 9)}
    assert [e.version for e in store.read("child")] == [6, 7, 8]
    child.close()


def test_pruning_a_fork_keeps_its_own_forks_and_cuts_only_its_own_log(store: EventStore) -> None:
    parent = _fill(store, "parent", 6)
    child = parent.fork("child", at=4)
    for i in range(5):
        child.update_vars(set={"own": i}, delete=["k0"])
        child.commit()  # versions 5..9
    grandchild = Context.open(store, "child").fork("grandchild", at=3)  # reads parent's versions 1..3 through child
    late = Context.open(store, "child").fork("late", at=7)
    before = {sid: _readable(store, sid) for sid in ("parent", "child", "grandchild", "late")}

    assert prune(store, "child", keep_last=20) == 0  # nothing to drop
    assert prune(store, "child", keep_last=8) == 0  # a fork is cut only above its branch point
    assert prune(store, "child", keep_last=2) == 7
    assert store.session_info("child").parent_id is None  # its log now replays on its own
    store.prune_snapshots("child", 0)
    assert _readable(store, "child") == {v: before["child"][v] for v in range(7, 10)}
    for sid in ("grandchild", "late"):  # they got their own copies first
        assert _readable(store, sid) == before[sid]
        assert store.session_info(sid).parent_id is None
    assert _readable(store, "parent") == before["parent"]  # untouched
    prune(store, "parent", keep_last=0)
    assert {sid: _readable(store, sid) for sid in ("grandchild", "late")} == {
        sid: before[sid] for sid in ("grandchild", "late")
    }
    for ctx in (parent, child, grandchild, late):
        ctx.close()


def test_a_fork_made_while_its_parent_is_pruned_is_never_left_reading_a_gap(store: EventStore) -> None:
    _fill(store, "s", 30).close()
    before = _readable(store, "s")
    made: list[str] = []
    original = type(store).materialise_rows

    def materialise_then_fork(self: EventStore, *args: Any) -> bool:
        done = original(self, *args)
        if len(made) < 3:  # a fork appears between the copies and the prune itself
            made.append(f"late{len(made)}")
            self.create_session(made[-1], parent_id="s", parent_version=5 + len(made))
        return done

    type(store).materialise_rows = materialise_then_fork  # type: ignore[method-assign]
    try:
        store.create_session("early", parent_id="s", parent_version=3)
        assert prune(store, "s", keep_last=5) == 25
    finally:
        type(store).materialise_rows = original  # type: ignore[method-assign]
    for sid in ["early", *made]:
        info = store.session_info(sid)
        assert info.parent_id is None, sid
        assert _readable(store, sid) == {v: before[v] for v in range(0, info.version + 1)}


def test_prune_arguments(store: EventStore) -> None:
    _fill(store, "s", 3).close()
    with pytest.raises(ValueError):
        prune(store, "s")
    with pytest.raises(ValueError):
        prune(store, "s", keep_last=-1)
    assert prune(store, "s", keep_last=3) == 0  # nothing to drop
    assert prune(store, "s", keep_last=0) == 3  # only the head is left, as a base event
    assert [e.version for e in store.read("s")] == [3]
    assert _plain(Context.open(store, "s"))["vars.n"] == 3


def test_pruning_while_a_writer_commits(store: EventStore) -> None:
    import threading

    writer = Context.open(store, "s", author="writer")
    done = threading.Event()

    def write() -> None:
        for _ in range(60):
            writer.incr("n")
            writer.commit()
        done.set()

    thread = threading.Thread(target=write)
    thread.start()
    starts = []
    while not done.is_set():
        starts.append(prune(store, "s", keep_last=3))
        time.sleep(0.005)
    thread.join()
    assert starts == sorted(starts)  # never goes back
    first = store.first_version("s")
    assert [_plain(Context.open(store, "s", at=v))["vars.n"] for v in range(max(first, 1), 61)] == list(
        range(max(first, 1), 61)
    )
    writer.close()
