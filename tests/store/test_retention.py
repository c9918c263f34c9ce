"""Retention: ``prune`` drops old history but every remaining version stays readable."""

from __future__ import annotations

import time
from typing import Any

import pytest

from saucer.context import Context
from saucer.store import EventStore, open_store


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
    assert store.prune("s", keep_last=5) == 15
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
    assert store.prune("s", keep_last=3) == 7
    snap = store.latest_snapshot("s", 7)
    assert snap is not None and snap.version == 7
    assert store.latest_snapshot("s", 6) is None


def test_older_than_and_both_policies(store: EventStore) -> None:
    ctx = _fill(store, "s", 6)
    time.sleep(0.4)
    for _ in range(4):
        ctx.incr("n")
        ctx.commit()
    before = _states(store, "s", range(0, 11))
    # Both policies: an event goes only when both allow it.
    assert store.prune("s", keep_last=8, older_than=0.2) == 2
    assert store.prune("s", older_than=0.2) == 6
    assert store.prune("s", older_than=0.2) == 6  # nothing more is old enough
    assert store.prune("s", keep_last=100) == 6  # never goes back
    assert _states(store, "s", range(6, 11)) == {v: before[v] for v in range(6, 11)}
    ctx.close()


def test_pruning_stops_at_a_fork_point_and_forks_stay_readable(store: EventStore) -> None:
    parent = _fill(store, "parent", 10)
    child = parent.fork("child", at=4)
    child.delete_var("k0")
    child.update_vars(set={"own": 1})
    child.commit()
    child.incr("n")
    child.commit()
    parent_states = _states(store, "parent", range(0, 11))
    child_states = _states(store, "child", range(0, 7))

    assert store.prune("parent", keep_last=2) == 4  # the fork still reads the parent up to 4
    assert _states(store, "parent", range(4, 11)) == {v: parent_states[v] for v in range(4, 11)}
    assert _states(store, "child", range(4, 7)) == {v: child_states[v] for v in range(4, 7)}

    # Pruning the fork itself: its base undoes what it deleted from the parent's state.
    assert store.prune("child", keep_last=1) == 5
    store.prune_snapshots("child", 0)
    assert _states(store, "child", range(5, 7)) == {v: child_states[v] for v in range(5, 7)}
    assert "vars.k0" not in child_states[6] and _plain(Context.open(store, "child"))["vars.own"] == 1
    parent.close()
    child.close()


def test_prune_arguments(store: EventStore) -> None:
    _fill(store, "s", 3).close()
    with pytest.raises(ValueError):
        store.prune("s")
    with pytest.raises(ValueError):
        store.prune("s", keep_last=-1)
    assert store.prune("s", keep_last=3) == 0  # nothing to drop
    assert store.prune("s", keep_last=0) == 3  # only the head is left, as a base event
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
        starts.append(store.prune("s", keep_last=3))
        time.sleep(0.005)
    thread.join()
    assert starts == sorted(starts)  # never goes back
    first = store.first_version("s")
    assert [_plain(Context.open(store, "s", at=v))["vars.n"] for v in range(max(first, 1), 61)] == list(
        range(max(first, 1), 61)
    )
    writer.close()
