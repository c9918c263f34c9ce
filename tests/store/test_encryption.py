"""Encryption at rest (store.encrypt): the values the patterns cover never reach a
backend in plain text; with the key everything reads as before, without it
they read as <encrypted> and nothing else breaks; a wrong key is refused;
rekey rotates the key, resumably.
"""

from __future__ import annotations

import base64
import os
import sqlite3
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from saucer.context import Context, ContextNames, prune
from saucer.store import StoreKeyError, open_store
from saucer.store.crypto import ENCRYPTED, new_key
from saucer.store.maintenance import rekey
from saucer.store.sealed import SealedStore
from saucer.store.testing import EventStoreContract

PATTERNS = ["vars.api_*", "REQUEST"]
SECRET_REQUEST = "open the vault with code 7731-PLAINTEXT-REQ"
SECRET_TOKEN = "tok-PLAINTEXT-5be1c0de"
SECRET_LIST_ITEM = "PLAINTEXT-LIST-ITEM-99"
VISIBLE = "VISIBLE-NOT-COVERED-42"
PLAINTEXTS = [SECRET_REQUEST, SECRET_TOKEN, SECRET_LIST_ITEM, "7731-PLAINTEXT", "5be1c0de"]


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "memory":
        yield f"memory://enc-{uuid.uuid4().hex}"
        return
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'enc.db'}"
        return
    base = os.environ.get("SAUCER_TEST_POSTGRES_URL")
    if not base:
        if os.environ.get("CI") == "true":
            pytest.fail("SAUCER_TEST_POSTGRES_URL is not set under CI=true")
        pytest.skip("set SAUCER_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:5432/test")
    schema = "t_enc_" + uuid.uuid4().hex[:12]
    yield f"{base}?schema={schema}"
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    k = new_key()
    monkeypatch.setenv("SAUCER_STORE_KEY", k)
    return k


def _raw_bytes(url: str) -> bytes:
    """Everything the backend holds: the SQLite file (and its WAL), or the PostgreSQL rows."""
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///") :])
        blobs = [p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists()]
        with sqlite3.connect(path) as conn:  # and the rows, decompressed records included
            import zlib

            for (blob,) in conn.execute(
                "SELECT state FROM snapshots UNION ALL SELECT payload FROM events UNION ALL SELECT payload FROM events_recent"
            ):
                blobs.append(blob if blob[:1] == b"{" else zlib.decompress(blob))
        return b"".join(blobs)
    import psycopg

    conninfo, schema = url.split("?schema=")
    out = []
    with psycopg.connect(conninfo) as conn:
        for table, column in (("events", "payload"), ("snapshots", "state"), ("sessions", "meta::text")):
            for (value,) in conn.execute(f'SELECT {column} FROM "{schema}".{table}'):
                out.append(value.encode() if isinstance(value, str) else bytes(value))
    import zlib

    return b"".join(b if b[:1] != b"x" else zlib.decompress(b) for b in out)


def _write_session(store: Any, sid: str = "s") -> Context:
    ctx = Context.open(store, sid, snapshot_every=3)
    ctx.set(ContextNames.REQUEST, SECRET_REQUEST)
    ctx.update_vars({"api_token": SECRET_TOKEN, "other": VISIBLE})
    ctx.commit()
    ctx.incr("api_calls", 2)
    ctx.append("api_log", SECRET_LIST_ITEM)
    ctx.commit()
    assert ctx.compare_and_set("api_token", SECRET_TOKEN, SECRET_TOKEN + "-2")
    ctx.commit()
    ctx.update_vars({"other": VISIBLE + "-2"})
    ctx.commit()
    ctx.snapshot()
    return ctx


def test_covered_values_never_reach_the_backend_in_plain_text(url: str, key: str) -> None:
    with open_store(url, encrypt=PATTERNS) as store:
        assert isinstance(store, SealedStore)
        ctx = _write_session(store)
        head = ctx.version
        if not url.startswith("memory://"):
            raw = _raw_bytes(url)
            assert VISIBLE.encode() in raw  # the grep finds what is stored in plain text
            for text in PLAINTEXTS:
                assert text.encode() not in raw, text
        raw_events = list(store.inner.read("s"))  # as the backend holds them
        assert all(op["op"] == "sealed" for e in raw_events for op in e.ops if op.get("var", "").startswith("api_"))
        assert store.inner.latest_snapshot("s").state["sealed"]["vars"].keys() == {"api_token", "api_calls", "api_log"}
        # With the key: history, diff and time travel as if nothing were encrypted.
        again = Context.open(store, "s")
        assert again.get(ContextNames.REQUEST) == SECRET_REQUEST
        assert again.vars["api_token"] == SECRET_TOKEN + "-2" and again.vars["api_calls"] == 2
        assert again.vars["api_log"] == [SECRET_LIST_ITEM]
        assert Context.open(store, "s", at=1).vars["api_token"] == SECRET_TOKEN
        assert again.diff(1, head)["vars.api_token"] == {"before": SECRET_TOKEN, "after": SECRET_TOKEN + "-2"}
        assert [op["op"] for e in again.history("vars.api_token") for op in e.ops if op.get("var") == "api_token"] == [
            "set",
            "cas",
        ]
        assert not again.encrypted
        fork = again.fork("s-fork", at=2)
        fork.update_vars({"api_fork": "fork-PLAINTEXT-f0"})
        fork.commit()
        assert Context.open(store, "s-fork").vars["api_token"] == SECRET_TOKEN
        first = prune(store, "s", keep_last=1)  # the fork gets its own (sealed) copy first
        assert Context.open(store, "s", at=first).vars["api_token"] == SECRET_TOKEN + "-2"
        assert Context.open(store, "s-fork").vars["api_fork"] == "fork-PLAINTEXT-f0"
        if not url.startswith("memory://"):
            raw = _raw_bytes(url)
            for text in [*PLAINTEXTS, "fork-PLAINTEXT-f0"]:
                assert text.encode() not in raw, text


def test_without_the_key_covered_values_read_as_encrypted_and_nothing_else_breaks(
    url: str, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_store(url, encrypt=PATTERNS) as store:
        head = _write_session(store).version
        if url.startswith("memory://"):
            keyless = SealedStore(store.inner, type(store.sealer)([], None))
            locked = SealedStore(store.inner, type(store.sealer)(PATTERNS, None))
        else:
            keyless = locked = None
        monkeypatch.delenv("SAUCER_STORE_KEY")
        with keyless or open_store(url) as plain:
            ctx = Context.open(plain, "s")
            assert ctx.get(ContextNames.REQUEST) == ENCRYPTED
            assert ctx.vars["api_token"] == ENCRYPTED and ctx.vars["api_log"] == ENCRYPTED
            assert ctx.vars["other"] == VISIBLE + "-2"
            assert ctx.encrypted == {"REQUEST", "vars.api_token", "vars.api_calls", "vars.api_log"}
            assert Context.open(plain, "s", at=1).vars["api_token"] == ENCRYPTED
            assert ctx.diff(1, head)["vars.other"] == {"before": VISIBLE, "after": VISIBLE + "-2"}
            assert len(ctx.history()) == head
            # A reader without the key writes what is not covered; it never stores its placeholders.
            ctx.update_vars({"note": "written without the key"})
            ctx.commit()
            with pytest.raises(StoreKeyError, match="no snapshot without the store key"):
                ctx.snapshot()
            ctx.close()
        with locked or open_store(url, encrypt=PATTERNS) as no_key:
            ctx = Context.open(no_key, "s")
            ctx.update_vars({"api_new": "x"})
            with pytest.raises(StoreKeyError, match=r"covers vars.api_new, but no store key is given"):
                ctx.commit()
            ctx.rollback()
            with pytest.raises(StoreKeyError, match="cannot prune without the store key"):
                prune(no_key, "s", keep_last=1)
        monkeypatch.setenv("SAUCER_STORE_KEY", key)
        ctx = Context.open(store, "s")
        assert ctx.vars["api_token"] == SECRET_TOKEN + "-2" and ctx.vars["note"] == "written without the key"


def test_a_wrong_or_malformed_key_is_refused_and_a_value_moved_to_another_session_does_not_open(
    tmp_path: Path, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    with open_store(url, encrypt=PATTERNS) as store:
        _write_session(store, "a")
        _write_session(store, "b")
    monkeypatch.setenv("SAUCER_STORE_KEY", new_key())
    with (
        open_store(url, encrypt=PATTERNS) as store,
        pytest.raises(StoreKeyError, match="sealed with another store key than the one given"),
    ):
        Context.open(store, "a")
    monkeypatch.setenv("SAUCER_STORE_KEY", "not-a-key")
    with pytest.raises(StoreKeyError, match="SAUCER_STORE_KEY is not 32 bytes in base64"):
        open_store(url)
    monkeypatch.setenv("SAUCER_STORE_KEY", key)
    path = tmp_path / "k.db"
    with sqlite3.connect(path) as conn:  # an attacker with the file swaps b's first event for a's
        row = conn.execute(
            "SELECT payload, crc FROM events_recent WHERE session_id = 'a' AND version = 1 UNION ALL "
            "SELECT payload, crc FROM events WHERE session_id = 'a' AND version = 1"
        ).fetchone()
        for table in ("events", "events_recent"):
            conn.execute(f"UPDATE {table} SET payload = ?, crc = ? WHERE session_id = 'b' AND version = 1", row)
        conn.execute("DELETE FROM snapshots WHERE session_id = 'b'")
    with open_store(url, encrypt=PATTERNS) as store:
        with pytest.raises(Exception, match="does not open with its key"):
            Context.open(store, "b")
        assert Context.open(store, "a").vars["api_token"] == SECRET_TOKEN + "-2"


def test_rekey_rotates_every_sealed_value_and_resumes(url: str, key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    old = base64.b64decode(key)
    new_text = new_key()
    new = base64.b64decode(new_text)
    with open_store(url, encrypt=PATTERNS) as store:
        _write_session(store, "r1")
        ctx = Context.open(store, "r1").fork("r1-fork")
        ctx.update_vars({"api_more": "more-PLAINTEXT"})
        ctx.commit()
        before = {sid: Context.open(store, sid)._plain() for sid in ("r1", "r1-fork")}
        report = rekey(store, old, new)
        assert report.values > 0 and report.events > 0 and report.snapshots > 0
        assert rekey(store, old, new).values == 0  # nothing left under the old key: a rerun finishes or does nothing
        monkeypatch.setenv("SAUCER_STORE_KEY", new_text)
        if url.startswith("memory://"):
            reader = SealedStore(store.inner, type(store.sealer)(PATTERNS, new))
        else:
            reader = open_store(url, encrypt=PATTERNS)
        with reader:
            assert {sid: Context.open(reader, sid)._plain() for sid in before} == before
            assert Context.open(reader, "r1", at=1).vars["api_token"] == SECRET_TOKEN
        with pytest.raises(StoreKeyError, match="another store key"):
            Context.open(store, "r1")  # the old key no longer opens anything
        with pytest.raises(StoreKeyError, match="same as the old one"):
            rekey(store, new, new)
        if not url.startswith("memory://"):
            raw = _raw_bytes(url)
            for text in [*PLAINTEXTS, "more-PLAINTEXT"]:
                assert text.encode() not in raw, text


def test_an_interrupted_rekey_is_finished_by_running_it_again(
    tmp_path: Path, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from saucer.store import maintenance

    url = f"sqlite:///{tmp_path / 'r.db'}"
    old, new_text = base64.b64decode(key), new_key()
    new = base64.b64decode(new_text)
    with open_store(url, encrypt=PATTERNS) as store:
        for sid in ("a", "b", "c"):
            _write_session(store, sid)
        calls = {"n": 0}
        real = store.inner.rewrite_events

        def dies_on_the_second_session(sid: str, events: Any, *rest: Any) -> None:
            calls["n"] += 1
            if calls["n"] == 2:
                raise KeyboardInterrupt("killed mid-rekey")
            real(sid, events, *rest)

        monkeypatch.setattr(store.inner, "rewrite_events", dies_on_the_second_session)
        with pytest.raises(KeyboardInterrupt):
            maintenance.rekey(store, old, new)
        monkeypatch.setattr(store.inner, "rewrite_events", real)
        # Half done: 'a' is under the new key, 'b' and 'c' under the old one; run it again.
        maintenance.rekey(store, old, new)
    monkeypatch.setenv("SAUCER_STORE_KEY", new_text)
    with open_store(url, encrypt=PATTERNS) as store:
        for sid in ("a", "b", "c"):
            assert Context.open(store, sid).vars["api_token"] == SECRET_TOKEN + "-2"
            assert Context.open(store, sid, at=1).get(ContextNames.REQUEST) == SECRET_REQUEST


def test_a_key_file_is_used_when_the_variable_is_not_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SAUCER_STORE_KEY", raising=False)
    key_file = tmp_path / "store.key"
    key_file.write_text(new_key() + "\n")
    url = f"sqlite:///{tmp_path / 'f.db'}"
    with open_store(url, encrypt=PATTERNS, key_file=key_file) as store:
        _write_session(store)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with open_store(url, key_file=key_file) as store:
            assert Context.open(store, "s").vars["api_token"] == SECRET_TOKEN + "-2"
    with pytest.raises(StoreKeyError, match="cannot read the store key file"):
        open_store(url, key_file=tmp_path / "missing.key")


def test_a_commit_whose_outcome_is_unknown_is_adopted_not_written_twice() -> None:
    """The store reports the plain event with OutcomeUnknownError: the Context compares it
    with what it reads back (opened), so a sealed copy (a fresh nonce) would never match."""
    from saucer.store import OutcomeUnknownError
    from saucer.store.crypto import Sealer
    from saucer.store.memory import MemoryStore

    class DropsAfterWriting(MemoryStore):
        drop = False

        def _append(self, event: Any, expected_version: int, fence: int | None) -> None:
            super()._append(event, expected_version, fence)
            if self.drop:
                self.drop = False
                raise OutcomeUnknownError(event.session_id, event.version, "connection dropped", event=event)

    inner = DropsAfterWriting()
    store = SealedStore(inner, Sealer(PATTERNS, base64.b64decode(new_key())))
    ctx = Context.open(store, "u")
    ctx.update_vars({"api_token": SECRET_TOKEN})
    inner.drop = True
    with pytest.raises(OutcomeUnknownError):
        ctx.commit()
    ctx.update_vars({"other": VISIBLE})
    ctx.commit()  # adopts version 1 (it was written), then writes version 2
    assert store.head("u") == 2
    assert [e.ops[0].get("var") for e in store.read("u")] == ["api_token", "other"]
    assert Context.open(store, "u").vars == {"api_token": SECRET_TOKEN, "other": VISIBLE}


class TestASealedStoreKeepsTheContract(EventStoreContract):
    """Every value sealed (patterns ``*`` and ``vars.*``), over SQLite: the whole contract holds."""

    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> Any:
        from saucer.store.crypto import Sealer
        from saucer.store.sqlite import SQLiteStore

        key = base64.b64decode(new_key())
        return lambda: SealedStore(SQLiteStore(tmp_path / "contract.db"), Sealer(["*", "vars.*"], key))
