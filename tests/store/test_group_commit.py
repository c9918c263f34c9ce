"""Group commit: concurrent appends share transactions, yet each is durable and checked on its own."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from saucer.context import Context
from saucer.context.events import Event
from saucer.store import ConflictError, EventStore, FencedError, SessionNotFoundError, open_store
from saucer.store._group import GroupCommitter, Pending

backends = pytest.mark.parametrize("store_url", ["sqlite", "postgresql"], indirect=True)


def _run_threads(n: int, target: Callable[[int], None]) -> list[BaseException]:
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def run(i: int) -> None:
        try:
            barrier.wait()
            target(i)
        except BaseException as exc:  # collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


def _hold_the_leader(store: Any) -> tuple[threading.Event, Callable[[], None]]:
    """Make the next batch of one block until released, so that appends queue up behind it.

    Returns (started, release): ``started`` is set once the blocking write began.
    """
    committer = store._group_committer()
    committer.max_inflight = 1  # one batch in flight: the others queue behind the held one
    original = committer._write_one
    started, gate = threading.Event(), threading.Event()
    first = [True]

    def write_one(entry: Pending) -> None:
        if first[0]:
            first[0] = False
            started.set()
            gate.wait(30)
        original(entry)

    committer._write_one = write_one
    return started, gate.set


@backends
def test_many_sessions_commit_concurrently_and_durably(store_url: str) -> None:
    store = open_store(store_url)
    observer = open_store(store_url)  # a second connection: sees only what is committed
    threads, commits = 30, 20
    try:
        contexts = [Context.open(store, f"s{i}", author=f"t{i}") for i in range(threads)]

        def work(i: int) -> None:
            ctx = contexts[i]
            for k in range(commits):
                ctx.incr("n")
                ctx.append("seen", k)
                ctx.set("REQUEST", f"request {k}")
                version = ctx.commit(step=k)
                # Durable when commit() returns: another connection already sees it.
                assert observer.head(f"s{i}") >= version

        assert _run_threads(threads, work) == []
        committer = store._group_committer()
        assert committer.entries >= threads * commits
        assert committer.largest_batch > 1, "concurrent commits never shared a transaction"
        for ctx in contexts:
            ctx.close()
    finally:
        store.close()
        observer.close()

    with open_store(store_url) as fresh:
        for i in range(threads):
            ctx = Context.open(fresh, f"s{i}", create=False)
            assert ctx.get_var("n") == commits
            assert ctx.get_var("seen") == list(range(commits))
            assert ctx.get("REQUEST") == f"request {commits - 1}"
            assert [e.step for e in ctx.history()] == list(range(commits))


@backends
def test_a_refused_append_fails_only_its_own_caller(store_url: str) -> None:
    store = open_store(store_url)
    try:
        for i in range(12):
            store.create_session(f"s{i}")
            store.append(f"s{i}", 0, [{"op": "set", "var": "x", "value": 0}], author="setup")
        leases = {i: store.acquire_lease(f"s{i}", "owner", 60) for i in (8, 9)}
        store.release_lease(leases[9])
        leases[9] = store.acquire_lease("s9", "thief", 60)  # token 2: "owner"'s token 1 is stale

        # (session, expected version, fence, outcome)
        plan: list[tuple[str, int, int | None, type[BaseException] | None]] = [
            *[(f"s{i}", 1, None, None) for i in range(6)],
            *[(f"s{i}", 0, None, ConflictError) for i in (6, 7)],
            ("s8", 1, leases[8].token, None),
            ("s9", 1, 1, FencedError),
            ("nobody", 0, None, SessionNotFoundError),
            ("s10", 1, None, None),
            ("s10", 1, None, ConflictError),  # the same session twice: the second is stale
        ]
        started, release = _hold_the_leader(store)
        outcomes: dict[int, BaseException | None] = {}

        def blocker() -> None:
            store.append("s11", 1, [{"op": "set", "var": "x", "value": 1}], author="blocker")

        holder = threading.Thread(target=blocker)
        holder.start()
        assert started.wait(10)

        def append(i: int) -> None:
            sid, expected, fence, _ = plan[i]
            try:
                store.append(sid, expected, [{"op": "set", "var": "x", "value": i}], author=f"a{i}", fence=fence)
                outcomes[i] = None
            except Exception as exc:
                outcomes[i] = exc

        threads = [threading.Thread(target=append, args=(i,)) for i in range(len(plan))]
        for t in threads:
            t.start()
        committer = store._group_committer()
        deadline = time.monotonic() + 10
        while len(committer._queue) < len(plan):
            assert time.monotonic() < deadline, "appends did not queue up"
            time.sleep(0.005)
        release()
        holder.join(10)
        for t in threads:
            t.join(10)
        assert committer.largest_batch == len(plan), "the queued appends were not written as one batch"

        for i, (sid, _expected, _fence, outcome) in enumerate(plan[:-2]):
            if outcome is None:
                assert outcomes[i] is None, (sid, outcomes[i])
            else:
                assert type(outcomes[i]) is outcome, (sid, outcomes[i])
        assert isinstance(outcomes[7], ConflictError) and outcomes[7].actual == 1
        assert isinstance(outcomes[9], FencedError) and outcomes[9].holder == "thief"
        # Of the two appends to s10 based on version 1, exactly one got in.
        s10 = [outcomes[len(plan) - 2], outcomes[len(plan) - 1]]
        assert sum(o is None for o in s10) == 1 and any(isinstance(o, ConflictError) for o in s10)

        for i in range(12):
            refused = i in (6, 7, 9)
            assert store.head(f"s{i}") == (1 if refused else 2)
        assert [e.author for e in store.read("s6")] == ["setup"]
    finally:
        store.close()


def _break_appends_to(url: str, session_id: str) -> None:
    """Make every write of an event of ``session_id`` fail in the database (as a bug or a hand edit could)."""
    if url.startswith("sqlite"):
        import sqlite3

        from saucer.store.sqlite import path_from_url

        with sqlite3.connect(path_from_url(url)) as conn:
            conn.execute(
                "CREATE TRIGGER break_appends BEFORE INSERT ON events_recent "
                f"WHEN NEW.session_id = '{session_id}' BEGIN SELECT RAISE(ABORT, 'broken on purpose'); END"
            )
    else:
        import psycopg

        from saucer.store.postgres import split_url

        conninfo, schema = split_url(url)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            # A row at version 1 without moving the head: the next append's INSERT hits a duplicate key.
            conn.execute(
                f'INSERT INTO "{schema}".events (session_id, version, ts, author, payload) VALUES (%s, 1, 0, %s, %s)',
                (session_id, "stray", b'{"ops":[]}'),
            )


@backends
def test_a_batch_that_fails_as_a_whole_is_retried_entry_by_entry(store_url: str) -> None:
    store = open_store(store_url)
    try:
        for i in range(5):
            store.create_session(f"s{i}")
        _break_appends_to(store_url, "s3")  # s3's next append fails in the database
        started, release = _hold_the_leader(store)
        holder = threading.Thread(target=lambda: store.append("s4", 0, [], author="blocker"))
        holder.start()
        assert started.wait(10)
        outcomes: dict[int, BaseException | None] = {}

        def append(i: int) -> None:
            try:
                store.append(f"s{i}", 0, [{"op": "incr", "var": "n", "by": 1}], author="w")
                outcomes[i] = None
            except Exception as exc:
                outcomes[i] = exc

        threads = [threading.Thread(target=append, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        committer = store._group_committer()
        while len(committer._queue) < 4:
            time.sleep(0.005)
        release()
        holder.join(10)
        for t in threads:
            t.join(10)
        assert outcomes[3] is not None
        assert all(outcomes[i] is None for i in range(3)), outcomes
        assert [store.head(f"s{i}") for i in range(5)] == [1, 1, 1, 0, 1]
    finally:
        store.close()


@backends
def test_group_commit_can_be_turned_off(store_url: str) -> None:
    store = open_store(store_url)
    try:
        store.group_commit = False
        store.create_session("s")
        for k in range(3):
            store.append("s", k, [{"op": "incr", "var": "n", "by": 1}], author="w")
        with pytest.raises(ConflictError):
            store.append("s", 1, [], author="w")
        assert store._group_committer().entries == 0
        assert store.head("s") == 3
    finally:
        store.close()


@pytest.mark.parametrize("max_inflight", [1, 2])
def test_the_committer_releases_each_caller_only_after_its_batch_is_written(max_inflight: int) -> None:
    written: set[int] = set()
    lock = threading.Lock()
    batches: list[int] = []
    running = [0, 0]  # batches being written now, the most at once

    def write_batch(entries: list[Pending]) -> None:
        with lock:
            running[0] += 1
            running[1] = max(running)
        time.sleep(0.0005)  # a flush; other callers queue meanwhile
        with lock:
            running[0] -= 1
            batches.append(len(entries))
            for e in entries:
                if e.event.version % 97 == 0:
                    e.error = ConflictError(e.event.session_id, e.expected, None)
                else:
                    written.add(id(e.event))

    def write_one(entry: Pending) -> None:
        write_batch([entry])
        if entry.error is not None:
            raise entry.error

    committer = GroupCommitter(write_batch, write_one, max_inflight=max_inflight)
    threads, per_thread = 40, 100

    def work(i: int) -> None:
        for k in range(1, per_thread + 1):
            event = Event(f"s{i}", k, 0.0, "w", None, None, [])
            try:
                committer.append(event, k - 1, None)
            except ConflictError:
                assert k % 97 == 0
                continue
            assert k % 97 != 0
            with lock:
                assert id(event) in written, "released before its batch was written"

    assert _run_threads(threads, work) == []
    assert committer.entries == threads * per_thread == sum(batches)
    assert max(batches) > 1
    assert running[1] <= max_inflight


def test_with_two_batches_in_flight_the_next_one_is_written_while_the_first_is_and_a_third_waits() -> None:
    gates = {sid: threading.Event() for sid in ("a", "b")}
    started = {sid: threading.Event() for sid in ("a", "b", "c")}

    def write_one(entry: Pending) -> None:
        sid = entry.event.session_id
        started[sid].set()
        if sid in gates:
            assert gates[sid].wait(10)

    committer = GroupCommitter(lambda entries: None, write_one, max_inflight=2)
    committer.split_over = 1  # batches of one: each is worth a second one beside it
    threads = {
        sid: threading.Thread(target=committer.append, args=(Event(sid, 1, 0.0, "w", None, None, []), 0, None))
        for sid in ("a", "b", "c")
    }
    threads["a"].start()
    assert started["a"].wait(10)
    threads["b"].start()  # "a" is being written: "b" leads a second batch at once
    assert started["b"].wait(10)
    threads["c"].start()  # two batches in flight: "c" waits for one of them
    deadline = time.monotonic() + 10
    while not committer._queue:
        assert time.monotonic() < deadline, "c did not queue"
        time.sleep(0.001)
    assert not started["c"].is_set()
    gates["b"].set()
    threads["b"].join(10)
    assert started["c"].wait(10)  # written once a batch in flight was
    threads["c"].join(10)
    assert threads["a"].is_alive()  # "a" is still held: nothing waited for it
    gates["a"].set()
    for t in threads.values():
        t.join(10)
    assert committer.batches == 3 and not committer._queue and not committer._busy and committer._inflight == 0


def test_a_small_batch_is_not_written_beside_another() -> None:
    # A second transaction in flight costs the server a WAL flush: worth it only for a batch
    # of split_over appends or more. Behind a held batch of one, the next append waits.
    gate, started = threading.Event(), threading.Event()
    written: list[str] = []

    def write_one(entry: Pending) -> None:
        if entry.event.session_id == "a":
            started.set()
            assert gate.wait(10)
        written.append(entry.event.session_id)

    committer = GroupCommitter(lambda entries: None, write_one, max_inflight=2)
    a = threading.Thread(target=committer.append, args=(Event("a", 1, 0.0, "w", None, None, []), 0, None))
    b = threading.Thread(target=committer.append, args=(Event("b", 1, 0.0, "w", None, None, []), 0, None))
    a.start()
    assert started.wait(10)
    b.start()
    deadline = time.monotonic() + 10
    while not committer._queue:
        assert time.monotonic() < deadline, "b did not queue"
        time.sleep(0.001)
    assert written == [] and committer._inflight == 1
    gate.set()
    a.join(10)
    b.join(10)
    assert written == ["a", "b"] and committer._inflight == 0 and not committer._busy


@pytest.mark.parametrize(("max_inflight", "queued", "first"), [(1, 40, 40), (2, 40, 20), (2, 31, 31)])
def test_a_queue_found_idle_is_split_between_the_batches_that_may_be_in_flight(
    max_inflight: int, queued: int, first: int
) -> None:
    import asyncio

    batches: list[int] = []

    def write_batch(entries: list[Pending]) -> None:
        batches.append(len(entries))

    committer = GroupCommitter(write_batch, lambda entry: None, off_loop=True, max_inflight=max_inflight)

    async def main() -> None:
        await asyncio.gather(
            *(committer.append_async(Event(f"s{i}", 1, 0.0, "w", None, None, []), 0, None) for i in range(queued))
        )

    try:
        asyncio.run(main())
    finally:
        committer.close()
    # Appends queued with nothing in flight: with two batches allowed, half of them go at once
    # and the next leader takes the rest (split again if the first was written by then), unless
    # the halves would be small (split_over = 16).
    assert batches[0] == first and sum(batches) == queued
    assert committer._inflight == 0 and not committer._busy


def test_the_committer_falls_back_to_single_writes_when_a_batch_fails() -> None:
    def write_batch(entries: list[Pending]) -> None:
        raise RuntimeError("the whole batch failed")

    def write_one(entry: Pending) -> None:
        if entry.event.session_id == "bad":
            raise ValueError("bad entry")

    committer = GroupCommitter(write_batch, write_one)
    gate = threading.Event()
    original = committer._write_one
    first = [True]

    def slow_one(entry: Pending) -> None:
        if first[0]:
            first[0] = False
            gate.wait(10)
        original(entry)

    committer._write_one = slow_one
    results: dict[str, BaseException | None] = {}

    def append(sid: str) -> None:
        try:
            committer.append(Event(sid, 1, 0.0, "w", None, None, []), 0, None)
            results[sid] = None
        except Exception as exc:
            results[sid] = exc

    first_thread = threading.Thread(target=append, args=("first",))
    first_thread.start()
    while first[0]:
        time.sleep(0.001)
    others = [threading.Thread(target=append, args=(sid,)) for sid in ("a", "bad", "b")]
    for t in others:
        t.start()
    while len(committer._queue) < 3:
        time.sleep(0.001)
    gate.set()
    for t in [first_thread, *others]:
        t.join(10)
    assert results["first"] is None and results["a"] is None and results["b"] is None
    assert isinstance(results["bad"], ValueError)


@pytest.mark.parametrize("outcome", ["written", "refused", "interrupted"])
def test_a_caller_that_found_the_committer_idle_hands_over_to_those_that_queued_during_its_write(
    outcome: str,
) -> None:
    # A thread alone leads at once, with no queue entry: those that queue while it writes are
    # the next batch, whether its own write succeeded, was refused, or was interrupted.
    gate, started = threading.Event(), threading.Event()
    written: list[list[str]] = []

    def write_one(entry: Pending) -> None:
        if entry.event.session_id == "first":
            started.set()
            gate.wait(10)
            if outcome == "refused":
                raise ConflictError("first", 0, 1)
            if outcome == "interrupted":
                raise KeyboardInterrupt
        written.append([entry.event.session_id])

    def write_batch(entries: list[Pending]) -> None:
        written.append([e.event.session_id for e in entries])

    committer = GroupCommitter(write_batch, write_one)
    results: dict[str, BaseException | None] = {}

    def append(sid: str) -> None:
        try:
            committer.append(Event(sid, 1, 0.0, "w", None, None, []), 0, None)
            results[sid] = None
        except BaseException as exc:  # collected for the assertion
            results[sid] = exc

    first = threading.Thread(target=append, args=("first",))
    first.start()
    assert started.wait(10)
    assert committer._busy and not committer._queue  # leading, with no entry queued
    others = [threading.Thread(target=append, args=(sid,)) for sid in ("a", "b")]
    for t in others:
        t.start()
    deadline = time.monotonic() + 10
    while len(committer._queue) < 2:
        assert time.monotonic() < deadline, "the others did not queue"
        time.sleep(0.001)
    gate.set()
    for t in [first, *others]:
        t.join(10)
    assert results["a"] is None and results["b"] is None
    assert sorted(sum(written[-1:], [])) == ["a", "b"]  # one batch, after the first write
    expected = {"written": type(None), "refused": ConflictError, "interrupted": KeyboardInterrupt}[outcome]
    assert isinstance(results["first"], expected)
    assert not committer._busy and not committer._queue and committer._inflight == 0


def test_a_single_writer_writes_alone(tmp_path: Any) -> None:
    store: EventStore = open_store(f"sqlite:///{tmp_path}/x.db")
    try:
        store.create_session("s")
        for k in range(20):
            store.append("s", k, [], author="w")
        committer = store._group_committer()  # type: ignore[attr-defined]
        assert committer.batches == committer.entries == 20 and committer.largest_batch == 1
    finally:
        store.close()


def test_events_appended_together_are_never_split_and_fail_together() -> None:
    """append(more=...) is ONE entry: one batch, one transaction, never retried one by one."""
    batches: list[list[tuple[str, int]]] = []
    fail_batches = [False]

    def write_batch(entries: list[Pending]) -> None:
        batches.append([(e.event.session_id, e.event.version) for e in entries])
        if fail_batches[0] and len(entries) > 2:
            raise RuntimeError("the whole batch failed")  # the fallback must keep the group whole
        for e in entries:
            if e.lead is not None and e.lead.error is not None:
                e.error = e.lead.error
            elif e.event.session_id == "stale":
                e.error = ConflictError("stale", e.expected, 9)

    def write_one(entry: Pending) -> None:
        assert not entry.more and entry.lead is None, "a group was split"
        write_batch([entry])
        if entry.error is not None:
            raise entry.error

    committer = GroupCommitter(write_batch, write_one)
    group = [Event("g", v, 0.0, "w", None, None, []) for v in (1, 2, 3)]
    committer.append(group[0], 0, None, group[1:])
    assert batches == [[("g", 1), ("g", 2), ("g", 3)]]
    fail_batches[0] = True

    errors: list[BaseException] = []
    gate, release = _hold_the_leader_of(committer)
    threads = [threading.Thread(target=committer.append, args=(Event("one", 1, 0.0, "w", None, None, []), 0, None))]
    stale = [Event("stale", v, 0.0, "w", None, None, []) for v in (1, 2)]

    def stale_group() -> None:
        try:
            committer.append(stale[0], 0, None, stale[1:])
        except ConflictError as exc:
            errors.append(exc)

    threads.append(threading.Thread(target=stale_group))
    first = threading.Thread(target=committer.append, args=(Event("first", 1, 0.0, "w", None, None, []), 0, None))
    first.start()
    assert gate.wait(10)
    for t in threads:
        t.start()
    time.sleep(0.2)  # both queue behind the held leader
    release()
    for t in (first, *threads):
        t.join(10)
    assert len(errors) == 1 and errors[0].expected == 0  # type: ignore[attr-defined]  # a ConflictError
    # The shared batch failed as a whole; then "one" was written alone and the group as one batch.
    assert sorted(batches[2]) == [("one", 1), ("stale", 1), ("stale", 2)]
    assert sorted(batches[3:]) == [[("one", 1)], [("stale", 1), ("stale", 2)]]


@pytest.mark.parametrize(("max_batch", "fail_shared", "first"), [(1000, False, 60), (30, False, 30), (1000, True, 60)])
def test_with_two_batches_in_flight_groups_stay_whole_count_as_their_events_and_fail_together(
    max_batch: int, fail_shared: bool, first: int
) -> None:
    """append_async(more=...) beside max_inflight=2: a group is never split between the two batches (nor
    by the half split of an idle queue, nor by max_batch, which counts events), and a refusal of its
    first event fails the whole group; with fail_shared a shared batch fails as a whole and each group
    is written again alone, whole."""
    import asyncio

    batches: list[list[tuple[str, int]]] = []

    def write_batch(entries: list[Pending]) -> None:
        if fail_shared and len({e.event.session_id for e in entries}) > 1:
            raise RuntimeError("the whole batch failed")
        batches.append([(e.event.session_id, e.event.version) for e in entries])
        for e in entries:
            if e.lead is not None and e.lead.error is not None:
                e.error = e.lead.error
            elif e.event.session_id == "s7":
                e.error = ConflictError("s7", e.expected, 9)

    def write_one(entry: Pending) -> None:
        assert not entry.more and entry.lead is None, "a group was split"
        write_batch([entry])

    committer = GroupCommitter(write_batch, write_one, off_loop=True, max_inflight=2, max_batch=max_batch)
    written: list[int] = []

    async def one(i: int) -> int | None:
        events = [Event(f"s{i}", v, 0.0, "w", None, None, []) for v in (1, 2, 3)]
        try:
            await committer.append_async(events[0], 0, None, lambda: written.append(i), events[1:])
        except ConflictError:
            return i
        return None

    async def main() -> list[int | None]:
        return await asyncio.gather(*(one(i) for i in range(40)))

    try:
        refused = asyncio.run(main())
    finally:
        committer.close()
    assert [i for i in refused if i is not None] == [7] and sorted(written) == [i for i in range(40) if i != 7]
    for batch in batches:
        assert len(batch) <= max_batch
        versions: dict[str, list[int]] = {}
        for sid, version in batch:
            versions.setdefault(sid, []).append(version)
        assert all(v == [1, 2, 3] for v in versions.values()), "a group was split"
    assert sorted(sid for batch in batches for sid, v in batch if v == 1) == sorted(f"s{i}" for i in range(40))
    # 40 callers queued with nothing in flight: the half split counts callers (20 groups, 60 events),
    # max_batch counts events (30: 10 groups).
    assert fail_shared or len(batches[0]) == first
    assert committer.entries == 120 and committer._inflight == 0 and not committer._busy


def _hold_the_leader_of(committer: GroupCommitter) -> tuple[threading.Event, Callable[[], None]]:
    gate, go = threading.Event(), threading.Event()
    original = committer._write_one
    held = [True]

    def write_one(entry: Pending) -> None:
        if held[0]:
            held[0] = False
            gate.set()
            go.wait(10)
        original(entry)

    committer._write_one = write_one
    return gate, go.set


def test_the_remembered_loop_is_always_the_running_one() -> None:
    """append_async finds its loop without asyncio.get_running_loop() (a getpid() system call each time
    on Python 3.11): the loop a thread last ran, only while it still runs in that thread."""
    import asyncio
    import os

    from saucer.store import _loop

    async def here() -> tuple[Any, Any]:
        return _loop.this_loop(), asyncio.get_running_loop()

    for _ in range(2):  # a new loop each time in this thread: never the previous one
        mine, running = asyncio.run(here())
        assert mine is running
    assert _loop.running_loop() is None  # that loop has stopped: none runs here now

    seen: list[tuple[Any, Any]] = []
    other = threading.Thread(target=lambda: seen.append(asyncio.run(here())))
    other.start()
    other.join(10)
    assert seen[0][0] is seen[0][1] and seen[0][0] is not mine

    async def forked() -> int:
        _loop.this_loop()
        pid = os.fork()
        if pid == 0:  # the child runs no loop of its parent's
            os._exit(0 if not _loop._loops else 1)
        return os.waitpid(pid, 0)[1]

    assert asyncio.run(forked()) == 0
