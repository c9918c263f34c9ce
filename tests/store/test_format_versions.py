"""Record format versions: every event and snapshot says its format, old ones are
upcast on read (from real version 1 bytes: the golden stores), newer ones are
refused naming both versions, and the store records the newest it holds.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import sys
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from saucer.context import Context
from saucer.store import FormatTooNewError, open_store
from saucer.store._codec import decode_payload, decode_state, encode_payload, encode_state, payload_format
from saucer.store.model import Event
from saucer.store.upcast import FORMAT_VERSION, record_format, upcast_event, upcast_snapshot

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
SQLITE_GOLDEN = GOLDEN / "2026-11-saucer-0.1.0-sqlite-schema2" / "store.db"
PG_GOLDEN = GOLDEN / "2026-11-saucer-0.1.0-postgres-schema1"
POSTGRES_ENV = "SAUCER_TEST_POSTGRES_URL"

sys.path.insert(0, str(GOLDEN))
import golden_format as gf  # noqa: E402


def _sqlite_rows(path: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    with sqlite3.connect(path) as conn:
        events = conn.execute(
            "SELECT session_id, version, payload, crc FROM events UNION ALL "
            "SELECT session_id, version, payload, crc FROM events_recent"
        ).fetchall()
        snaps = conn.execute("SELECT session_id, version, state, crc FROM snapshots").fetchall()
    return events, snaps


@pytest.fixture
def golden_sqlite(tmp_path: Path) -> Path:
    copy = tmp_path / "store.db"
    shutil.copyfile(SQLITE_GOLDEN, copy)
    return copy


@pytest.fixture
def pg_url() -> Iterator[str]:
    base = os.environ.get(POSTGRES_ENV)
    if not base:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{POSTGRES_ENV} is not set under CI=true")
        pytest.skip(f"set {POSTGRES_ENV}=postgresql://postgres@127.0.0.1:5432/test")
    import psycopg

    schema = "t_fmt_" + uuid.uuid4().hex[:12]
    try:
        yield gf.with_schema(base, schema)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# ------------------------------------------------------------- the upcasters


def test_the_golden_records_are_version_1_and_upcast_to_the_current_shape(golden_sqlite: Path) -> None:
    events, snaps = _sqlite_rows(golden_sqlite)
    assert events and snaps
    for _, _, payload, crc in events:
        raw = orjson.loads(payload) if zlib.crc32(payload) == crc else None
        if raw is None:
            continue  # the damaged records of 'torn-tail' and 'quarantined'
        assert "v" not in raw and record_format(raw) == 1 == payload_format(payload)
        data = decode_payload(payload, crc)
        assert data["v"] == FORMAT_VERSION
        assert {k: v for k, v in data.items() if k != "v"} == raw  # v1 -> v2 keeps every field
    compressed = 0
    for _, _, blob, crc in snaps:
        compressed += blob[:1] != b"{"
        assert payload_format(blob) == 1
        state = decode_state(blob, crc)
        assert "v" not in state and set(state) == {"names", "vars"}
    assert compressed  # 'big-state' holds zlib-compressed v1 snapshots too


def test_upcasters_are_pure_and_refuse_what_they_do_not_know() -> None:
    v1 = {"ops": [{"op": "set", "var": "x", "value": 1}]}
    before = orjson.dumps(v1)
    assert upcast_event(v1) == {**v1, "v": FORMAT_VERSION}
    assert upcast_snapshot({"names": {}, "vars": {}}) == {"names": {}, "vars": {}, "v": FORMAT_VERSION}
    assert orjson.dumps(v1) == before  # the input is not changed
    current = {"v": FORMAT_VERSION, "ops": []}
    assert upcast_event(current) is current
    for bad in (0, -1, True, "2", 1.5):
        with pytest.raises(ValueError, match="format version"):
            upcast_event({"v": bad, "ops": []})
    with pytest.raises(FormatTooNewError) as info:
        upcast_event({"v": FORMAT_VERSION + 1, "ops": []}, "the event at version 3")
    message = str(info.value)
    assert f"version {FORMAT_VERSION + 1}" in message and f"up to version {FORMAT_VERSION}" in message
    assert "the event at version 3" in message and "upgrade saucer" in message


# Written by saucer at commit 2424ba9 (record format 2): a snapshot and an event of a session
# that appended a STRUCTURAL_LOGS entry and set REQUEST.
_V2_SNAPSHOT = (
    b'{"v":2,"names":{"STRUCTURAL_LOGS":{"0":{"0":[{"Round":0,"SubtaskIndex":0,"Step":1,"Agent":"a",'
    b'"State":"CONTINUE","Status":"FINISH"}]}},"REQUEST":"go"},"vars":{}}'
)
_V2_SNAPSHOT_CRC = 115493114
_V2_EVENT = (
    b'{"v":2,"ops":[{"op":"append","name":"STRUCTURAL_LOGS","path":[0,0],"value":{"Round":0,"SubtaskIndex":0,'
    b'"Step":1,"Agent":"a","State":"CONTINUE","Status":"FINISH"}},{"op":"set","name":"REQUEST","value":"go"}]}'
)
_V2_EVENT_CRC = 2539830738


def test_version_2_records_upcast_to_the_current_format_unchanged() -> None:
    """The versions after 2 changed how records are stored and allowed packed values: a v2 record keeps every field."""
    assert payload_format(_V2_SNAPSHOT) == 2 == payload_format(_V2_EVENT)
    state = decode_state(_V2_SNAPSHOT, _V2_SNAPSHOT_CRC)
    assert state == {k: v for k, v in orjson.loads(_V2_SNAPSHOT).items() if k != "v"}
    event = decode_payload(_V2_EVENT, _V2_EVENT_CRC)
    assert event == {**orjson.loads(_V2_EVENT), "v": FORMAT_VERSION}
    from saucer.context.events import apply_ops, state_from_wire

    restored = state_from_wire(state)
    assert restored.names == apply_ops(type(restored)(), event["ops"]).names
    assert restored.names["STRUCTURAL_LOGS"][0][0][0]["Step"] == 1 and not restored.packed


# Written by saucer at commit a3c4f06 (record format 3, PACK_OVER lowered to 64): a snapshot whose
# STRUCTURAL_LOGS (three appended entries) is packed, with no tails (format 5 added them).
_V3_SNAPSHOT = (
    b'{"v":3,"names":{},"vars":{},"packed":{"STRUCTURAL_LOGS":{"size":163,"zlib":"eAGrVjJQsqoGEdHVSkH5pXkpSlYGOkrBpUkl'
    b'icXZnnkpqRUQgZLUAjDDMT01r0TJSilRqVaHCB2GOkok6jBC0RFbWwsAs04xkw=="}}}'
)
_V3_SNAPSHOT_CRC = 998852798


def test_version_3_snapshots_upcast_to_the_current_format_and_read_their_packed_value() -> None:
    from saucer.context.events import state_from_wire, unpack

    assert payload_format(_V3_SNAPSHOT) == 3
    state = decode_state(_V3_SNAPSHOT, _V3_SNAPSHOT_CRC)
    assert state == {k: v for k, v in orjson.loads(_V3_SNAPSHOT).items() if k != "v"}
    restored = state_from_wire(state)
    assert set(restored.packed) == {"STRUCTURAL_LOGS"} and restored.packed["STRUCTURAL_LOGS"].tails == []
    unpack(restored, "STRUCTURAL_LOGS")
    assert [e["Step"] for e in restored.names["STRUCTURAL_LOGS"][0][0]] == [0, 1, 2]


def test_writes_always_use_the_current_format() -> None:
    event = Event("s", 1, 0.0, "user", None, None, [{"op": "set", "var": "x", "value": 1}], {"why": "t"})
    payload, _ = encode_payload(event)
    assert orjson.loads(payload)["v"] == FORMAT_VERSION
    for state in ({"names": {}, "vars": {"x": 1}}, {"names": {}, "vars": {"x": "y" * 10_000}}):
        blob, crc = encode_state(state)
        assert payload_format(blob) == FORMAT_VERSION
        assert decode_state(blob, crc) == state


# -------------------------------------------------------------- on the stores


def test_sqlite_golden_store_reads_and_then_writes_the_current_format(golden_sqlite: Path) -> None:
    url = f"sqlite:///{golden_sqlite}"
    with open_store(url) as store:
        assert store.format_version() == FORMAT_VERSION  # recorded when opened
        old_head = store.head("vars-mix")
        before = Context.open(store, "vars-mix").to_dict()
        ctx = Context.open(store, "vars-mix")
        ctx.update_vars({"after-upgrade": 1})
        ctx.commit()
        ctx.snapshot()
        head = store.head("vars-mix")
    events, snaps = _sqlite_rows(golden_sqlite)
    newest = [p for sid, v, p, _ in events if sid == "vars-mix" and v == head]
    assert payload_format(newest[0]) == FORMAT_VERSION
    assert [payload_format(b) for sid, v, b, _ in snaps if sid == "vars-mix" and v == head] == [FORMAT_VERSION]
    older = [payload_format(p) for sid, v, p, _ in events if sid == "vars-mix" and v < head]
    assert set(older) == {1}  # nothing is rewritten behind the reader's back
    with open_store(url) as store:
        assert Context.open(store, "vars-mix", at=old_head).to_dict() == before
        assert Context.open(store, "vars-mix").get_var("after-upgrade") == 1


def _sqlite_poke(path: Path, sql: str, *args: Any) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute(sql, args)


def test_sqlite_refuses_newer_records_and_stores_naming_both_versions(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with open_store(f"sqlite:///{path}") as store:
        ctx = Context.open(store, "s")
        for i in range(3):
            ctx.update_vars({"i": i})
            ctx.commit()
        ctx.snapshot()
        other = Context.open(store, "other")
        other.update_vars({"o": 1})
        other.commit()
    future = orjson.dumps({"v": FORMAT_VERSION + 7, "ops": [], "new-field": 1})
    _sqlite_poke(
        path,
        "UPDATE events_recent SET payload = ?, crc = ? WHERE session_id = 's' AND version = 2",
        future,
        zlib.crc32(future),
    )
    with open_store(f"sqlite:///{path}") as store:
        with pytest.raises(
            FormatTooNewError,
            match=rf"session 's': the event at version 2 is in record format version {FORMAT_VERSION + 7}.*up to version {FORMAT_VERSION}",
        ):
            list(store.read("s"))
        assert Context.open(store, "other").version == 1  # one session's newer record stops nobody else
    snap = orjson.dumps({"v": FORMAT_VERSION + 1, "names": {}, "vars": {}})
    _sqlite_poke(path, "UPDATE snapshots SET state = ?, crc = ? WHERE session_id = 's'", snap, zlib.crc32(snap))
    with (
        open_store(f"sqlite:///{path}") as store,
        pytest.raises(FormatTooNewError, match="the snapshot at version 3"),
    ):
        Context.open(store, "s")
    _sqlite_poke(path, "UPDATE saucer_format SET newest = ?", FORMAT_VERSION + 1)
    with pytest.raises(FormatTooNewError) as info:
        open_store(f"sqlite:///{path}")
    assert str(path) in str(info.value) and f"version {FORMAT_VERSION + 1}" in str(info.value)
    assert f"up to version {FORMAT_VERSION}" in str(info.value)


def test_memory_store_holds_the_current_format() -> None:
    with open_store("memory://") as store:
        assert store.format_version() == FORMAT_VERSION


def _pg_rows(url: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    import psycopg

    conninfo, schema = url.split("?schema=")[0], url.split("?schema=")[1]
    with psycopg.connect(conninfo) as conn:
        events = conn.execute(f'SELECT session_id, version, payload, crc FROM "{schema}".events').fetchall()
        snaps = conn.execute(f'SELECT session_id, version, state, crc FROM "{schema}".snapshots').fetchall()
    return events, snaps


def test_postgres_golden_dump_is_version_1_upcast_then_written_in_the_current_format(pg_url: str) -> None:
    import psycopg

    expected = gf.load(PG_GOLDEN / gf.EXPECTED_FILE)
    base = os.environ[POSTGRES_ENV]
    schema = pg_url.split("?schema=")[1]
    gf.restore_dump(base, (PG_GOLDEN / "dump.sql").read_text(encoding="utf-8"), expected["dump_schema"], schema)
    events, snaps = _pg_rows(pg_url)
    readable = [(bytes(p), c) for _, _, p, c in events if zlib.crc32(bytes(p)) == c]
    assert readable and all(payload_format(p) == 1 for p, _ in readable)
    assert snaps and all(payload_format(bytes(b)) == 1 for _, _, b, _ in snaps)
    for payload, crc in readable:
        assert decode_payload(payload, crc)["ops"] == orjson.loads(payload)["ops"]
    with open_store(pg_url) as store:
        assert store.format_version() == FORMAT_VERSION
        ctx = Context.open(store, "vars-mix")
        ctx.update_vars({"after-upgrade": 1})
        ctx.commit()
        head = ctx.version
    events, _ = _pg_rows(pg_url)
    assert [payload_format(bytes(p)) for sid, v, p, _ in events if sid == "vars-mix" and v == head] == [FORMAT_VERSION]
    future = orjson.dumps({"v": FORMAT_VERSION + 1, "ops": []})
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(
            f'UPDATE "{schema}".events SET payload = %s, crc = %s WHERE session_id = %s AND version = %s',
            (future, zlib.crc32(future), "vars-mix", head),
        )
    with open_store(pg_url) as store, pytest.raises(FormatTooNewError, match=f"the event at version {head}"):
        Context.open(store, "vars-mix")
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'UPDATE "{schema}".saucer_format SET newest = %s', (FORMAT_VERSION + 3,))
    with pytest.raises(
        FormatTooNewError, match=rf"PostgreSQL schema '{schema}' is in record format version {FORMAT_VERSION + 3}"
    ):
        open_store(pg_url)
