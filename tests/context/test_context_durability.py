"""Durable Contexts: commits, durability modes, steps, queries, forks, snapshots, damage, conflicts."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pytest
from tests.support.context import CountingStore, damage_event, damage_snapshot, rows

from saucer.context import Context, ContextNames, prune
from saucer.store import (
    ConflictError,
    CorruptRecordError,
    FencedError,
    ReadOnlyError,
    SessionNotFoundError,
    open_store,
)

N = ContextNames


def _events(db: Path, sid: str) -> int:
    return sum(
        rows(db, f"SELECT COUNT(*) FROM {table} WHERE session_id = ?", sid)[0][0]
        for table in ("events", "events_recent")
    )


# ------------------------------------------------------------ durability


def test_open_creates_then_hydrates(db_url: str) -> None:
    ctx = Context.open(db_url, "s", author="agent:a")
    assert ctx.version == 0 and ctx.session_id == "s" and ctx.durability == "step"
    ctx.set(N.REQUEST, "hello")
    ctx.update_vars(set={"x": 1})
    assert ctx.commit() == 1
    assert ctx.commit() == 1  # nothing pending: no event
    ctx.close()
    again = Context.open(db_url, "s")
    assert again.version == 1 and again.get(N.REQUEST) == "hello" and again.get_var("x") == 1
    again.close()
    with pytest.raises(SessionNotFoundError, match="nope"):
        Context.open(db_url, "nope", create=False)
    with pytest.raises(ValueError, match="durability"):
        Context.open(db_url, "s", durability="sometimes")  # type: ignore[arg-type]


def test_strict_commits_every_change_before_returning(db_url: str, db_path: Path) -> None:
    ctx = Context.open(db_url, "s", durability="strict")
    ctx.set(N.REQUEST, "a")
    assert _events(db_path, "s") == 1
    ctx.update_vars(set={"x": 1, "y": 2})
    ctx.incr("n")
    ctx.append(N.PREVIOUS_SUBTASKS, "t")
    assert ctx.compare_and_set("x", 1, 5)
    assert _events(db_path, "s") == 5 and ctx.version == 5 and ctx.pending == []
    ctx.commit_step()
    assert _events(db_path, "s") == 5
    ctx.close()


def test_step_commits_one_event_per_step(db_url: str, db_path: Path) -> None:
    ctx = Context.open(db_url, "s")
    for i in range(3):
        with ctx.step(author="agent:x", step=i):
            ctx.update_vars(set={"a": i, "b": i})
            ctx.append("l", i)
            assert _events(db_path, "s") == i  # nothing written inside the step
    assert _events(db_path, "s") == 3
    ctx.set(N.SUBTASK, "s")
    assert ctx.commit_step() == 4
    ctx.close()
    assert _events(db_path, "s") == 4


def test_exit_commits_on_close_only(db_url: str, db_path: Path) -> None:
    ctx = Context.open(db_url, "s", durability="exit")
    for i in range(5):
        with ctx.step():
            ctx.incr("n")
            ctx.append("l", i)
        ctx.commit_step()
    assert _events(db_path, "s") == 0 and ctx.version == 0
    ctx.close()
    assert _events(db_path, "s") == 1
    again = Context.open(db_url, "s")
    assert again.get_var("n") == 5 and again.get_var("l") == [0, 1, 2, 3, 4]
    again.close()


def test_step_is_atomic_an_exception_discards_it(db_url: str, db_path: Path) -> None:
    ctx = Context.open(db_url, "s")
    with ctx.step():
        ctx.update_vars(set={"a": 1})
        ctx.append(N.PREVIOUS_SUBTASKS, "one")
    with pytest.raises(RuntimeError, match="boom"), ctx.step():
        ctx.update_vars(set={"a": 2, "b": 2})
        ctx.append(N.PREVIOUS_SUBTASKS, "two")
        ctx.incr(N.SESSION_STEP)
        raise RuntimeError("boom")
    assert ctx.get_var("a") == 1 and ctx.get_var("b") is None
    assert ctx.get(N.PREVIOUS_SUBTASKS) == ["one"] and ctx.get(N.SESSION_STEP) == 0
    assert ctx.pending == [] and _events(db_path, "s") == 1
    with ctx.step():
        ctx.update_vars(set={"c": 3})
    ctx.close()
    again = Context.open(db_url, "s")
    assert dict(again.vars) == {"a": 1, "c": 3}
    again.close()


def test_step_with_exit_durability_discards_only_the_failed_step(db_url: str) -> None:
    ctx = Context.open(db_url, "s", durability="exit")
    with ctx.step():
        ctx.update_vars(set={"a": 1})
    with pytest.raises(KeyError), ctx.step():
        ctx.update_vars(set={"a": 2})
        raise KeyError("x")
    with ctx.step():
        ctx.update_vars(set={"b": 1})
    assert dict(ctx.vars) == {"a": 1, "b": 1}
    ctx.close()
    again = Context.open(db_url, "s")
    assert dict(again.vars) == {"a": 1, "b": 1} and again.version == 1
    again.close()


def test_step_on_a_detached_context_also_discards() -> None:
    ctx = Context()
    ctx.update_vars(set={"a": 1})
    with pytest.raises(ValueError), ctx.step():
        ctx.update_vars(set={"a": 2})
        ctx.set(N.REQUEST, "x")
        raise ValueError
    assert dict(ctx.vars) == {"a": 1} and ctx.get(N.REQUEST) == ""


def test_an_exception_in_the_with_block_writes_neither_the_step_nor_a_snapshot_of_it(db_url: str) -> None:
    with pytest.raises(RuntimeError), Context.open(db_url, "s", snapshot_every=1000) as ctx:
        ctx.update_vars(set={"done": 1})
        ctx.commit()
        ctx.update_vars(set={"half": 1})
        raise RuntimeError("crash in the middle of a step")
    store = open_store(db_url)
    snap = store.latest_snapshot("s")
    assert snap is not None and snap.state["vars"] == {"done": 1}
    store.close()
    again = Context.open(db_url, "s")
    assert dict(again.vars) == {"done": 1}
    again.close()


# ---------------------------------------------------------------- queries


def _three_versions(db_url: str) -> Context:
    ctx = Context.open(db_url, "s", author="agent:planner")
    ctx.set(N.CURRENT_ROUND_ID, 1)
    ctx.set(N.REQUEST, "first")
    ctx.update_vars(set={"status": "planning"})
    ctx.commit(step=0)
    ctx.current_round_step += 1
    ctx.update_vars(set={"status": "working"})
    ctx.commit(author="tool:shell", step=1)
    ctx.set(N.CURRENT_ROUND_ID, 2)
    ctx.set(N.REQUEST, "second")
    ctx.commit(author="user", step=0, meta={"why": "new request"})
    return ctx


def test_read_only_at_a_version(db_url: str) -> None:
    ctx = _three_versions(db_url)
    old = Context.open(db_url, "s", at=1)
    assert old.read_only and old.version == 1
    assert old.get(N.REQUEST) == "first" and old.get_var("status") == "planning"
    assert old.get(N.ROUND_STEP) == {}
    mid = ctx.state_at(2)
    assert mid.get(N.ROUND_STEP) == {1: 1} and mid.current_round_step == 1
    for write in (
        lambda: old.set(N.REQUEST, "x"),
        lambda: old.update_vars(set={"a": 1}),
        lambda: old.incr("n"),
        lambda: old.append("l", 1),
        lambda: old.compare_and_set("status", "planning", "x"),
        lambda: old.update_dict({N.REQUEST: "x"}),
        old.commit,
    ):
        with pytest.raises(ReadOnlyError, match="fork"):
            write()
    assert old.get(N.REQUEST) == "first"
    old.close()
    with pytest.raises(ValueError, match="0..3"):
        Context.open(db_url, "s", at=4)
    with pytest.raises(SessionNotFoundError):
        Context.open(db_url, "ghost", at=0)
    ctx.close()


def test_history_names_author_round_and_step(db_url: str) -> None:
    ctx = _three_versions(db_url)
    everything = ctx.history()
    assert [e.version for e in everything] == [1, 2, 3]
    assert [e.author for e in everything] == ["agent:planner", "tool:shell", "user"]
    assert [e.round for e in everything] == [1, 1, 2]
    assert [e.step for e in everything] == [0, 1, 0]
    assert all(e.session_id == "s" and e.timestamp > 0 for e in everything)
    assert everything[2].meta == {"why": "new request"}
    assert [e.version for e in ctx.history(N.REQUEST)] == [1, 3]
    assert [e.version for e in ctx.history("REQUEST")] == [1, 3]
    assert [e.version for e in ctx.history("status")] == [1, 2]
    assert [e.version for e in ctx.history("vars.status")] == [1, 2]
    assert [e.version for e in ctx.history(N.CURRENT_ROUND_STEP)] == [2]  # via its ledger
    assert ctx.history("never") == []
    ctx.close()


def test_diff_between_versions(db_url: str) -> None:
    ctx = _three_versions(db_url)
    # a name not written yet is shown with its default, as state shows it at that version
    assert ctx.diff(1, 2) == {
        "ROUND_STEP": {"before": {}, "after": {"1": 1}},
        "vars.status": {"before": "planning", "after": "working"},
    }
    assert set(ctx.diff(2, 3)) == {"CURRENT_ROUND_ID", "REQUEST"}
    assert ctx.diff(0, 1)["REQUEST"] == {"before": "", "after": "first"}
    assert ctx.diff(3, 3) == {}
    ctx.close()


def test_fork_is_copy_on_write(db_url: str, db_path: Path) -> None:
    ctx = _three_versions(db_url)
    child = ctx.fork("child", at=2)
    assert child.session_id == "child" and child.version == 2 and not child.read_only
    assert child.get(N.REQUEST) == "first" and child.get_var("status") == "working"
    assert _events(db_path, "child") == 0  # the parent's log is referenced, not copied
    child.update_vars(set={"status": "forked"})
    assert child.commit() == 3
    assert _events(db_path, "child") == 1 and _events(db_path, "s") == 3
    assert [e.session_id for e in child.history()] == ["s", "s", "child"]
    assert ctx.get_var("status") == "working"
    child.close()
    reopened = Context.open(db_url, "child")
    assert reopened.get_var("status") == "forked" and reopened.get(N.REQUEST) == "first"
    assert Context.open(db_url, "child", at=2).get_var("status") == "working"
    grandchild = reopened.fork("grandchild")
    grandchild.incr("n")
    grandchild.commit()
    assert grandchild.get_var("status") == "forked" and grandchild.version == 4
    info = grandchild.store.session_info("grandchild")  # type: ignore[union-attr]
    assert (info.parent_id, info.parent_version) == ("child", 3)
    grandchild.close()
    reopened.close()
    ctx.close()


def test_fork_opens_bounded_even_after_the_parent_snapshots_move_on(db_url: str, counting: CountingStore) -> None:
    parent = Context.open(counting, "p", snapshot_every=10)
    for i in range(50):
        parent.update_vars(set={"i": i})
        parent.commit()
    child = parent.fork("c", at=25)
    for i in range(50, 200):
        parent.update_vars(set={"i": i})
        parent.commit()
    counting.reset()
    again = Context.open(counting, "c")
    assert again.get_var("i") == 24
    assert counting.events_read == 0
    child.close()
    again.close()
    parent.close()


def test_sessions_lists_versions_and_updates(db_url: str) -> None:
    store = open_store(db_url)
    a = Context.open(store, "a")
    b = Context.open(store, "b")
    a.update_vars(set={"x": 1})
    a.commit()
    b.update_vars(set={"x": 1})
    b.commit()
    b.update_vars(set={"x": 2})
    b.commit()
    listed = store.sessions()
    assert [(i.session_id, i.version) for i in listed] == [("b", 2), ("a", 1)]
    assert listed[0].updated_at >= listed[1].updated_at >= listed[1].created_at
    a.close()
    b.close()
    store.close()


# -------------------------------------------------------------- snapshots


def test_snapshots_every_k_events_and_on_close(db_url: str, db_path: Path) -> None:
    ctx = Context.open(db_url, "s", snapshot_every=10, keep_snapshots=100)
    for _i in range(25):
        ctx.incr("n")
        ctx.commit()
    versions = [r[0] for r in rows(db_path, "SELECT version FROM snapshots WHERE session_id = 's' ORDER BY version")]
    assert versions == [10, 20]
    ctx.close()
    versions = [r[0] for r in rows(db_path, "SELECT version FROM snapshots WHERE session_id = 's' ORDER BY version")]
    assert versions == [10, 20, 25]
    again = Context.open(db_url, "s")
    again.close()  # nothing new: no new snapshot
    assert len(rows(db_path, "SELECT version FROM snapshots")) == 3


def test_only_the_newest_snapshots_are_kept(db_url: str, db_path: Path) -> None:
    ctx = Context.open(db_url, "s", snapshot_every=5)
    for _i in range(33):
        ctx.append("log", "x" * 50)
        ctx.commit()
    ctx.close()
    versions = [r[0] for r in rows(db_path, "SELECT version FROM snapshots ORDER BY version")]
    assert versions == [30, 33]  # the default keeps two: the newest and a fallback
    one = Context.open(db_url, "t", snapshot_every=5, keep_snapshots=1)
    for _i in range(12):
        one.incr("n")
        one.commit()
    one.close()
    assert [r[0] for r in rows(db_path, "SELECT version FROM snapshots WHERE session_id = 't'")] == [12]


def test_hydrate_reads_only_the_snapshot_and_the_tail(counting: CountingStore) -> None:
    ctx = Context.open(counting, "s", snapshot_every=50)
    for i in range(1234):
        ctx.incr("n")
        ctx.append("l", i % 7)
        ctx.commit()
    # no close: no final snapshot, the tail is 1234 - 1200 events
    counting.reset()
    again = Context.open(counting, "s")
    assert again.version == 1234 and again.get_var("n") == 1234 and len(again.get_var("l")) == 1234
    assert counting.snapshots_read == 1 and counting.events_read == 34
    counting.reset()
    Context.open(counting, "s", at=1210).close()
    assert counting.events_read == 10
    ctx.close()
    counting.reset()
    Context.open(counting, "s").close()
    assert counting.events_read == 0


def test_int_round_ids_and_structural_logs_survive_storage(db_url: str) -> None:
    ctx = Context.open(db_url, "s", snapshot_every=3)
    for rnd in (1, 2):
        ctx.set(N.CURRENT_ROUND_ID, rnd)
        ctx.current_round_step += 2
        ctx.current_round_cost += 0.5
        ctx.current_round_subtask_amount += 1
        ctx.add_to_structural_logs({"Round": rnd, "SubtaskIndex": 0, "Action": f"a{rnd}"})
        ctx.add_to_structural_logs({"Round": rnd, "SubtaskIndex": 1, "Action": f"b{rnd}"})
        ctx.commit()
    expected = ctx.to_dict()
    for at in (None, 1):  # from the events (1 has no snapshot) and from a snapshot
        again = Context.open(db_url, "s", at=at)
        if at is None:
            assert again.to_dict() == expected
        for name in (N.ROUND_STEP, N.ROUND_COST, N.ROUND_SUBTASK_AMOUNT, N.STRUCTURAL_LOGS):
            assert all(type(k) is int for k in again.get(name)), name
        assert again.filter_structural_logs(1, 1, "Action") == ["b1"]
        again.close()
    ctx.close()  # snapshot on close
    again = Context.open(db_url, "s")
    assert again.to_dict() == expected
    assert again.get(N.ROUND_COST) == {1: 0.5, 2: 0.5} and again.current_round_cost == 0.5
    assert again.filter_structural_logs(2, 0, ["Action"]) == [{"Action": "a2"}]
    again.close()


# ----------------------------------------------------------------- damage


def _session(db_url: str, sid: str, n: int, **kw: object) -> None:
    ctx = Context.open(db_url, sid, **kw)  # type: ignore[arg-type]
    for i in range(n):
        ctx.update_vars(set={"i": i + 1})
        ctx.commit()
    ctx._work.pending = []  # noqa: SLF001
    ctx._work.closed = True  # noqa: SLF001  (no snapshot on close: leave the log as it is)
    ctx.store.close()  # type: ignore[union-attr]


def test_a_damaged_trailing_record_is_skipped_with_a_warning(db_url: str, db_path: Path) -> None:
    _session(db_url, "s", 5, snapshot_every=1000)
    damage_event(db_path, "s", 5)
    with pytest.warns(RuntimeWarning, match="damaged trailing record at version 5"):
        ctx = Context.open(db_url, "s")
    assert ctx.get_var("i") == 4 and ctx.version == 5
    ctx.update_vars(set={"i": 6})
    assert ctx.commit() == 6
    ctx.close()
    # The skipped record is now in the middle: it was marked, so it stays harmless.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = Context.open(db_url, "s", snapshot_every=1000)
        assert again.get_var("i") == 6
        history = again.history()
    assert history[4].ops == [] and "damaged" in history[4].meta
    again.close()


def test_a_damaged_record_in_the_middle_fails_that_session_only(db_url: str, db_path: Path) -> None:
    _session(db_url, "bad", 5, snapshot_every=1000)
    _session(db_url, "good", 5, snapshot_every=1000)
    damage_event(db_path, "bad", 3)
    with pytest.raises(CorruptRecordError, match="'bad'.*version 3") as info:
        Context.open(db_url, "bad")
    assert info.value.session_id == "bad" and info.value.version == 3
    good = Context.open(db_url, "good")
    assert good.get_var("i") == 5
    good.close()
    store = open_store(db_url)
    assert {i.session_id for i in store.sessions()} == {"bad", "good"}
    assert Context.open(store, "bad", at=2).get_var("i") == 2  # before the damage it still reads
    store.close()


def test_a_damaged_record_before_the_requested_version_is_not_trailing(db_url: str, db_path: Path) -> None:
    _session(db_url, "s", 5, snapshot_every=1000)
    damage_event(db_path, "s", 3)
    with pytest.raises(CorruptRecordError):
        Context.open(db_url, "s", at=3)  # the session goes on after 3: not a torn tail


def test_a_damaged_snapshot_falls_back(db_url: str, db_path: Path) -> None:
    _session(db_url, "s", 25, snapshot_every=10)
    damage_snapshot(db_path, "s", 20)
    with pytest.warns(RuntimeWarning, match="damaged snapshot at version 20"):
        ctx = Context.open(db_url, "s")
    assert ctx.get_var("i") == 25
    ctx.close()


def test_an_event_with_a_bad_checksum_is_damaged(db_url: str, db_path: Path) -> None:
    _session(db_url, "s", 3, snapshot_every=1000)
    damage_event(db_path, "s", 2, payload=b'{"ops":[{"op":"set","var":"i","value":99}]}')  # valid JSON, wrong crc
    with pytest.raises(CorruptRecordError, match="checksum"):
        Context.open(db_url, "s")


# -------------------------------------------------------------- conflicts


def test_plain_set_conflict_names_the_keys_and_reload_recovers(db_url: str) -> None:
    store = open_store(db_url)
    a = Context.open(store, "s")
    b = Context.open(store, "s")
    a.update_vars(set={"owner": "a"})
    a.set(N.SUBTASK, "a's subtask")
    a.commit()
    b.update_vars(set={"owner": "b"})
    b.set(N.REQUEST, "b's request")
    b.incr("n")
    with pytest.raises(ConflictError) as info:
        b.commit()
    # The keys the OTHER writer changed (what a reload brings in), not b's own.
    assert info.value.keys == ["vars.owner", "SUBTASK"]
    assert "SUBTASK" in str(info.value) and "REQUEST" not in str(info.value) and "reload" in str(info.value)
    b.reload()
    assert b.version == 1 and b.get_var("owner") == "a" and b.pending == []
    b.update_vars(set={"owner": "b"})
    assert b.commit() == 2
    a.close()
    b.close()
    store.close()


def test_an_atomic_only_batch_is_rebased(db_url: str) -> None:
    store = open_store(db_url)
    a = Context.open(store, "s")
    b = Context.open(store, "s")
    a.incr("n")
    a.append("l", "a")
    a.update_vars(set={"other": 1})
    a.commit()
    b.incr("n", 10)
    b.append("l", "b")
    b.incr(N.SESSION_STEP)
    assert b.commit() == 2
    assert b.get_var("n") == 11 and b.get_var("l") == ["a", "b"] and b.get_var("other") == 1
    fresh = Context.open(store, "s")
    assert fresh.get_var("n") == 11 and fresh.get(N.SESSION_STEP) == 1
    a.close()
    b.close()
    store.close()


def test_compare_and_set_is_rechecked_on_rebase(db_url: str) -> None:
    store = open_store(db_url)
    a = Context.open(store, "s")
    b = Context.open(store, "s")
    c = Context.open(store, "s")
    a.incr("n")
    a.commit()
    assert b.compare_and_set("status", None, "b")  # still holds after a's commit
    b.incr("n")
    assert b.commit() == 2 and b.get_var("n") == 2
    assert c.compare_and_set("status", None, "c")  # no longer holds: b set it
    with pytest.raises(ConflictError, match="vars.status"):
        c.commit()
    assert c.get_var("status") == "b" and c.pending == [] and c.version == 2
    # the check runs in order, after the operations before it in the batch
    d = Context.open(store, "s")
    e = Context.open(store, "s")
    d.incr("k")
    d.commit()
    e.incr("k")
    assert e.compare_and_set("k", 1, 100)
    with pytest.raises(ConflictError, match="vars.k"):
        e.commit()  # after the rebase, k is 2 when the cas runs
    for ctx in (a, b, c, d, e):
        ctx.close()
    store.close()


def test_an_atomic_op_that_no_longer_applies_is_a_conflict(db_url: str) -> None:
    store = open_store(db_url)
    a = Context.open(store, "s")
    b = Context.open(store, "s")
    a.update_vars(set={"x": "now a string"})
    a.commit()
    b.incr("x")
    with pytest.raises(ConflictError, match="vars.x"):
        b.commit()
    assert b.get_var("x") == "now a string"
    a.close()
    b.close()
    store.close()


def test_a_fenced_writer_is_refused(db_url: str) -> None:
    store = open_store(db_url)
    ctx = Context.open(store, "s")
    lease = store.acquire_lease("s", "w1", ttl=0.05)
    ctx.fence = lease.token
    ctx.incr("n")
    assert ctx.commit() == 1
    time.sleep(0.1)
    store.acquire_lease("s", "w2", ttl=10)
    ctx.incr("n")
    with pytest.raises(FencedError, match="w2"):
        ctx.commit()  # atomic ops are not re-based past a fence
    ctx.rollback()
    ctx.close()
    store.close()


def test_a_fork_of_a_context_opened_by_url_outlives_its_parent(db_url: str) -> None:
    parent = Context.open(db_url, "p")
    parent.update_vars(set={"x": 1})
    parent.commit()
    child = parent.fork("c")
    parent.close()
    child.update_vars(set={"x": 2})
    assert child.commit() == 2  # the shared store is still open
    child.close()
    with pytest.raises(Exception, match="closed"):
        child.store.head("c")  # type: ignore[union-attr]  # closed with the last owner
    assert Context.open(db_url, "c").get_var("x") == 2


def test_two_writers_creating_the_same_session_at_once(db_url: str) -> None:
    store = open_store(db_url)
    store.create_session("s")  # as if another process created it between exists() and create
    real_exists = store.exists
    store.exists = lambda sid: False  # type: ignore[method-assign]
    ctx = Context.open(store, "s")
    store.exists = real_exists  # type: ignore[method-assign]
    assert ctx.version == 0
    ctx.close()
    store.close()


def test_versions_before_a_prune_cannot_be_opened(db_url: str) -> None:
    ctx = Context.open(db_url, "s")
    for i in range(10):
        ctx.update_vars(set={"i": i})
        ctx.commit()
    prune(ctx.store, "s", keep_last=3)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="7..10"):
        Context.open(ctx.store, "s", at=3)  # type: ignore[arg-type]
    assert Context.open(ctx.store, "s", at=7).get_var("i") == 6  # type: ignore[arg-type]
    ctx.close()


def test_abort_discards_the_unfinished_step_and_closes(db_url: str) -> None:
    """What a runner does with a session it must leave mid-step (the engine after a lost lease)."""
    ctx = Context.open(db_url, "s", durability="exit")
    with ctx.step():
        ctx.update_vars(set={"done": 1})
    ctx.update_vars(set={"half": 1})
    ctx.abort()
    ctx.abort()  # a second abort (or close) changes nothing
    again = Context.open(db_url, "s")
    assert dict(again.vars) == {"done": 1}
    again.close()
