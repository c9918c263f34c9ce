"""Renamed and retired ContextNames: sessions that stored them keep opening.

A later saucer that renames or retires a name records it in
``saucer.context.names.RENAMED`` / ``RETIRED``. These tests stand in for that
saucer: they take the name out of the fold's table (as deleting the member
would) and register it, then open sessions an older saucer wrote -- the
golden store's, and logs written through the store API with a name this code
no longer has.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from saucer.context import Context, ContextNames, prune
from saucer.context import events as events_module
from saucer.context import names as names_module
from saucer.store import CorruptRecordError, EventStore, Snapshot, open_store

GOLDEN_DB = Path(__file__).resolve().parents[1] / "golden" / "2026-11-saucer-0.1.0-sqlite-schema2" / "store.db"
RETIRED_NAME = "APPLICATION_ROOT_NAME"  # written by the golden sessions 'names-all' and 'golden-finished-*'


def retire(monkeypatch: pytest.MonkeyPatch, name: str, why: str = "retired in a later saucer") -> None:
    """This process as a saucer from which ``name`` was removed and registered as retired."""
    monkeypatch.delitem(events_module._NAMES, name)
    monkeypatch.delitem(names_module._BY_KEY, name)
    monkeypatch.setitem(names_module.RETIRED, name, why)


@pytest.fixture
def golden(tmp_path: Path) -> Iterator[EventStore]:
    copy = tmp_path / "store.db"
    shutil.copyfile(GOLDEN_DB, copy)
    with open_store(f"sqlite:///{copy}") as store:
        yield store


def _states(store: EventStore, sid: str) -> dict[int, dict[str, Any]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first, head = store.first_version(sid), store.head(sid)
        return {v: Context.open(store, sid, at=v)._plain() for v in range(first, head + 1)}


def test_a_retired_name_of_an_existing_session_never_breaks_opening(
    golden: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _states(golden, "names-all")
    stored = Context.open(golden, "names-all").get(RETIRED_NAME)
    assert stored  # the golden session wrote it
    retire(monkeypatch, RETIRED_NAME)
    ctx = Context.open(golden, "names-all")  # from its v1 snapshot, which holds the name, and the tail
    assert ctx.retired == {RETIRED_NAME: stored}
    assert RETIRED_NAME not in ctx._plain()
    after = _states(golden, "names-all")
    for version, state in before.items():
        # every version reads as before, the retired name set aside under retired.NAME
        moved = {(f"retired.{k}" if k == RETIRED_NAME else k): v for k, v in state.items()}
        assert after[version] == moved, version
    assert any(op.get("name") == RETIRED_NAME for e in ctx.history() for op in e.ops)  # history keeps the events
    with pytest.raises(KeyError, match="unknown context name"):
        ctx.set(RETIRED_NAME, "x")  # no longer writable
    # The engine sessions open, and whatever they snapshot or prune keeps the value aside.
    finished = next(i.session_id for i in golden.sessions() if i.session_id.startswith("golden-finished-"))
    assert Context.open(golden, finished).retired
    ctx.update_vars({"later": 1})
    ctx.commit()
    ctx.snapshot()
    reopened = Context.open(golden, "names-all")
    assert reopened.retired == {RETIRED_NAME: stored} and reopened.get_var("later") == 1
    first = prune(golden, "names-all", keep_last=2)
    pruned = Context.open(golden, "names-all", at=first)
    assert pruned.retired == {RETIRED_NAME: stored}


def test_a_removed_name_nobody_registered_is_a_clear_error(golden: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(events_module._NAMES, RETIRED_NAME)
    monkeypatch.delitem(names_module._BY_KEY, RETIRED_NAME)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the snapshot that holds it is set aside first (with a warning)
        with pytest.raises(CorruptRecordError) as info:
            Context.open(golden, "names-all")
    assert RETIRED_NAME in str(info.value) and "RENAMED or RETIRED" in str(info.value)
    assert Context.open(golden, "vars-mix").version > 0  # other sessions are unaffected


@pytest.mark.parametrize("url_kind", ["memory", "sqlite", "postgresql"])
def test_a_renamed_name_is_read_under_its_new_name(
    url_kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _url(url_kind, tmp_path)
    with open_store(url) as store:
        sid = "renamed-" + os.urandom(4).hex()
        store.create_session(sid)
        # What an older saucer wrote when REQUEST was still USER_REQUEST (and SUBTASK was TASK,
        # renamed again since: chains are followed).
        store.append(sid, 0, [{"op": "set", "name": "USER_REQUEST", "value": "open notepad"}], author="user")
        store.append(sid, 1, [{"op": "set", "name": "TASK", "value": "type"}], author="agent")
        with pytest.raises(CorruptRecordError, match="'USER_REQUEST' is not a ContextNames member"):
            Context.open(store, sid)
        monkeypatch.setitem(names_module.RENAMED, "USER_REQUEST", "REQUEST")
        monkeypatch.setitem(names_module.RENAMED, "TASK", "OLD_SUBTASK")
        monkeypatch.setitem(names_module.RENAMED, "OLD_SUBTASK", "SUBTASK")
        ctx = Context.open(store, sid)
        assert ctx.get(ContextNames.REQUEST) == "open notepad" and ctx.get(ContextNames.SUBTASK) == "type"
        assert Context.open(store, sid, at=1).get(ContextNames.REQUEST) == "open notepad"
        assert ctx.diff(1, 2) == {
            "SUBTASK": {"before": "", "after": "type"}
        }  # a name not written yet: its default, as state shows it
        ctx.set(ContextNames.REQUEST, "open calc")
        ctx.commit()
        assert [op["name"] for e in store.read(sid, 2) for op in e.ops] == ["REQUEST"]  # written under the new name
        # An old snapshot holding the old name is read the same way.
        store.save_snapshot(Snapshot(sid, 2, 0.0, {"names": {"USER_REQUEST": "from snap"}, "vars": {}}))
        assert Context.open(store, sid, at=2).get(ContextNames.REQUEST) == "from snap"
        store.delete_session(sid)


def _url(kind: str, tmp_path: Path) -> str:
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 's.db'}"
    base = os.environ.get("SAUCER_TEST_POSTGRES_URL")
    if not base:
        if os.environ.get("CI") == "true":
            pytest.fail("SAUCER_TEST_POSTGRES_URL is not set under CI=true")
        pytest.skip("set SAUCER_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:5432/test")
    return f"{base}?schema=t_names_{os.urandom(4).hex()}"


@pytest.fixture(autouse=True)
def _drop_pg_schemas() -> Iterator[None]:
    yield
    base = os.environ.get("SAUCER_TEST_POSTGRES_URL")
    if base:
        import psycopg

        with psycopg.connect(base, autocommit=True) as conn:
            for (schema,) in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 't_names_%'").fetchall():
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def test_state_at_shows_a_retired_name_as_retired(golden: EventStore, tmp_path: Path) -> None:
    """``saucer state --at`` of a saucer that retired the name (a subprocess, as a user runs it)."""
    script = textwrap.dedent(
        f"""
        import runpy, sys
        from saucer.context import events, names
        del events._NAMES[{RETIRED_NAME!r}], names._BY_KEY[{RETIRED_NAME!r}]
        names.RETIRED[{RETIRED_NAME!r}] = "retired in a later saucer"
        sys.argv = ["saucer", *sys.argv[1:]]
        runpy.run_module("saucer", run_name="__main__")
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")} | {"COLUMNS": "200", "NO_COLOR": "1"}
    head = golden.head("names-all")
    base = [sys.executable, "-c", script, "state", "names-all", "--at", str(head), "--store", golden.url]
    as_json = subprocess.run([*base, "--json"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert as_json.returncode == 0, as_json.stderr
    data = orjson.loads(as_json.stdout)
    assert data["retired"] == {RETIRED_NAME: Context.open(golden, "names-all").get(RETIRED_NAME)}
    table = subprocess.run(base, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert table.returncode == 0, table.stderr
    assert f"{RETIRED_NAME} (retired)" in table.stdout
    history = [sys.executable, "-c", script, "history", "names-all", "--store", golden.url]
    listed = subprocess.run(history, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert f"{RETIRED_NAME} (retired) = " in listed.stdout
