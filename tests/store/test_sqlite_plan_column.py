"""SQLite schema 5: a session's plan is in the column ``plan`` of ``session_meta``, with 0
holding its place in ``meta`` (issue 21). A schema-4 file is upgraded when it is opened and
reads the same metas, key order included; a meta read without its plan never reads the plan."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from saucer.context import prune
from saucer.store import DamagedStoreError, open_store
from saucer.store.sqlite import SCHEMA_VERSION

# The tables of SQLite schema 4, as saucer wrote them before the plan had a column of its own.
_SQLITE_4 = """
CREATE TABLE saucer_schema (version INTEGER NOT NULL);
CREATE TABLE saucer_format (one INTEGER PRIMARY KEY CHECK (one = 1), newest INTEGER NOT NULL);
CREATE TABLE sessions (session_id TEXT PRIMARY KEY, head INTEGER NOT NULL, created_at REAL NOT NULL,
    updated_at REAL NOT NULL, parent_id TEXT, parent_version INTEGER, status TEXT, rounds INTEGER NOT NULL DEFAULT 0,
    steps INTEGER NOT NULL DEFAULT 0, cost REAL NOT NULL DEFAULT 0, cost_unknown INTEGER NOT NULL DEFAULT 0, reason TEXT);
CREATE TABLE session_meta (session_id TEXT PRIMARY KEY, task TEXT, mode TEXT, request TEXT, forked_from TEXT,
    forked_at INTEGER, pruned_to INTEGER NOT NULL DEFAULT 0, meta TEXT NOT NULL DEFAULT '{}');
CREATE TABLE events (session_id TEXT NOT NULL, version INTEGER NOT NULL, ts REAL NOT NULL, author TEXT NOT NULL,
    round INTEGER, step INTEGER, payload BLOB NOT NULL, crc INTEGER, PRIMARY KEY (session_id, version)) WITHOUT ROWID;
CREATE TABLE events_recent (session_id TEXT NOT NULL, version INTEGER NOT NULL, ts REAL NOT NULL,
    author TEXT NOT NULL, round INTEGER, step INTEGER, payload BLOB NOT NULL, crc INTEGER);
CREATE TABLE snapshots (session_id TEXT NOT NULL, version INTEGER NOT NULL, ts REAL NOT NULL, state BLOB NOT NULL,
    crc INTEGER, PRIMARY KEY (session_id, version)) WITHOUT ROWID;
CREATE TABLE leases (session_id TEXT PRIMARY KEY, owner TEXT NOT NULL, token INTEGER NOT NULL, expires_at REAL NOT NULL);
INSERT INTO saucer_schema VALUES (4);
INSERT INTO saucer_format VALUES (1, 5);
"""

PLAN = {
    "task": "t",
    "steps": [{"subtask": f"s{i} é😀", "commands": [{"tool": "shell", "args": {"cmd": "echo"}}]} for i in range(40)],
}
#: Metas with and without a plan; the plan first, in the middle and last.
METAS: dict[str, dict[str, Any]] = {
    "planned": {"task": "Tidy", "plan": PLAN, "mode": "follower", "request": "tidy up", "z": 1, "a": {"plan": 2}},
    "first": {"plan": [1, 2], "b": 1, "a": 2},
    "zero": {"task": "t", "plan": 0},
    "only-zero": {"plan": 0},
    "null": {"z": None, "plan": None},
    "plain": {"task": "t", "mode": "normal", "request": '"plan": not a key'},
    "empty": {},
}
#: Metas that are not JSON: not JSON at all, and JSON to SQLite but not to orjson (a number beyond a double).
DAMAGED = {"broken": '{"task": "t", "plan": [', "huge": '{"task": "t", "plan": 1e400}'}


def _columns(path: Path) -> dict[str, tuple[str, str | None]]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT session_id, meta, plan FROM session_meta").fetchall()
    conn.close()
    return {sid: (meta, plan) for sid, meta, plan in rows}


def _split(meta: dict[str, Any]) -> tuple[str, str | None]:
    """What the two columns should hold, spelled out independently of the store's helper."""
    if "plan" not in meta:
        return orjson.dumps(meta).decode(), None
    return orjson.dumps({k: 0 if k == "plan" else v for k, v in meta.items()}).decode(), orjson.dumps(
        meta["plan"]
    ).decode()


def _without_plan(meta: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in meta.items() if k != "plan"]


def _schema_4_file(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.executescript(_SQLITE_4)
        texts = {sid: orjson.dumps(meta).decode() for sid, meta in METAS.items()} | DAMAGED
        for sid, text in texts.items():
            conn.execute(
                "INSERT INTO sessions (session_id, head, created_at, updated_at) VALUES (?, 0, 1000, 1000)", (sid,)
            )
            conn.execute("INSERT INTO session_meta (session_id, task, meta) VALUES (?, 't', ?)", (sid, text))
    conn.close()


def _check_metas(store: Any) -> None:
    for sid, meta in METAS.items():
        info = store.session_info(sid)
        assert orjson.dumps(info.meta) == orjson.dumps(meta), sid  # key order included
        brief, has_plan = store.session_info_without_plan(sid)
        assert (list(brief.meta.items()), has_plan) == (_without_plan(meta), "plan" in meta), sid
        assert store.session_plan(sid) == meta.get("plan"), sid
    for sid in DAMAGED:
        for read in (store.session_info, store.session_info_without_plan):
            with pytest.raises(DamagedStoreError) as caught:
                read(sid)
            assert f"the meta of session {sid!r} is not JSON" in str(caught.value)


def test_a_schema_4_file_is_upgraded_and_reads_the_same_metas(tmp_path: Path) -> None:
    path = tmp_path / "s4.db"
    _schema_4_file(path)
    with open_store(f"sqlite:///{path}") as store:
        _check_metas(store)
        assert store.list_sessions(ids=["planned"])[0].task == "t"  # the listed columns are untouched
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM saucer_schema").fetchone() == (SCHEMA_VERSION,) == (5,)
    conn.close()
    columns = _columns(path)
    assert columns == {
        **{sid: _split(meta) for sid, meta in METAS.items()},
        **{sid: (text, None) for sid, text in DAMAGED.items()},
    }
    assert columns["only-zero"] == ('{"plan":0}', "0")  # a plan that is 0 has it in its column too
    with open_store(f"sqlite:///{path}") as store:  # opened again: nothing more to do
        _check_metas(store)
    assert _columns(path) == columns


def test_a_2_mb_plan_is_read_only_with_the_whole_meta(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    steps = [
        {"subtask": f"step {i}", "commands": [{"tool": "shell", "args": {"cmd": "echo " + "x" * 40}}]}
        for i in range(22_000)
    ]
    plan = {"task": "big", "steps": steps}
    assert len(orjson.dumps(plan)) > 2 * 2**20
    meta = {"task": "big", "mode": "follower", "plan": plan, "plan_file": "p.json"}
    with open_store(f"sqlite:///{path}") as store:
        store.create_session("big", meta=meta)
        store.create_session("small", meta={"task": "small"})
        store.create_session("zero", meta={"plan": 0})
        info, has_plan = store.session_info_without_plan("big")
        assert (list(info.meta.items()), has_plan) == (
            [("task", "big"), ("mode", "follower"), ("plan_file", "p.json")],
            True,
        )
        assert orjson.dumps(store.session_info("big").meta) == orjson.dumps(meta)
        assert store.session_plan("big") == plan
        assert store.session_info_without_plan("small")[0].meta == {"task": "small"}
        assert store.session_info_without_plan("small")[1] is False
        assert store.session_info("zero").meta == {"plan": 0} and store.session_info_without_plan("zero")[0].meta == {}
        assert store.session_info_without_plan("zero")[1] is True
    columns = _columns(path)
    assert columns["big"] == _split(meta) and len(columns["big"][0]) < 100
    assert columns["small"] == ('{"task":"small"}', None)  # no plan: NULL
    assert columns["zero"] == ('{"plan":0}', "0")


def test_a_meta_read_without_its_plan_never_parses_the_plan(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with open_store(f"sqlite:///{path}") as store:
        store.create_session("s", meta={"task": "t", "plan": PLAN, "mode": "normal"})
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE session_meta SET plan = '[not json' WHERE session_id = 's'")
    conn.close()
    with open_store(f"sqlite:///{path}") as store:
        info, has_plan = store.session_info_without_plan("s")
        assert (info.meta, has_plan) == ({"task": "t", "mode": "normal"}, True)
        with pytest.raises(DamagedStoreError, match="the meta of session 's' is not JSON"):
            store.session_info("s")


def test_a_prune_and_a_fork_standing_alone_keep_the_plan_in_its_column(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with open_store(f"sqlite:///{path}") as store:
        store.create_session("p", meta={"task": "p", "plan": PLAN, "mode": "normal"})
        v = 0
        for i in range(10):
            v = store.append("p", v, [{"op": "set", "var": "i", "value": i}], author="me").version
        store.create_session("f", parent_id="p", parent_version=5, meta={"plan": [1], "task": "f"})
        assert prune(store, "p", keep_last=3) == 7
        p, f = store.session_info("p"), store.session_info("f")
        assert list(p.meta.items()) == [("task", "p"), ("plan", PLAN), ("mode", "normal"), ("pruned_to", 7)]
        assert f.parent_id is None and list(f.meta.items()) == [
            ("plan", [1]),
            ("task", "f"),
            ("forked_from", "p"),
            ("at", 5),
            ("mode", "normal"),
        ]  # its parent's mode, inherited
        assert store.session_info_without_plan("f")[0].meta == {
            "task": "f",
            "forked_from": "p",
            "at": 5,
            "mode": "normal",
        }
    columns = _columns(path)
    assert columns == {"p": _split(p.meta), "f": _split(f.meta)}
