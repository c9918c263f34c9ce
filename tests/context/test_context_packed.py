"""Large values packed in snapshots: opening a session decodes them only when read.

A long engine session's state is mostly ``STRUCTURAL_LOGS`` (an entry per
step). A snapshot packs every value over ``PACK_OVER`` bytes of JSON on its
own, so ``Context.open`` reads the small rest; what is read, written or
snapshotted later must be exactly what an eager load gives.
"""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from saucer.context import Context, ContextNames
from saucer.context import events as ev
from saucer.store import CorruptRecordError, open_store
from saucer.store.memory import MemoryStore
from saucer.store.model import Snapshot


@pytest.fixture(autouse=True)
def small_pack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ev, "PACK_OVER", 2048)


def _entry(i: int, round_id: int = 0) -> dict[str, Any]:
    return {
        "Round": round_id,
        "SubtaskIndex": i % 2,
        "Step": i,
        "Agent": "a",
        "State": "CONTINUE",
        "Status": "CONTINUE",
    }


def _grow(ctx: Context, start: int, n: int) -> None:
    for i in range(start, start + n):
        ctx.incr(ContextNames.SESSION_STEP)
        ctx.incr(ContextNames.CURRENT_ROUND_STEP)
        ctx.add_to_structural_logs(_entry(i, i // 40))
        ctx.commit()


def _plain(ctx: Context) -> dict[str, Any]:
    return orjson.loads(orjson.dumps(ctx.to_dict(ensure_serializable=True), option=orjson.OPT_NON_STR_KEYS))


def _replayed(store: Any, sid: str) -> dict[str, Any]:
    """The state folded from the log alone (every snapshot ignored)."""
    state = ev.State()
    for event in store.read(sid):
        ev.apply_ops(state, event.ops)
    return ev.state_to_wire(state)


def test_a_large_value_is_packed_and_decoded_only_when_read() -> None:
    store = MemoryStore()
    ctx = Context.open(store, "s")
    _grow(ctx, 0, 60)
    ctx.set(ContextNames.REQUEST, "small")
    ctx.commit()
    live = _plain(ctx)
    ctx.snapshot()
    wire = store.latest_snapshot("s", store.head("s")).state
    assert set(wire["packed"]) == {"STRUCTURAL_LOGS"} and "STRUCTURAL_LOGS" not in wire["names"]
    assert wire["names"]["REQUEST"] == "small"

    reopened = Context.open(store, "s")
    assert "STRUCTURAL_LOGS" in reopened._state.packed  # not decoded by opening
    assert reopened.get(ContextNames.SESSION_STEP) == 60
    assert "STRUCTURAL_LOGS" in reopened._state.packed  # nor by reading another name
    assert reopened.filter_structural_logs(1, 0, "Step") == [i for i in range(40, 60) if i % 2 == 0]
    assert not reopened._state.packed
    assert _plain(reopened) == live


@pytest.mark.parametrize("seed", range(6))
def test_operations_on_a_packed_value_give_what_an_eager_load_gives(seed: int) -> None:
    """Appends, path sets and deletes, whole sets and deletes, on a value still packed:
    the value read, the next snapshot and a replay of the log all agree."""
    rng = random.Random(seed)
    store = MemoryStore()
    ctx = Context.open(store, "s")
    _grow(ctx, 0, 50)
    ctx.update_dict(ContextNames.ROUND_COST, {r: 0.5 for r in range(400)})  # a large ledger, packed too
    ctx.commit()
    ctx.snapshot()
    ctx.close()
    for _ in range(4):
        ctx = Context.open(store, "s")
        for _ in range(rng.randint(1, 12)):
            kind = rng.choice(["append", "incr-ledger", "set-ledger-entry", "replace", "delete", "other"])
            if kind == "append":
                ctx.add_to_structural_logs(_entry(rng.randint(0, 999), rng.randint(0, 3)))
            elif kind == "incr-ledger":
                ctx.incr(ContextNames.CURRENT_ROUND_COST, 0.25)
            elif kind == "set-ledger-entry":
                ctx.update_dict(ContextNames.ROUND_COST, {rng.randint(0, 500): 1.0})
            elif kind == "replace" and rng.random() < 0.3:
                ctx.set(ContextNames.STRUCTURAL_LOGS, {7: {0: [_entry(7, 7)]}})
            elif kind == "delete" and rng.random() < 0.2:
                ctx.set(ContextNames.ROUND_COST, {})
            else:
                ctx.set(ContextNames.REQUEST, f"r{rng.random()}")
            if rng.random() < 0.5:
                ctx.commit()
        ctx.commit()
        if rng.random() < 0.5:
            ctx.snapshot()  # with operations kept for a packed value: unpacked, then packed again
        ctx.close()
        fresh = Context.open(store, "s")
        assert ev.state_to_wire(fresh._state) == _replayed(store, "s")
        fresh.close()


def test_an_untouched_packed_value_is_carried_to_the_next_snapshot_as_it_is() -> None:
    store = MemoryStore()
    ctx = Context.open(store, "s")
    _grow(ctx, 0, 60)
    ctx.snapshot()
    first = store.latest_snapshot("s", store.head("s")).state["packed"]["STRUCTURAL_LOGS"]
    ctx.close()
    ctx = Context.open(store, "s")
    ctx.set(ContextNames.REQUEST, "only this")
    ctx.commit()
    ctx.snapshot()
    assert "STRUCTURAL_LOGS" in ctx._state.packed  # never decoded
    second = store.latest_snapshot("s", store.head("s")).state["packed"]["STRUCTURAL_LOGS"]
    assert second == first


def test_a_value_that_only_grew_is_written_as_its_base_and_new_tails() -> None:
    store = MemoryStore()
    ctx = Context.open(store, "s")
    _grow(ctx, 0, 600)
    ctx.snapshot()
    first = store.latest_snapshot("s", store.head("s")).state["packed"]["STRUCTURAL_LOGS"]
    assert "tails" not in first
    _grow(ctx, 600, 3)
    ctx.snapshot()
    _grow(ctx, 603, 2)
    ctx.snapshot()
    third = store.latest_snapshot("s", store.head("s")).state["packed"]["STRUCTURAL_LOGS"]
    assert third["zlib"] == first["zlib"] and len(third["tails"]) == 2  # the base is not written again
    live = _plain(ctx)
    assert _plain(Context.open(store, "s")) == live
    reopened = Context.open(store, "s")  # while ctx is open: the newest snapshot has its tails
    assert len(reopened._state.packed["STRUCTURAL_LOGS"].tails) == 2
    # Grown on from a still-packed value: the kept operations become one more tail.
    _grow(reopened, 605, 1)
    reopened.snapshot()
    assert "STRUCTURAL_LOGS" in reopened._state.packed  # never decoded
    fourth = store.latest_snapshot("s", store.head("s")).state["packed"]["STRUCTURAL_LOGS"]
    assert fourth["zlib"] == first["zlib"] and len(fourth["tails"]) == 3
    assert ev.state_to_wire(Context.open(store, "s")._state) == _replayed(store, "s")
    # Closing stores the value whole (a closed session is read more often than extended),
    # at the same version, and still keeps the snapshot before it.
    head = store.head("s")
    reopened.close()
    closed = store.latest_snapshot("s", head)
    assert closed.version == head and "tails" not in closed.state["packed"]["STRUCTURAL_LOGS"]
    assert store.latest_snapshot("s", head - 1) is not None
    final = Context.open(store, "s")
    assert not final._state.packed["STRUCTURAL_LOGS"].tails
    assert ev.state_to_wire(final._state) == _replayed(store, "s")


def test_tails_that_outweigh_their_base_are_packed_afresh() -> None:
    store = MemoryStore()
    ctx = Context.open(store, "s")
    _grow(ctx, 0, 30)
    ctx.snapshot()
    first = store.latest_snapshot("s", store.head("s")).state["packed"]["STRUCTURAL_LOGS"]
    for start in range(30, 400, 10):
        _grow(ctx, start, 10)
        ctx.snapshot()
        entry = store.latest_snapshot("s", store.head("s")).state["packed"]["STRUCTURAL_LOGS"]
        assert sum(map(len, entry.get("tails", []))) <= len(entry["zlib"]) + 2048
    assert entry["zlib"] != first["zlib"]
    assert ev.state_to_wire(Context.open(store, "s")._state) == _replayed(store, "s")


def test_snapshot_spacing_weighs_what_a_snapshot_writes_so_a_crash_leaves_a_short_tail() -> None:
    """A state whose large value grows by appends: snapshots write its base and tails, so they
    stay small and frequent, and the tail a crash leaves stays short."""
    store = MemoryStore()
    ctx = Context.open(store, "s")
    _grow(ctx, 0, 3000)  # about 270 KB of JSON, a few tens of KB packed
    wire = store.latest_snapshot("s", store.head("s")).state
    assert ctx._snapshot_bytes == len(orjson.dumps(wire)) < 64 * 1024
    assert ctx._snapshot_bytes * 4 < len(orjson.dumps(ev.state_to_wire(ctx._state)))
    assert store.head("s") - store.latest_snapshot("s", store.head("s")).version < 100  # snapshot_every
    assert wire["packed"]["STRUCTURAL_LOGS"].get("tails")


def test_a_packed_value_that_does_not_decode_names_the_session_and_snapshot() -> None:
    store = MemoryStore()
    ctx = Context.open(store, "s")
    _grow(ctx, 0, 60)
    version = ctx.snapshot()
    wire = store.latest_snapshot("s", version).state
    bad = {**wire, "packed": {"STRUCTURAL_LOGS": {"size": 10, "zlib": "bm90IHpsaWI="}}}
    store.save_snapshot(Snapshot("s", version, 0.0, bad))
    reopened = Context.open(store, "s")
    assert reopened.get(ContextNames.SESSION_STEP) == 60
    with pytest.raises(CorruptRecordError, match=rf"session 's'.*version {version}.*packed value of STRUCTURAL_LOGS"):
        reopened.get(ContextNames.STRUCTURAL_LOGS)


def test_a_malformed_packed_entry_makes_the_snapshot_unusable_and_the_log_is_read() -> None:
    store = MemoryStore()
    ctx = Context.open(store, "s")
    _grow(ctx, 0, 60)
    live = _plain(ctx)
    version = ctx.snapshot()
    wire = store.latest_snapshot("s", version).state
    store.save_snapshot(Snapshot("s", version, 0.0, {**wire, "packed": {"STRUCTURAL_LOGS": "not an entry"}}))
    with pytest.warns(RuntimeWarning, match="ignoring unusable snapshot"):
        reopened = Context.open(store, "s")
    assert _plain(reopened) == live


def test_a_torn_snapshot_falls_back_to_the_one_before(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    with open_store(url) as store:
        ctx = Context.open(store, "s")
        _grow(ctx, 0, 60)
        ctx.snapshot()
        _grow(ctx, 60, 30)
        newest = ctx.snapshot()
        live = _plain(ctx)
        ctx.close()
    with sqlite3.connect(tmp_path / "s.db") as conn:
        conn.execute("UPDATE snapshots SET state = X'00ff00ff' WHERE version = ?", (newest,))
    with open_store(url) as store, pytest.warns(RuntimeWarning, match="damaged snapshot"):
        reopened = Context.open(store, "s")
        assert reopened._snapshot_version < newest
        assert _plain(reopened) == live


def test_an_encrypted_packed_value_is_sealed_at_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SAUCER_STORE_KEY", raising=False)
    from saucer.store.crypto import new_key

    key_file = tmp_path / "key"
    key_file.write_text(new_key())
    path = tmp_path / "s.db"
    with open_store(f"sqlite:///{path}", encrypt=["STRUCTURAL_LOGS"], key_file=key_file) as store:
        ctx = Context.open(store, "s")
        ctx.add_to_structural_logs({**_entry(0), "secret": "PLAINTEXT-" + "x" * 3000})
        ctx.commit()
        ctx.snapshot()
        wire = store.inner.latest_snapshot("s", store.head("s")).state
        assert "STRUCTURAL_LOGS" in wire["sealed"]["packed"] and not wire.get("packed")
        ctx.close()
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert b"PLAINTEXT" not in path.read_bytes()
    with open_store(f"sqlite:///{path}", encrypt=["STRUCTURAL_LOGS"], key_file=key_file) as store:
        assert Context.open(store, "s").filter_structural_logs(0, 0, "secret") == ["PLAINTEXT-" + "x" * 3000]
    with open_store(f"sqlite:///{path}", encrypt=["STRUCTURAL_LOGS"]) as store:
        shut = Context.open(store, "s")
        assert shut.get(ContextNames.STRUCTURAL_LOGS) == ev.ENCRYPTED
        assert shut.encrypted == {"STRUCTURAL_LOGS"}


def test_rekey_reseals_a_packed_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import base64

    from saucer.store import maintenance
    from saucer.store.crypto import new_key

    monkeypatch.delenv("SAUCER_STORE_KEY", raising=False)
    old, new = new_key(), new_key()
    old_file, new_file = tmp_path / "old", tmp_path / "new"
    old_file.write_text(old)
    new_file.write_text(new)
    url = f"sqlite:///{tmp_path / 's.db'}"
    with open_store(url, encrypt=["STRUCTURAL_LOGS"], key_file=old_file) as store:
        ctx = Context.open(store, "s")
        _grow(ctx, 0, 60)
        live = ctx.get(ContextNames.STRUCTURAL_LOGS)
        ctx.close()  # its last snapshot holds the packed value, sealed
    with open_store(url) as raw:
        report = maintenance.rekey(raw, base64.b64decode(old), base64.b64decode(new))
        assert report.values > 0
    with open_store(url, encrypt=["STRUCTURAL_LOGS"], key_file=new_file) as store:
        snap = store.inner.latest_snapshot("s", store.head("s"))
        assert snap is not None and "STRUCTURAL_LOGS" in snap.state["sealed"]["packed"]
        assert Context.open(store, "s").get(ContextNames.STRUCTURAL_LOGS) == live


def test_after_a_crash_the_next_snapshot_writes_the_packed_base_without_decoding_it() -> None:
    """After a crash the tail can pass ``snapshot_every``: the first commit's snapshot writes the
    packed value's base and the tail's operations on it, and decodes nothing."""
    store = MemoryStore()
    ctx = Context.open(store, "s", snapshot_every=5)
    _grow(ctx, 0, 1000)
    ctx.snapshot()
    before = store.latest_snapshot("s", store.head("s")).state["packed"]["STRUCTURAL_LOGS"]
    base, tails = before["zlib"], before.get("tails", [])
    _grow(ctx, 1000, 4)
    # A crash: those 4 events stay a tail, the Context is never closed.
    reopened = Context.open(store, "s", snapshot_every=5)
    assert reopened._snapshot_bytes >= len(base)
    reopened.set(ContextNames.REQUEST, "after the crash")
    reopened.commit()
    snap = store.latest_snapshot("s", store.head("s"))
    assert snap.version == store.head("s")
    entry = snap.state["packed"]["STRUCTURAL_LOGS"]
    assert entry["zlib"] == base and entry["tails"][:-1] == tails  # one more tail: the crash's tail
    assert "STRUCTURAL_LOGS" in reopened._state.packed
    assert ev.state_to_wire(Context.open(store, "s")._state) == _replayed(store, "s")


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    import os

    if request.param == "memory":
        yield MemoryStore()
        return
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 's.db'}"
    else:
        base = os.environ.get("SAUCER_TEST_POSTGRES_URL")
        if not base:
            if os.environ.get("CI") == "true":
                pytest.fail("SAUCER_TEST_POSTGRES_URL is not set under CI=true")
            pytest.skip("set SAUCER_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:5432/test")
        url = f"{base}?schema=t_packed_{os.urandom(4).hex()}"
    store = open_store(url)
    yield store
    if request.param == "postgres":
        import psycopg

        schema = url.rsplit("=", 1)[1]
        store.close()
        with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    else:
        store.close()


def test_packed_values_and_tails_round_trip_on_every_backend(any_store: Any) -> None:
    ctx = Context.open(any_store, "s")
    _grow(ctx, 0, 600)
    ctx.snapshot()
    _grow(ctx, 600, 5)
    ctx.snapshot()
    live = _plain(ctx)
    entry = any_store.latest_snapshot("s", any_store.head("s")).state["packed"]["STRUCTURAL_LOGS"]
    assert entry.get("tails")
    reopened = Context.open(any_store, "s")
    assert reopened._state.packed["STRUCTURAL_LOGS"].tails
    assert _plain(reopened) == live
    ctx.close()  # stores the value whole
    entry = any_store.latest_snapshot("s", any_store.head("s")).state["packed"]["STRUCTURAL_LOGS"]
    assert "tails" not in entry
    reopened = Context.open(any_store, "s")
    assert "STRUCTURAL_LOGS" in reopened._state.packed
    assert _plain(reopened) == live
    assert ev.state_to_wire(Context.open(any_store, "s")._state) == _replayed(any_store, "s")


def test_a_live_value_keeps_no_more_operations_than_its_base_is_worth() -> None:
    """With snapshots far apart, the operations kept for the next tail stop at the base's size."""
    store = MemoryStore()
    ctx = Context.open(store, "s", snapshot_every=10**9)
    _grow(ctx, 0, 600)
    ctx.snapshot()
    assert "STRUCTURAL_LOGS" in ctx._state.bases
    _grow(ctx, 600, 2000)
    assert "STRUCTURAL_LOGS" not in ctx._state.bases
    ctx.snapshot()  # packed afresh
    assert ev.state_to_wire(Context.open(store, "s")._state) == _replayed(store, "s")


def _ledgers(ctx: Context, rounds: int, start: int = 0) -> None:
    """Per-round ledgers (int keys, floats) and logs, as an engine run leaves them."""
    for r in range(start, start + rounds):
        ctx.set(ContextNames.CURRENT_ROUND_ID, r)
        ctx.set(ContextNames.CURRENT_ROUND_COST, 0.5 * r)
        ctx.set(ContextNames.CURRENT_ROUND_STEP, r % 3)
        ctx.add_to_structural_logs({**_entry(r, r), "Subtask": f"é€ \x1b[31m {r}"})
        ctx.commit()


def test_closing_writes_packed_values_whole_and_they_read_as_the_fold_gives() -> None:
    store = MemoryStore()
    ctx = Context.open(store, "s")
    _ledgers(ctx, 300)
    ctx.snapshot()
    _ledgers(ctx, 20, 300)  # operations since the base: tails in the next snapshot
    ctx.snapshot()
    assert any("tails" in e for e in store.latest_snapshot("s", store.head("s")).state["packed"].values())
    live = _plain(ctx)
    ctx.close()
    closing = store.latest_snapshot("s", store.head("s")).state["packed"]
    assert {"STRUCTURAL_LOGS", "ROUND_COST", "ROUND_STEP"} <= set(closing)
    assert not any("tails" in e for e in closing.values())
    reopened = Context.open(store, "s")
    assert _plain(reopened) == live
    assert ev.state_to_wire(Context.open(store, "s")._state) == _replayed(store, "s")
    # Each whole value's text is the value's own compact JSON, as the table shows it.
    texts = Context.open(store, "s").to_dict(ensure_serializable=True, copy=False, stored_json=True)
    decoded = Context.open(store, "s").to_dict(ensure_serializable=True, copy=False)
    stored = {k: v for k, v in texts.items() if isinstance(v, ev.StoredJson)}
    assert set(stored) == set(closing)
    for name, text in stored.items():
        assert bytes(text) == orjson.dumps(decoded[name], option=orjson.OPT_NON_STR_KEYS), name
    assert {k: v for k, v in texts.items() if k not in stored} == {k: v for k, v in decoded.items() if k not in stored}


def test_a_value_changed_since_its_snapshot_is_not_given_as_stored_text() -> None:
    store = MemoryStore()
    ctx = Context.open(store, "s")
    _ledgers(ctx, 150)
    ctx.close()
    ctx = Context.open(store, "s")
    assert isinstance(ctx.to_dict(stored_json=True)["STRUCTURAL_LOGS"], ev.StoredJson)
    _ledgers(ctx, 1, 150)  # kept as operations on the packed value
    texts = ctx.to_dict(stored_json=True)
    assert not isinstance(texts["STRUCTURAL_LOGS"], ev.StoredJson)
    assert len(texts["STRUCTURAL_LOGS"]) == 151


def test_the_owned_fold_gives_what_the_copying_fold_gives_and_refuses_a_state_that_keeps_operations() -> None:
    ops = [
        {"op": "append", "name": "STRUCTURAL_LOGS", "path": [0, 0], "value": {"Step": 1, "Results": ["a"]}},
        {"op": "set", "name": "ROUND_COST", "path": [0], "value": 1.5},
        {"op": "set", "var": "v", "value": {"x": [1, 2]}},
        {"op": "set", "var": "v", "path": ["x"], "value": [3]},
        {"op": "incr", "name": "SESSION_STEP", "by": 2},
    ]
    copied = ev.apply_ops(ev.State(), orjson.loads(orjson.dumps(ops)))
    owned = ev.apply_ops(ev.State(), orjson.loads(orjson.dumps(ops)), owned=True)
    assert ev.state_to_wire(owned) == ev.state_to_wire(copied)
    kept = ev.State(packed={"STRUCTURAL_LOGS": ev.Packed("", 0)})
    with pytest.raises(ValueError, match="owned"):
        ev.apply_ops(kept, ops, owned=True)


def test_the_collector_is_held_off_while_values_decode_and_back_on_after() -> None:
    import gc
    import threading

    from saucer.store.model import paused_gc

    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
        inside = threading.Event()
        leave = threading.Event()

        def other() -> None:
            with paused_gc():
                inside.set()
                leave.wait(5)

        thread = threading.Thread(target=other)
        thread.start()
        inside.wait(5)
    assert not gc.isenabled()  # the other thread's pause still holds
    leave.set()
    thread.join()
    assert gc.isenabled()
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()  # off before, off after
    finally:
        gc.enable()


def test_a_whole_packed_value_that_is_not_what_was_stored_is_an_error_not_text() -> None:
    import base64
    import zlib

    good = orjson.dumps({"0": [1, 2]})
    for data, size in [
        (
            base64.b64encode(zlib.compress(b'"just a string"')).decode(),
            len(b'"just a string"'),
        ),  # not an object or array
        (base64.b64encode(zlib.compress(good)).decode(), len(good) + 5),  # not the size it was
        ("not base64 at all!", 10),
    ]:
        with pytest.raises(CorruptRecordError):
            ev.Packed(data, size, where=("s", 7)).whole_json()
    assert ev.Packed(base64.b64encode(zlib.compress(good)).decode(), len(good)).whole_json() == good
