"""One error contract: everything that leaves a store is a StoreError with one sentence.

Session ids follow one rule on every backend; a damaged SQLite file names
itself and how to check it; a lost PostgreSQL connection is retried for reads
and never blindly for commits.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from saucer.context import Context
from saucer.context.transfer import export_session, import_session
from saucer.engine.session import new_session_id
from saucer.store import (
    SESSION_ID_MAX_LENGTH,
    DamagedStoreError,
    EventStore,
    InvalidSessionIdError,
    OutcomeUnknownError,
    SessionNotFoundError,
    Snapshot,
    StoreError,
    open_store,
)


@pytest.fixture
def store(store_url: str) -> Iterator[EventStore]:
    with open_store(store_url) as s:
        yield s


# ------------------------------------------------------------ session ids

GOOD_IDS = [
    "s",
    new_session_id("tidy up the workspace, then report on what was done; really, all of it"),
    uuid.uuid4().hex,
    "run-2024-01-01.1_x:y@z+w",
    "x" * SESSION_ID_MAX_LENGTH,
]
BAD_IDS = ["", "a b", "a\x00b", "naïve", "a/b", "tab\there", "x" * (SESSION_ID_MAX_LENGTH + 1), "y" * 8000, ".", ".."]


def test_every_id_the_engine_makes_is_valid_and_commits(store: EventStore) -> None:
    for sid in GOOD_IDS:
        ctx = Context.open(store, sid)
        ctx.update_vars(set={"ok": True})
        assert ctx.commit() == 1  # PostgreSQL's NOTIFY payload included
        ctx.fork(f"{sid[:180]}-fork").close()
        ctx.close()
        assert Context.open(store, sid).get_var("ok") is True


@pytest.mark.parametrize("bad", BAD_IDS, ids=range(len(BAD_IDS)))
def test_a_bad_id_is_refused_where_a_session_is_made(store: EventStore, bad: str) -> None:
    Context.open(store, "parent").close()
    export = export_session(store, "parent", {})
    makers = [
        lambda: store.create_session(bad),
        lambda: Context.open(store, bad),
        lambda: Context.open(store, "parent").fork(bad),
        lambda: import_session(store, export, bad),
    ]
    for make in makers:
        with pytest.raises(InvalidSessionIdError, match="letters, digits and . _ - : @ [+]") as refused:
            make()
        assert isinstance(refused.value, StoreError) and isinstance(refused.value, ValueError)
        assert "\n" not in str(refused.value) and len(str(refused.value)) < 300
    # Looking a bad id up is no error of the store's: there is no such session.
    with pytest.raises(SessionNotFoundError):
        store.session_info(bad)
    with pytest.raises(SessionNotFoundError):
        Context.open(store, bad, create=False)
    assert not store.exists(bad)
    assert [i.session_id for i in store.sessions()] == ["parent"]


# ---------------------------------------------------------------- SQLite


def _check_hint(path: Path) -> str:
    return f'check it with: sqlite3 {path} "PRAGMA integrity_check"'


def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 200)
    with pytest.raises(DamagedStoreError) as caught:
        open_store(f"sqlite:///{path}")
    message = str(caught.value)
    assert str(path) in message and "file is not a database" in message and _check_hint(path) in message
    assert "\n" not in message
    assert path.read_text().startswith("these are my notes")  # left as it was


def test_a_session_meta_that_is_not_json_is_named_when_read_without_its_plan(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with open_store(f"sqlite:///{path}") as s:
        s.create_session("broken", meta={"task": "t", "plan": {"steps": []}})
    with sqlite3.connect(path) as conn:
        conn.execute('UPDATE session_meta SET meta = \'{"task": "t", "plan": [\' WHERE session_id = \'broken\'')
    conn.close()
    with open_store(f"sqlite:///{path}") as s, pytest.raises(DamagedStoreError) as caught:
        s.session_info_without_plan("broken")
    message = str(caught.value)
    assert "'broken'" in message and "not JSON" in message and str(path) in message


def _damage(path: Path, pages: range) -> None:
    """Overwrite whole pages of an SQLite file (the first page keeps the header)."""
    page = sqlite3.connect(path).execute("PRAGMA page_size").fetchone()[0]
    with open(path, "r+b") as f:
        for number in pages:
            f.seek(number * page)
            f.write(os.urandom(page))


def _filled(path: Path) -> None:
    with open_store(f"sqlite:///{path}") as s:
        for i in range(30):
            ctx = Context.open(s, f"s{i}")
            for j in range(20):
                ctx.update_vars(set={"i": j, "pad": "x" * 200})
                ctx.commit()
            ctx.close()
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0


@pytest.mark.parametrize("where", ["all but the header", "the last pages"])
def test_a_database_with_damaged_pages(tmp_path: Path, where: str) -> None:
    path = tmp_path / "x.db"
    _filled(path)
    page = sqlite3.connect(path).execute("PRAGMA page_size").fetchone()[0]
    size = path.stat().st_size // page
    _damage(path, range(1, size) if where == "all but the header" else range(size - 4, size))
    # on opening, or on reading the damaged pages
    with pytest.raises(DamagedStoreError) as caught, open_store(f"sqlite:///{path}") as s:
        for i in range(30):
            list(s.read(f"s{i}"))
            Context.open(s, f"s{i}").close()
    message = str(caught.value)
    assert str(path) in message and "malformed" in message and _check_hint(path) in message
    assert "\n" not in message


# ------------------------------------------------------------ PostgreSQL

pg = pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)


def _terminate(url: str, app: str) -> int:
    """End every server connection of ``app`` from another connection, as an admin or a restart would."""
    import psycopg

    from saucer.store.postgres import split_url

    with psycopg.connect(split_url(url)[0], autocommit=True) as conn:
        rows = conn.execute(  # waits (up to 5 s) until each one has gone
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
            "WHERE application_name = %s AND pid <> pg_backend_pid()",
            (app,),
        ).fetchall()
    return len(rows)


@pytest.fixture
def pg_app(store_url: str) -> Iterator[tuple[str, str]]:
    app = f"saucer-test-{uuid.uuid4().hex[:8]}"
    yield f"{store_url}&application_name={app}", app


@pg
def test_pooled_connections_closed_by_the_server_are_replaced(pg_app: tuple[str, str]) -> None:
    url, app = pg_app
    with open_store(url) as store:
        ctx = Context.open(store, "s")
        ctx.incr("n")
        ctx.commit()
        assert _terminate(url, app) >= 1
        # Reads and commits go on, on fresh connections.
        assert store.head("s") == 1 and [e.version for e in store.read("s")] == [1]
        ctx.incr("n")
        assert ctx.commit() == 2
        _terminate(url, app)
        ctx.incr("n")
        assert asyncio.run(ctx.acommit()) == 3  # the engine's way of committing
        _terminate(url, app)
        assert Context.open(store, "s").get_var("n") == 3
        ctx.close()


@pg
def test_a_read_whose_connection_breaks_is_retried_once(
    pg_app: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import saucer.store._postgres_conn as pgconn

    url, app = pg_app
    with open_store(url) as store:
        ctx = Context.open(store, "s")
        ctx.incr("n")
        ctx.commit()
        # Without the check on taking a connection, the break is met mid-call.
        monkeypatch.setattr(pgconn, "closed_by_server", lambda conn: False)
        _terminate(url, app)
        assert store.session_info("s").version == 1  # retried on a fresh connection
        _terminate(url, app)
        assert Context.open(store, "s", at=1).get_var("n") == 1
        # A commit is never retried blindly: its outcome is unknown, and it says so.
        _terminate(url, app)
        ctx.incr("n")
        with pytest.raises(OutcomeUnknownError, match="may or may not be written") as failed:
            ctx.commit()
        assert isinstance(failed.value, StoreError) and "\n" not in str(failed.value)
        assert "keeps its 1 changes pending" in str(failed.value)
        # The Context is not wedged: its next commit finds the change unwritten and writes it once.
        assert ctx.commit() == 2
        assert Context.open(store, "s").get_var("n") == 2
        ctx.close()


@pg
def test_psycopg_errors_never_leak(store: Any) -> None:
    import psycopg

    store.create_session("s")
    for call in (
        lambda: store.append("s", 0, [{"op": "set", "var": "x", "value": 1}], author="a\x00b"),
        lambda: store.acquire_lease("s\x00", "me", 10),
        lambda: store.save_snapshot(Snapshot("s", 2**70, 0.0, {})),
    ):
        with pytest.raises(StoreError) as caught:
            call()
        assert not isinstance(caught.value, psycopg.Error) and "\n" not in str(caught.value)
    assert store.head("s") == 0


@pg
def test_an_engine_session_goes_on_when_its_connections_are_dropped(
    pg_app: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from saucer.config import load_settings
    from saucer.engine import Agent, AgentSet, AgentStatus, Session

    class Dropper(Agent):
        """Each step drops every connection of the store (from another connection), then goes on."""

        async def act(self, context: Context) -> AgentStatus:
            n = context.incr("steps")
            await asyncio.to_thread(_terminate, *pg_app)  # the engine commits this step next, on its way on
            return AgentStatus.FINISH if n >= 4 else AgentStatus.CONTINUE

    url, _ = pg_app
    monkeypatch.chdir(tmp_path)
    settings = load_settings(
        overrides={"store.url": url, "logs.root": str(tmp_path / "logs"), "system.save_experience": "always_not"}
    )
    result = asyncio.run(
        Session(
            "drops",
            settings=settings,
            store=url,
            request="go on",
            agents=AgentSet([Dropper("d")]),
            session_id="drops-1",
        ).run()
    )
    assert result.status == "finished" and result.steps == 4, result
    with open_store(url) as store:
        assert Context.open(store, "drops-1").get_var("steps") == 4
