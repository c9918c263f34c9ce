"""The CLI over encrypted values and record formats, run as a user runs it:
state/history/diff with and without the key, export with and without
--decrypt, store rekey, store migrate --check and --rewrite."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from saucer.context import Context, ContextNames
from saucer.store import open_store
from saucer.store.crypto import new_key
from saucer.store.upcast import FORMAT_VERSION

GOLDEN_DB = Path(__file__).resolve().parents[1] / "golden" / "2026-11-saucer-0.1.0-sqlite-schema2" / "store.db"
SECRET = "sk-PLAINTEXT-9f8e7d"
REQUEST = "pay invoice 42 PLAINTEXT-REQUEST"


@pytest.fixture
def encrypted_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A store whose session 's' holds encrypted values, its config file, and its key."""
    key = new_key()
    monkeypatch.setenv("SAUCER_STORE_KEY", key)
    url = f"sqlite:///{tmp_path / 'enc.db'}"
    (tmp_path / "saucer.toml").write_text(f'[store]\nurl = "{url}"\nencrypt = ["vars.api_*", "REQUEST"]\n')
    with open_store(url, encrypt=["vars.api_*", "REQUEST"]) as store:
        ctx = Context.open(store, "s")
        ctx.set(ContextNames.REQUEST, REQUEST)
        ctx.update_vars({"api_key": SECRET, "plain": "shown"})
        ctx.commit()
        ctx.update_vars({"api_key": SECRET + "-rotated", "plain": "shown again"})
        ctx.commit()
        ctx.close()
    monkeypatch.delenv("SAUCER_STORE_KEY")
    return url, key


def test_inspection_with_and_without_the_key(run_cli: Callable[..., object], encrypted_store: tuple[str, str]) -> None:
    _, key = encrypted_store
    with_key = run_cli("state", "s", "--json", env={"SAUCER_STORE_KEY": key}, check=True)
    data = json.loads(with_key.stdout)  # type: ignore[attr-defined]
    assert data["vars"]["api_key"] == SECRET + "-rotated" and data["names"]["REQUEST"] == REQUEST
    for args in (("state", "s"), ("state", "s", "--at", "1"), ("history", "s"), ("diff", "s", "1", "2"), ("sessions",)):
        proc = run_cli(*args, check=True)
        out = proc.stdout  # type: ignore[attr-defined]
        assert SECRET not in out and "PLAINTEXT" not in out, args
        if args[0] in ("state", "history"):
            assert "<encrypted>" in out, args
    diff = run_cli("diff", "s", "1", "2", "--json", check=True)
    changes = json.loads(diff.stdout)  # type: ignore[attr-defined]
    assert changes["vars.plain"] == {"before": "shown", "after": "shown again"}
    assert changes.get("vars.api_key") is None  # both read as <encrypted> without the key
    wrong = run_cli("state", "s", env={"SAUCER_STORE_KEY": new_key()})
    assert wrong.returncode != 0 and "another store key" in wrong.stderr and len(wrong.stderr.strip().splitlines()) == 1  # type: ignore[attr-defined]


def test_export_keeps_ciphertext_unless_decrypt(
    run_cli: Callable[..., object], encrypted_store: tuple[str, str], tmp_path: Path
) -> None:
    _, key = encrypted_store
    run_cli("export", "s", "-o", "sealed.json", env={"SAUCER_STORE_KEY": key}, check=True)
    sealed = (tmp_path / "sealed.json").read_text()
    assert SECRET not in sealed and "PLAINTEXT" not in sealed and '"sealed"' in sealed and "shown again" in sealed
    run_cli("export", "s", "-o", "plain.json", "--decrypt", env={"SAUCER_STORE_KEY": key}, check=True)
    plain = json.loads((tmp_path / "plain.json").read_text())
    assert plain["state"]["vars"]["api_key"] == SECRET + "-rotated"
    assert plain["events"][0]["ops"][0] == {"op": "set", "name": "REQUEST", "value": REQUEST}
    refused = run_cli("export", "s", "--decrypt")
    assert refused.returncode != 0 and "needs the store key" in refused.stderr  # type: ignore[attr-defined]


def test_rekey_from_the_command_line(
    run_cli: Callable[..., object], encrypted_store: tuple[str, str], tmp_path: Path
) -> None:
    _, key = encrypted_store
    missing = run_cli("store", "rekey", "--new-key-file", "new.key")
    assert missing.returncode != 0 and "needs the current key" in missing.stderr  # type: ignore[attr-defined]
    done = run_cli("store", "rekey", "--new-key-file", "new.key", env={"SAUCER_STORE_KEY": key}, check=True)
    assert "re-encrypted 5 values in 2 events and 1 snapshots of 1 sessions" in done.stdout  # type: ignore[attr-defined]
    assert (tmp_path / "new.key").stat().st_mode & 0o077 == 0
    new = (tmp_path / "new.key").read_text().strip()
    state = json.loads(run_cli("state", "s", "--json", env={"SAUCER_STORE_KEY": new}, check=True).stdout)  # type: ignore[attr-defined]
    assert state["vars"]["api_key"] == SECRET + "-rotated"
    old = run_cli("state", "s", env={"SAUCER_STORE_KEY": key})
    assert old.returncode != 0 and "another store key" in old.stderr  # type: ignore[attr-defined]
    again = run_cli("store", "rekey", "--new-key-file", "new.key", env={"SAUCER_STORE_KEY": key}, check=True)
    assert "re-encrypted 0 values" in again.stdout  # type: ignore[attr-defined]


def test_migrate_check_and_rewrite_on_a_golden_store(run_cli: Callable[..., object], tmp_path: Path) -> None:
    copy = tmp_path / "golden.db"
    shutil.copyfile(GOLDEN_DB, copy)
    url = f"sqlite:///{copy}"
    before = run_cli("state", "names-all", "--json", "--store", url, check=True).stdout  # type: ignore[attr-defined]
    check = run_cli("store", "migrate", "--check", "--store", url, check=True).stdout  # type: ignore[attr-defined]
    assert "names-all: events v1: " in check and "sessions hold older records" in check
    rewrite = run_cli("store", "migrate", "--rewrite", "--store", url, check=True).stdout  # type: ignore[attr-defined]
    assert f"records rewritten in record format {FORMAT_VERSION}" in rewrite
    after_check = run_cli("store", "migrate", "--check", "--store", url, check=True).stdout  # type: ignore[attr-defined]
    assert "0 of" in after_check and "v1:" not in after_check
    assert run_cli("state", "names-all", "--json", "--store", url, check=True).stdout == before  # type: ignore[attr-defined]
    again = run_cli("store", "migrate", "--rewrite", "--store", url, check=True).stdout  # type: ignore[attr-defined]
    assert "0 records rewritten" in again


def test_a_ciphertext_export_is_refused_by_import_with_the_way_out(
    run_cli: Callable[..., object], encrypted_store: tuple[str, str], tmp_path: Path
) -> None:
    _, key = encrypted_store
    run_cli("export", "s", "-o", "sealed.json", env={"SAUCER_STORE_KEY": key}, check=True)
    refused = run_cli("import", "sealed.json", "--as", "copy", env={"SAUCER_STORE_KEY": key})
    assert refused.returncode != 0 and "saucer export --decrypt" in refused.stderr  # type: ignore[attr-defined]
    run_cli("export", "s", "-o", "plain.json", "--decrypt", env={"SAUCER_STORE_KEY": key}, check=True)
    run_cli("import", "plain.json", "--as", "copy", env={"SAUCER_STORE_KEY": key}, check=True)
    state = json.loads(run_cli("state", "copy", "--json", env={"SAUCER_STORE_KEY": key}, check=True).stdout)  # type: ignore[attr-defined]
    assert state["vars"]["api_key"] == SECRET + "-rotated"
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("enc.db*"))
    assert SECRET.encode() not in raw  # the imported copy is sealed again (store.encrypt of the config)


def test_migrate_rewrite_leaves_a_damaged_session_and_goes_on(run_cli: Callable[..., object], tmp_path: Path) -> None:
    import sqlite3

    copy = tmp_path / "golden.db"
    shutil.copyfile(GOLDEN_DB, copy)
    with sqlite3.connect(copy) as conn:  # a bad disk: a record in the middle of 'vars-mix'
        for table in ("events", "events_recent"):
            conn.execute(f"UPDATE {table} SET payload = x'00ff', crc = 1 WHERE session_id = 'vars-mix' AND version = 2")
    proc = run_cli("store", "migrate", "--rewrite", "--store", f"sqlite:///{copy}")
    assert proc.returncode != 0  # type: ignore[attr-defined]
    assert "vars-mix: left as it is" in proc.stderr and "names-all: " in proc.stdout  # type: ignore[attr-defined]
    check = run_cli("store", "migrate", "--check", "--store", f"sqlite:///{copy}", check=True).stdout  # type: ignore[attr-defined]
    assert "1 of" in check and "vars-mix: events v1:" in check
