"""PostgreSQL commits NOTIFY only the sessions someone watches (schema 5's ``watchers`` column):
nobody else's listeners are woken, and a watcher never misses a commit that races its arrival."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from saucer.store import ConflictError, open_store
from saucer.store.postgres import PostgresStore, split_url

pg = pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)


def _connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(split_url(url)[0], autocommit=True)


def _watchers(conn: Any, url: str, sid: str) -> list[int]:
    row = conn.execute(f'SELECT watchers FROM "{split_url(url)[1]}".sessions WHERE session_id = %s', (sid,)).fetchone()
    return sorted(row[0])


def _listening(url: str, channel: str) -> Any:
    conn = _connect(url)
    conn.execute(f'LISTEN "{channel}"')
    return conn


def _next_note(conn: Any) -> str:
    for note in conn.notifies(timeout=20, stop_after=1):
        return str(note.payload)
    raise AssertionError("no notification")


@pg
def test_a_commit_notifies_only_a_watched_session(store_url: str) -> None:
    with open_store(store_url) as store, _connect(store_url) as admin:
        assert isinstance(store, PostgresStore)
        store.create_session("quiet")
        store.create_session("seen")
        listener = _listening(store_url, store.channel)
        try:
            pid = listener.info.backend_pid
            admin.execute(f'UPDATE "{store.schema}".sessions SET watchers = %s WHERE session_id = %s', ([pid], "seen"))
            store.append("quiet", 0, [], author="w")
            store.append("seen", 0, [], author="w")
            # Notifications arrive in commit order: had "quiet" notified, its note would come first.
            assert _next_note(listener) == "1 seen"
        finally:
            listener.close()


@pg
def test_a_watcher_registers_while_watching_and_leaves_nothing_behind(store_url: str) -> None:
    with open_store(store_url) as store, open_store(store_url) as writer, _connect(store_url) as admin:
        store.create_session("s")
        seen: list[list[int]] = []

        async def follow() -> list[int]:
            got: list[int] = []
            async for event in store.watch("s", interval=30):  # only NOTIFY can wake it before the test's timeout
                got.append(event.version)
                if len(got) == 1:
                    seen.append(_watchers(admin, store_url, "s"))
                    await asyncio.to_thread(writer.append, "s", 1, [], author="w")
                if len(got) == 2:
                    return got
            return got

        writer.append("s", 0, [], author="w")
        assert asyncio.run(asyncio.wait_for(follow(), 20)) == [1, 2]
        assert len(seen[0]) == 1  # the listener's backend, while it watched
        assert _watchers(admin, store_url, "s") == []  # gone with it


@pg
def test_a_commit_racing_a_registration_still_notifies(store_url: str) -> None:
    """A commit whose statement began before a watcher registered, but reached the session row after,
    sees the registration (PostgreSQL re-reads the row it waited for) and notifies."""
    with open_store(store_url) as store, _connect(store_url) as admin:
        assert isinstance(store, PostgresStore)
        store.create_session("s")
        listener = _listening(store_url, store.channel)
        try:
            listener.execute("BEGIN")
            listener.execute(
                f'UPDATE "{store.schema}".sessions SET watchers = watchers || pg_backend_pid() WHERE session_id = %s',
                ("s",),
            )
            done: list[BaseException | None] = []

            def append() -> None:
                try:
                    store.append("s", 0, [], author="w")
                    done.append(None)
                except BaseException as exc:
                    done.append(exc)

            thread = threading.Thread(target=append)
            thread.start()
            deadline = time.monotonic() + 20
            while not admin.execute(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                (f'%"{store.schema}".leases%',),
            ).fetchone():
                assert time.monotonic() < deadline, "the append never waited for the registration"
                time.sleep(0.01)
            listener.execute("COMMIT")  # the registration commits while the append waits for the row
            thread.join(20)
            assert done == [None]
            assert _next_note(listener) == "1 s"
        finally:
            listener.close()


@pg
def test_watchers_arriving_during_commits_miss_none(store_url: str) -> None:
    """Watchers subscribe while another process commits without pause; each sees every commit after
    the version it started from, promptly (its safety-net poll is 30 s away)."""
    total = 300
    with open_store(store_url) as store, open_store(store_url) as writer:
        store.create_session("s")
        stop = threading.Event()

        def write() -> None:
            for v in range(total):
                if stop.is_set():
                    return
                writer.append("s", v, [], author="w")
                time.sleep(0.002)  # room for the watchers to come and go between commits

        async def one(after: int) -> list[int]:
            got: list[int] = []
            async for event in store.watch("s", after, interval=30):
                got.append(event.version)
                if event.version >= min(total, after + 3):
                    return got
            return got

        async def watchers() -> None:
            after = 0
            while after < total - 3:
                got = await asyncio.wait_for(one(after), 20)
                assert got == list(range(after + 1, got[-1] + 1))
                after = store.head("s")

        thread = threading.Thread(target=write)
        thread.start()
        try:
            asyncio.run(watchers())
        finally:
            stop.set()
            thread.join(20)


@pg
def test_the_pid_of_a_dead_listener_costs_only_notifications(store_url: str) -> None:
    """A listener that died without unregistering leaves its pid behind: commits still succeed (and
    notify for nobody) until the next registration for that session drops it."""
    with open_store(store_url) as store, open_store(store_url) as writer, _connect(store_url) as admin:
        assert isinstance(store, PostgresStore)
        store.create_session("s")
        dead = _connect(store_url)
        dead_pid = dead.info.backend_pid
        dead.close()
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (dead_pid,)).fetchone():
            time.sleep(0.01)
        admin.execute(f'UPDATE "{store.schema}".sessions SET watchers = %s WHERE session_id = %s', ([dead_pid], "s"))
        writer.append("s", 0, [], author="w")
        assert store.head("s") == 1

        async def follow() -> list[int]:
            async for event in store.watch("s", 1, interval=30):
                assert dead_pid not in _watchers(admin, store_url, "s")
                return [event.version]
            return []

        async def watch_and_write() -> list[int]:
            task = asyncio.create_task(follow())
            while not _watchers(admin, store_url, "s") or dead_pid in _watchers(admin, store_url, "s"):
                await asyncio.sleep(0.01)
            await asyncio.to_thread(writer.append, "s", 1, [], author="w")
            return await asyncio.wait_for(task, 20)

        assert asyncio.run(watch_and_write()) == [2]
        assert _watchers(admin, store_url, "s") == []


@pg
def test_a_schema_4_store_is_migrated_to_watchers(store_url: str) -> None:
    """A store as saucer 0.7.0 wrote it (schema 4: no watchers column) is migrated on open; its
    sessions have no watchers, and can be watched and written."""
    _, schema = split_url(store_url)
    with open_store(store_url) as store:
        store.create_session("old")
        store.append("old", 0, [{"op": "set", "var": "x", "value": 1}], author="t")
    with _connect(store_url) as conn:
        conn.execute(f'ALTER TABLE "{schema}".sessions DROP COLUMN watchers')
        conn.execute(f'DELETE FROM "{schema}".saucer_schema WHERE version = 5')
    with open_store(store_url) as store, open_store(store_url) as writer, _connect(store_url) as admin:
        assert isinstance(store, PostgresStore) and store.schema_version() == 5
        assert _watchers(admin, store_url, "old") == []

        async def follow() -> int:
            async for event in store.watch("old", 1, interval=30):
                return event.version
            return -1

        async def watch_and_write() -> int:
            task = asyncio.create_task(follow())
            while not _watchers(admin, store_url, "old"):
                await asyncio.sleep(0.01)
            await asyncio.to_thread(writer.append, "old", 1, [], author="t")
            return await asyncio.wait_for(task, 20)

        assert asyncio.run(watch_and_write()) == 2


@pg
def test_two_batches_sharing_two_sessions_do_not_deadlock(store_url: str) -> None:
    """Two batches in flight at once (two connections) that both write sessions x and y, queued in
    opposite orders: each statement locks the session rows in session order, so the second waits for
    the first instead of each holding a row the other needs (PostgreSQL would abort one after
    deadlock_timeout)."""
    from saucer.store._group import Pending
    from saucer.store.model import make_event

    with open_store(store_url) as store, _connect(store_url) as locker, _connect(store_url) as admin:
        assert isinstance(store, PostgresStore)
        for sid in ("x", "y"):
            store.create_session(sid)

        def entry(sid: str, expected: int) -> Pending:
            event = make_event(sid, expected + 1, time.time(), "w", None, None, [], {}, None)
            return Pending(event, expected, None, blocking=False)

        first = [entry("x", 0), entry("y", 0)]
        second = [entry("y", 0), entry("x", 0)]  # another writer of both, on the same versions
        errors: list[BaseException] = []

        def write(batch: list[Pending]) -> None:
            try:
                store._write_batch(batch)
            except BaseException as exc:
                errors.append(exc)

        def blocked() -> int:
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                (f'%"{store.schema}".leases%',),
            ).fetchone()
            return int(row[0])

        def wait_for(n: int) -> None:
            deadline = time.monotonic() + 20
            while blocked() < n:
                assert time.monotonic() < deadline, "the batches never waited"
                time.sleep(0.01)

        locker.execute("BEGIN")  # x held: the first batch waits for it, then the second
        locker.execute(f'SELECT 1 FROM "{store.schema}".sessions WHERE session_id = %s FOR UPDATE', ("x",))
        threads = [threading.Thread(target=write, args=(batch,)) for batch in (first, second)]
        threads[0].start()
        wait_for(1)
        threads[1].start()
        wait_for(2)
        locker.execute("COMMIT")
        for t in threads:
            t.join(30)
        assert errors == []
        # One batch wins both sessions, the other gets its conflicts: no deadlock error for either.
        assert [e.error for e in first] == [None, None]
        assert [type(e.error) for e in second] == [ConflictError, ConflictError]
        assert store.head("x") == store.head("y") == 1


@pg
def test_a_session_created_between_registration_and_first_read_is_registered_then(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A watcher's registration found no row (the session did not exist yet); its first read finds the
    session (created meanwhile): it registers again before it waits, so later commits notify it."""
    from saucer.store import _postgres_listen

    with open_store(store_url) as store, open_store(store_url) as writer, _connect(store_url) as admin:
        real_read = _postgres_listen._read_after
        created: list[bool] = []

        def read_after(on: Any, session_id: str, after: int) -> list[Any]:
            if not created:  # between the registration and the first read
                created.append(True)
                writer.create_session(session_id)
                writer.append(session_id, 0, [], author="w")
            return real_read(on, session_id, after)

        monkeypatch.setattr(_postgres_listen, "_read_after", read_after)
        seen: list[list[int]] = []

        async def follow() -> list[int]:
            got: list[int] = []
            async for event in store.watch("late", interval=30):  # only NOTIFY can wake it before the timeout
                got.append(event.version)
                if len(got) == 1:
                    seen.append(_watchers(admin, store_url, "late"))
                    await asyncio.to_thread(writer.append, "late", 1, [], author="w")
                if len(got) == 2:
                    return got
            return got

        assert asyncio.run(asyncio.wait_for(follow(), 20)) == [1, 2]
        assert created and len(seen[0]) == 1  # registered once the read found the session
