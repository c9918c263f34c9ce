"""Record format 4: large event payloads and snapshots are stored zlib-compressed;
records of formats 1 to 3 read as before, and a damaged compressed record is a
damaged record. Sealed values are never compressed before they are encrypted
(formats 4 and 5 did; their tokens still open)."""

from __future__ import annotations

import base64
import sqlite3
import zlib
from pathlib import Path

import orjson
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from saucer.context import Context
from saucer.store import CorruptRecordError, open_store
from saucer.store._codec import COMPRESS_OVER, DamagedRecord, decode_payload, encode_payload, payload_format
from saucer.store.crypto import KeyRing, _aad, new_key
from saucer.store.model import Event
from saucer.store.upcast import FORMAT_VERSION

BIG = {"kind": "step", "results": [{"status": "success", "result": "line of output\n" * 200}]}


def _event(meta: dict, version: int = 1) -> Event:
    return Event("s", version, 1.0, "agent", 1, 1, [{"op": "set", "var": "x", "value": 1}], meta)


def test_a_large_payload_is_stored_compressed_and_reads_back() -> None:
    small, small_crc = encode_payload(_event({"kind": "step"}))
    big, big_crc = encode_payload(_event(BIG))
    assert small[:1] == b"{" and len(small) <= COMPRESS_OVER  # a small one stays plain JSON
    assert big[:1] == b"x" and len(big) < len(orjson.dumps(BIG)) / 4 and big_crc == zlib.crc32(big)
    assert (
        decode_payload(big, big_crc)["meta"] == BIG and payload_format(big) == FORMAT_VERSION >= 4
    )  # compressed since 4


def test_format_3_2_and_1_payloads_read_as_before() -> None:
    for record in (
        {"v": 3, "ops": [], "meta": BIG},
        {"v": 2, "ops": [], "meta": BIG},
        {"ops": [], "meta": BIG},
    ):  # plain JSON over the threshold
        blob = orjson.dumps(record)
        data = decode_payload(blob, zlib.crc32(blob))
        assert data["meta"] == BIG and data["v"] == FORMAT_VERSION


def test_a_damaged_compressed_payload_is_a_damaged_record(tmp_path: Path) -> None:
    torn = encode_payload(_event(BIG))[0][:-20]
    with pytest.raises(DamagedRecord, match="undecodable payload"):
        decode_payload(torn, zlib.crc32(torn))  # its checksum matches: zlib itself finds the damage
    path = tmp_path / "s.db"
    with open_store(f"sqlite:///{path}") as store:
        ctx = Context.open(store, "s")
        for i in range(3):
            ctx.update_vars({"out": "line of output\n" * (100 + i)})
            ctx.commit()
        ctx.close()
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT version, payload FROM events_recent WHERE session_id = 's' ORDER BY version"
        ).fetchall()
        assert all(bytes(p)[:1] == b"x" for _, p in rows)
        bad = bytes(rows[1][1])[:-20]
        conn.execute("UPDATE events_recent SET payload = ?, crc = ? WHERE version = 2", (bad, zlib.crc32(bad)))
    with open_store(f"sqlite:///{path}") as store:
        with pytest.raises(CorruptRecordError, match="version 2"):
            list(store.read("s"))
        assert [e.version for e in store.read("s", 0, 1)] == [1]  # one session's damage, no more


def test_a_sealed_value_is_never_compressed_and_one_sealed_compressed_still_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = new_key()
    monkeypatch.setenv("SAUCER_STORE_KEY", key)
    ring = KeyRing(base64.b64decode(key))
    secret = "secret line\n" * 300
    token = ring.seal("s", "vars.api_dump", secret)
    raw = base64.b64decode(token)
    # Not compressed: a compressed secret's length would depend on what else is sealed with it.
    assert len(raw) >= len(secret) + 2
    assert ring.open("s", "vars.api_dump", token) == secret
    # Formats 4 and 5 sealed large values compressed: such a token still opens.
    nonce = b"\x01" * 12
    old_plain = zlib.compress(orjson.dumps(secret), 6)
    sealed_old = ring.id + nonce + AESGCM(ring.key).encrypt(nonce, old_plain, _aad("s", "vars.api_dump"))
    assert ring.open("s", "vars.api_dump", base64.b64encode(sealed_old).decode("ascii")) == secret
    small = ring.seal("s", "vars.api_key", "tok-1")
    assert ring.open("s", "vars.api_key", small) == "tok-1"
    url = f"sqlite:///{tmp_path / 'enc.db'}"
    with open_store(url, encrypt=["vars.api_*"]) as store:
        ctx = Context.open(store, "s")
        ctx.update_vars({"api_dump": secret, "plain": "visible"})
        ctx.commit()
        ctx.close()
        assert Context.open(store, "s").vars["api_dump"] == secret
        (stored,) = [op for e in store.inner.read("s") for op in e.ops if op.get("var") == "api_dump"]
        assert stored["op"] == "sealed" and secret.encode() not in str(stored).encode()
