"""Encryption means what it says (issue 27, item 6).

With ``store.encrypt = ["*"]`` a real engine session leaves nothing of its request, plan, meta
or event payloads in plain text in SQLite or PostgreSQL; ``saucer show`` without the key prints
none of it; a missing key is refused before anything is written; known secrets never reach a
stored plan or an export; and ``saucer store rekey`` killed at any point leaves every session
wholly under one key.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from saucer.context import Context
from saucer.store import StoreKeyError, open_store
from saucer.store.crypto import Sealer, new_key
from saucer.store.sealed import SealedStore

SAUCER = [sys.executable, "-m", "saucer"]
MARKERS = ["OBJECT-PLAINTEXT-5521", "SUBTASK-PLAINTEXT-77", "CONTENT-PLAINTEXT-91", "PATH-PLAINTEXT"]
PLAN = {
    "task": "sealed-run",
    "object": "OBJECT-PLAINTEXT-5521",
    "steps": [
        {
            "subtask": "write SUBTASK-PLAINTEXT-77",
            "commands": [
                {
                    "tool_name": "files.write",
                    "parameters": {"path": "PATH-PLAINTEXT.txt", "content": "CONTENT-PLAINTEXT-91"},
                }
            ],
        },
        {
            "subtask": "read it back",
            "commands": [{"tool_name": "files.read", "parameters": {"path": "PATH-PLAINTEXT.txt"}}],
        },
    ],
}


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_") and k not in ("OPENAI_API_KEY",)}
    return env | {"COLUMNS": "200", "NO_COLOR": "1"} | extra


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SAUCER, *args],
        cwd=cwd,
        env=_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'enc.db'}"
        return
    base = os.environ.get("SAUCER_TEST_POSTGRES_URL")
    if not base:
        if os.environ.get("CI") == "true":
            pytest.fail("SAUCER_TEST_POSTGRES_URL is not set under CI=true")
        pytest.skip("set SAUCER_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:5432/test")
    schema = "t_all_" + uuid.uuid4().hex[:12]
    yield f"{base}?schema={schema}"
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _stored_bytes(url: str) -> bytes:
    """Every column of every table the backend holds (decompressed records included), as bytes."""
    out: list[bytes] = []
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///") :])
        out += [p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists()]
        with sqlite3.connect(path) as conn:
            tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            for table in tables:
                for row in conn.execute(f'SELECT * FROM "{table}"'):
                    out += [v if isinstance(v, bytes) else str(v).encode() for v in row if v is not None]
    else:
        import psycopg

        conninfo, schema = url.split("?schema=")
        with psycopg.connect(conninfo) as conn:
            tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))]
            for table in tables:
                for row in conn.execute(f'SELECT * FROM "{schema}"."{table}"'):
                    out += [
                        bytes(v) if isinstance(v, (bytes, memoryview)) else json.dumps(v, default=str).encode()
                        for v in row
                        if v is not None
                    ]
    return b"".join(b if b[:1] != b"x" else (zlib.decompress(b) if _zlib(b) else b) for b in out)


def _zlib(blob: bytes) -> bool:
    try:
        zlib.decompress(blob)
        return True
    except zlib.error:
        return False


def test_encrypt_star_leaves_nothing_of_a_session_in_plain_text(url: str, tmp_path: Path) -> None:
    key = new_key()
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    sealed = {"SAUCER_STORE__URL": url, "SAUCER_STORE__ENCRYPT": '["*"]', "SAUCER_STORE_KEY": key}
    # Without the key: refused in one line before anything is written.
    refused = _run(
        ["run", "--plan", "plan.json", "-w", "ws"],
        tmp_path,
        {k: v for k, v in sealed.items() if k != "SAUCER_STORE_KEY"},
    )
    assert refused.returncode != 0 and "Traceback" not in refused.stderr and "store key" in refused.stderr
    with open_store(url) as store:
        assert store.sessions() == []  # nothing was written, not even the session's row
    done = _run(["run", "--plan", "plan.json", "-w", "ws", "--yes"], tmp_path, sealed)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "ws" / "PATH-PLAINTEXT.txt").read_text() == "CONTENT-PLAINTEXT-91"
    raw = _stored_bytes(url)
    for marker in MARKERS:
        assert marker.encode() not in raw, marker
    with open_store(url) as store:
        [info] = store.sessions()
        sid = info.session_id
        assert info.meta["task"] == "sealed-run" and set(info.meta) <= {
            "task",
            "mode",
            "status",
            "sealed",
            "plan",
            "request",
        }
    # With the key everything reads as before; without it nothing sealed is printed.
    shown = _run(["show", sid], tmp_path, sealed)
    assert shown.returncode == 0 and "SUBTASK-PLAINTEXT-77" in shown.stdout and "PATH-PLAINTEXT" in shown.stdout
    listing = _run(["sessions", "--json"], tmp_path, sealed)
    assert "sealed-run" in listing.stdout
    for args in (["show", sid], ["sessions"], ["history", sid], ["state", sid]):
        blind = _run(args, tmp_path, {k: v for k, v in sealed.items() if k != "SAUCER_STORE_KEY"})
        assert "Traceback" not in blind.stderr, (args, blind.stderr[-800:])
        for marker in MARKERS:
            assert marker not in blind.stdout + blind.stderr, (args, marker)


def test_a_known_secret_never_reaches_a_stored_plan_or_an_export(tmp_path: Path) -> None:
    secret = "sk-test-" + "Q" * 32
    plan = {
        "task": "leaky",
        "steps": [
            {
                "subtask": "echo",
                "commands": [{"tool_name": "shell.run", "parameters": {"command": f"echo {secret} > /dev/null"}}],
            }
        ],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = {"SAUCER_STORE__URL": f"sqlite:///{tmp_path}/s.db", "OPENAI_API_KEY": secret}
    done = _run(["run", "--plan", "plan.json", "-w", "ws", "--yes"], tmp_path, env)
    assert done.returncode == 0, done.stderr[-2000:]
    with sqlite3.connect(tmp_path / "s.db") as conn:
        [(stored_plan,)] = conn.execute("SELECT plan FROM session_meta").fetchall()
    assert secret not in stored_plan and "***" in stored_plan
    sid = json.loads(_run(["sessions", "--json"], tmp_path, env).stdout)[0]["id"]
    exported = _run(["export", sid], tmp_path, env)
    assert exported.returncode == 0 and secret not in exported.stdout
    assert secret.encode() not in (tmp_path / "s.db").read_bytes()


# ------------------------------------------------------------------ rekey, killed

PATTERNS = ["vars.api_*", "REQUEST"]


def _opens_wholly(url: str, key: bytes, sid: str) -> bool:
    """Whether every sealed part of ``sid`` (meta, every event, every snapshot) opens with ``key``."""
    with SealedStore(open_store(url), Sealer(PATTERNS, key)) as store:
        try:
            info = store.session_info(sid)
            events = list(store.read(sid))
            snap = store.latest_snapshot(sid)
            assert info.meta.get("request") == f"request of {sid}"
            assert all(e.meta.get("note") == f"note {e.version}" for e in events if e.version > 1)
            assert snap is None or "sealed" not in snap.state
            return True
        except StoreKeyError:
            return False


def _sessions(url: str, key: str) -> list[str]:
    sids = [f"s{n}" for n in range(4)]
    with SealedStore(open_store(url), Sealer(PATTERNS, base64.b64decode(key))) as store:
        for n, sid in enumerate(sids):
            store.create_session(sid, meta={"task": "t", "request": f"request of {sid}"})
            ctx = Context.open(store, sid, snapshot_every=200)
            for i in range(1200 if n == 1 else 40):  # s1 holds more than one batch of 500 events
                ctx.update_vars({"api_value": f"secret {i}"})
                ctx.commit(meta={"note": f"note {ctx.version + 1}"})
            ctx.close()
    return sids


def test_rekey_killed_at_any_point_leaves_every_session_under_one_key(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    old_text, new_text = new_key(), new_key()
    old, new = base64.b64decode(old_text), base64.b64decode(new_text)
    sids = _sessions(url, old_text)
    (tmp_path / "new.key").write_text(new_text + "\n")
    env = {"SAUCER_STORE__URL": url, "SAUCER_STORE__ENCRYPT": json.dumps(PATTERNS), "SAUCER_STORE_KEY": old_text}
    # Killed while it pauses after a session (the fault point), then at moments chosen without it.
    for delay, pause in ((None, "30"), (0.9, ""), (1.3, ""), (1.7, "")):
        proc = subprocess.Popen(
            [*SAUCER, "store", "rekey", "--new-key-file", "new.key"],
            cwd=tmp_path,
            env=_env(env | {"SAUCER_REKEY_PAUSE": pause}),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            if delay is None:  # until the first session is under the new key: the process now sleeps
                deadline = time.monotonic() + 60
                while not any(_opens_wholly(url, new, sid) for sid in sids):
                    assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                    time.sleep(0.05)
            else:
                time.sleep(delay)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        under = {sid: (_opens_wholly(url, old, sid), _opens_wholly(url, new, sid)) for sid in sids}
        assert all(a != b for a, b in under.values()), under  # each session under exactly one key, wholly
        if delay is None:
            assert sum(b for _, b in under.values()) >= 1 and sum(a for a, _ in under.values()) >= 1
    finished = _run(["store", "rekey", "--new-key-file", "new.key"], tmp_path, env)
    assert finished.returncode == 0, finished.stderr
    assert all(_opens_wholly(url, new, sid) for sid in sids)
