"""What only the PostgreSQL store has: URLs with a schema, migrations, the server's clock, LISTEN/NOTIFY."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid
from typing import Any

import pytest

from saucer.context import Context
from saucer.store import LeaseHeldError, StoreError, open_store
from saucer.store._postgres_conn import display_url as _display
from saucer.store.postgres import SCHEMA_VERSION, PostgresStore, split_url

pg = pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)


def _connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(split_url(url)[0], autocommit=True)


def test_split_url() -> None:
    assert split_url("postgresql://u@h:5432/db") == ("postgresql://u@h:5432/db", "saucer")
    assert split_url("postgresql://u@h/db?schema=tenant_7&sslmode=disable") == (
        "postgresql://u@h/db?sslmode=disable",
        "tenant_7",
    )
    assert split_url("postgres://h/db?schema=Odd-Name") == ("postgres://h/db", "Odd-Name")
    with pytest.raises(ValueError, match="schema"):
        split_url("postgresql://h/db?schema=")
    with pytest.raises(ValueError, match="not a PostgreSQL"):
        split_url("mysql://h/db")
    assert _display("postgresql://me:s3cret@h/db?schema=x") == "postgresql://me:***@h/db?schema=x"


def test_an_unreachable_server_is_a_clear_error() -> None:
    started = time.monotonic()
    with pytest.raises(StoreError, match=r"cannot connect to PostgreSQL at postgresql://me:\*\*\*@127\.0\.0\.1:1/db"):
        PostgresStore("postgresql://me:pw@127.0.0.1:1/db?schema=x", connect_timeout=2)
    assert time.monotonic() - started < 10


@pg
def test_the_schema_is_created_on_first_use_and_versioned(store_url: str) -> None:
    _, schema = split_url(store_url)
    with open_store(store_url) as store:
        assert isinstance(store, PostgresStore)
        assert store.schema_version() == SCHEMA_VERSION
        assert store.migrate() == SCHEMA_VERSION  # again: nothing to do
    with _connect(store_url) as conn:
        rows = conn.execute(f'SELECT version FROM "{schema}".saucer_schema ORDER BY version').fetchall()
        tables = {
            r[0]
            for r in conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,))
        }
    assert [r[0] for r in rows] == list(range(1, SCHEMA_VERSION + 1))
    assert tables == {"saucer_schema", "saucer_format", "sessions", "events", "snapshots", "leases"}


def _session_indexes(conn: Any, schema: str) -> list[str]:
    rows = conn.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = %s AND tablename = 'sessions' ORDER BY indexname",
        (schema,),
    ).fetchall()
    return [r[0] for r in rows]


@pg
def test_a_commit_updates_no_indexed_column_of_its_session_row(store_url: str) -> None:
    # Every commit moves its session's head and updated_at: with no index on them, PostgreSQL
    # updates the row in place (HOT). Schema 3 indexed updated_at; migrating drops that index.
    _, schema = split_url(store_url)
    with open_store(store_url) as store:
        store.create_session("s")
        store.append("s", 0, [{"op": "set", "var": "x", "value": 1}], author="t")
    with _connect(store_url) as conn:
        assert _session_indexes(conn, schema) == ["sessions_pkey"]
        conn.execute(f'CREATE INDEX sessions_updated_at ON "{schema}".sessions (updated_at DESC)')
        conn.execute(f'ALTER TABLE "{schema}".sessions DROP COLUMN watchers')
        conn.execute(f'DELETE FROM "{schema}".saucer_schema WHERE version >= 4')  # back to schema 3
    with open_store(store_url) as store:
        assert isinstance(store, PostgresStore) and store.schema_version() == SCHEMA_VERSION == 5
        store.create_session("t")
        assert [info.session_id for info in store.sessions()] == ["t", "s"]  # newest first, without the index
        assert [s.session_id for s in store.list_sessions()] == ["t", "s"]
    with _connect(store_url) as conn:
        assert _session_indexes(conn, schema) == ["sessions_pkey"]


@pg
def test_concurrent_first_opens_migrate_once(store_url: str) -> None:
    errors: list[BaseException] = []
    stores: list[PostgresStore] = []
    barrier = threading.Barrier(6)

    def open_one() -> None:
        try:
            barrier.wait()
            stores.append(PostgresStore(store_url))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for s in stores:
        s.close()
    assert errors == []
    with _connect(store_url) as conn:
        count = conn.execute(f'SELECT count(*) FROM "{split_url(store_url)[1]}".saucer_schema').fetchone()[0]
    assert count == SCHEMA_VERSION


@pg
def test_a_newer_schema_is_refused(store_url: str) -> None:
    open_store(store_url).close()
    with _connect(store_url) as conn:
        conn.execute(
            f'INSERT INTO "{split_url(store_url)[1]}".saucer_schema (version) VALUES (%s)', (SCHEMA_VERSION + 1,)
        )
    with pytest.raises(StoreError, match="newer than this saucer"):
        open_store(store_url)


@pg
def test_schemas_are_separate_stores(store_url: str) -> None:
    other = store_url.replace("schema=", "schema=x")
    try:
        with open_store(store_url) as a, open_store(other) as b:
            a.create_session("same")
            a.append("same", 0, [{"op": "set", "var": "x", "value": "a"}], author="t")
            assert not b.exists("same")
            b.create_session("same")
            assert b.head("same") == 0 and a.head("same") == 1
    finally:
        with _connect(other) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{split_url(other)[1]}" CASCADE')


@pg
def test_leases_expire_by_the_server_clock(store_url: str) -> None:
    with open_store(store_url) as store, _connect(store_url) as conn:
        store.create_session("s")
        server_now = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]
        lease = store.acquire_lease("s", "w1", 30)
        assert abs(lease.expires_at - (server_now + 30)) < 2
        with pytest.raises(LeaseHeldError, match="'w1'") as info:
            store.acquire_lease("s", "w2", 30)
        assert info.value.holder == "w1"
        # Move the lease's expiry into the past on the server: it is free at once.
        conn.execute(
            f'UPDATE "{split_url(store_url)[1]}".leases SET expires_at = %s WHERE session_id = %s',
            (server_now - 1, "s"),
        )
        taken = store.acquire_lease("s", "w2", 30)
        assert taken.token == lease.token + 1


@pg
def test_watch_is_woken_by_notify(store_url: str) -> None:
    with open_store(store_url) as store, open_store(store_url) as writer:
        store.create_session("watched")
        store.create_session("other")

        async def follow() -> list[tuple[int, float]]:
            got: list[tuple[int, float]] = []
            # A poll interval far longer than the test: only NOTIFY can wake it in time.
            async for event in store.watch("watched", interval=30):
                got.append((event.version, time.monotonic()))
                if len(got) == 3:
                    return got
            return got

        def write() -> None:
            time.sleep(0.5)
            for v in range(3):
                writer.append("other", v, [], author="noise")
                writer.append("watched", v, [{"op": "incr", "var": "n", "by": 1}], author="w")
                time.sleep(0.1)

        thread = threading.Thread(target=write)
        started = time.monotonic()
        thread.start()
        got = asyncio.run(asyncio.wait_for(follow(), 10))
        thread.join()
        assert [v for v, _ in got] == [1, 2, 3]
        assert got[-1][1] - started < 4


@pg
def test_watch_falls_back_to_polling_without_listen(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import psycopg

    async def refuse(*args: Any, **kwargs: Any) -> Any:
        raise psycopg.OperationalError("no LISTEN for you")

    with open_store(store_url) as store:
        store.create_session("s")
        store.append("s", 0, [], author="w")
        monkeypatch.setattr(psycopg.AsyncConnection, "connect", refuse)

        async def first() -> int:
            async for event in store.watch("s", interval=0.05):
                return event.version
            return -1

        with pytest.warns(RuntimeWarning, match="polling"):
            assert asyncio.run(asyncio.wait_for(first(), 5)) == 1


@pg
def test_a_closed_store_says_so(store_url: str) -> None:
    store = open_store(store_url)
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.sessions()


@pg
def test_snapshots_and_context_round_trip(store_url: str) -> None:
    sid = f"s-{uuid.uuid4().hex[:6]}"
    with open_store(store_url) as store:
        ctx = Context.open(store, sid, snapshot_every=3)
        for _i in range(10):
            ctx.incr("n")
            ctx.commit()
        ctx.close()
        assert store.latest_snapshot(sid) is not None
        assert store.events_since_snapshot(sid) < 3
        assert Context.open(store, sid).get_var("n") == 10


@pg
def test_a_connection_lost_mid_commit_is_reported_not_retried(store_url: str) -> None:
    _, schema = split_url(store_url)
    with open_store(store_url) as store, _connect(store_url) as locker, _connect(store_url) as admin:
        store.create_session("s")
        # Hold the session row, so that the append blocks inside its statement.
        locker.execute("BEGIN")
        locker.execute(f'SELECT 1 FROM "{schema}".sessions WHERE session_id = %s FOR UPDATE', ("s",))
        outcome: list[BaseException | None] = []

        def append() -> None:
            try:
                store.append("s", 0, [{"op": "incr", "var": "n", "by": 1}], author="w")
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=append)
        thread.start()
        deadline = time.monotonic() + 10
        while True:
            row = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                (f'%"{schema}".leases%',),  # early in the statement: the text is cut at 1 kB
            ).fetchone()
            if row:
                break
            assert time.monotonic() < deadline, "the append never blocked"
            time.sleep(0.02)
        admin.execute("SELECT pg_terminate_backend(%s)", (row[0],))
        thread.join(10)
        locker.execute("ROLLBACK")
        assert len(outcome) == 1 and isinstance(outcome[0], StoreError)
        assert "may or may not be written" in str(outcome[0])
        assert store.head("s") == 0  # the store is usable again; this time nothing was written


@pg
def test_a_batch_keeps_every_field_exactly(store_url: str) -> None:
    """The append statement gets its batch as JSON rows: texts, timestamps, costs (non-finite ones
    too) and summaries arrive as they were sent, and are counted as the memory store counts them."""
    from saucer.store.summary import SummaryDelta

    odd = ['quo"te \\ back', "ünï € 𝄞", "new\nline\ttab", "'; DROP TABLE x; --", '{"s": 1}']
    summaries: list[SummaryDelta | None] = [
        SummaryDelta("running", rounds_add=1, cost_add=0.1, reason=odd[0]),
        None,
        SummaryDelta(cost_add=float("inf"), unknown=True, reason=odd[1]),
        SummaryDelta("finished", final_rounds=2, final_steps=7, final_cost=float("nan")),
        SummaryDelta(cost_add=-1e-300, reason="x" * 600),  # cut to the kept length, as apply() does
    ]
    oracle = open_store(f"memory://batch-{uuid.uuid4().hex}")
    store = open_store(store_url)
    assert isinstance(store, PostgresStore)
    try:
        for s in (store, oracle):
            for i in range(len(odd)):
                s.create_session(f"s{i}")

        async def batch(s: Any, expected: int) -> list[Any]:
            return await asyncio.gather(
                *(
                    s.aappend(
                        f"s{i}",
                        expected,
                        [{"op": "set", "var": "x", "value": odd[i]}],
                        author=odd[i],
                        round=i,
                        step=2**62 + expected if i == 2 else expected + i,  # past a double's exact integers
                        summary=summaries[(i + expected) % len(summaries)],
                    )
                    for i in range(len(odd))
                )
            )

        written = []
        for expected in range(3):
            written += asyncio.run(batch(store, expected))
            asyncio.run(batch(oracle, expected))
        assert store._group_committer().largest_batch == len(odd)  # one statement each time
        for event in written:
            stored = list(store.read(event.session_id, event.version - 1, event.version))
            # (the summary is checked below, by what it counted: a record keeps no non-finite cost)
            assert [(e.timestamp, e.author, e.round, e.step, e.ops) for e in stored] == [
                (event.timestamp, event.author, event.round, event.step, event.ops)
            ]
        for i in range(len(odd)):
            got, want = store.kept_counters(f"s{i}"), oracle.kept_counters(f"s{i}")
            assert got is not None and want is not None
            assert dataclasses.replace(got, cost=0.0) == dataclasses.replace(want, cost=0.0)
            assert str(got.cost) == str(want.cost)  # inf and nan alike
    finally:
        store.close()
        oracle.close()


@pg
def test_an_entry_that_cannot_be_encoded_fails_alone_with_a_store_error(store_url: str) -> None:
    store = open_store(store_url)
    try:
        for i in range(3):
            store.create_session(f"s{i}")

        async def batch() -> list[Any]:
            return await asyncio.gather(
                *(store.aappend(f"s{i}", 0, [], author="\ud800" if i == 1 else "ok") for i in range(3)),
                return_exceptions=True,
            )

        outcomes = asyncio.run(batch())
        assert isinstance(outcomes[1], StoreError), outcomes[1]
        assert [store.head(f"s{i}") for i in range(3)] == [1, 0, 1]
    finally:
        store.close()
