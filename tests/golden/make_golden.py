"""Write golden stores: small stores made by the saucer checked out now, and the state each session must have.

The stores under ``tests/golden/<label>/`` were written by this script at
commit 7a841f6 of ``main`` (saucer 0.1.0; SQLite store schema 2, PostgreSQL
store schema 1), labels ``2026-11-saucer-0.1.0-sqlite-schema2`` and
``2026-11-saucer-0.1.0-postgres-schema1``. ``test_golden_stores.py`` opens
them with the current code, for ever, and compares every session's head, first
readable version, state at every readable version and history with
``expected.json`` (see ``golden_format.py`` and ``README.md`` here).

THE RULE: never regenerate an existing label; the files of a label are data
an older saucer wrote, kept so that newer code is held to reading them. When
a stored format changes, first check out the commit *before* the change, run
this script there to add a NEW label (it refuses to overwrite one), commit
it, then make the change (with its upcasters) keep every label green::

    git checkout <commit before the format change>
    make install
    SAUCER_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:5432/test \\
        .venv/bin/python tests/golden/make_golden.py            # --sqlite-only without a server

What it writes, per backend: one store with sessions that exercise what is
stored -- every durable ContextNames type, free-form vars, atomic operations
(incr, append, compare-and-set, a re-based concurrent incr), the durability
modes, attribution (author, round, step, meta), snapshots (every 3 events,
explicit, compressed ones), a fork, a fork of a fork and a fork at version 0,
pruned sessions (one with a fork taken before the prune), leases, a
quarantined record and a torn trailing record, and three sessions run by
``saucer run --plan`` with the built-in tools (finished, failed, and one killed
mid-step that can be resumed). For SQLite the store file itself is kept
(``store.db``); for PostgreSQL a plain-SQL ``pg_dump`` of saucer's schema
(``dump.sql``), which the test restores into a schema of its own.

Damaged records cannot be made through saucer's API (an SQLite or PostgreSQL
transaction does not tear), so they are made as a bad disk would: by
overwriting a payload with SQL. The quarantine that follows is saucer's own.

Before writing ``expected.json`` the script checks today's code against
itself: the state read at every version must equal the live state right after
that version was committed, and the prunes must not change any version that
stays readable. A mismatch is a bug of today's code: it is printed, and the
version is left unchecked (``null``) with a note, rather than enshrined.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import golden_format as gf
import golden_sessions as gs

from saucer import __version__
from saucer.context import Context
from saucer.store import EventStore, open_store
from saucer.store.upcast import FORMAT_VERSION

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
#: Fixed, so that the paths the engine stores (workspace, logs) are the same on every machine.
WORK = Path("/tmp/saucer-golden-work")


# ------------------------------------------------------------ reading back


def own_snapshots(store: EventStore, sid: str) -> list[int]:
    """Versions of the session's own readable snapshots."""
    out: list[int] = []
    upto: int | None = None
    while True:
        snap = store.latest_snapshot(sid, upto)
        if snap is None or snap.session_id != sid:
            return sorted(out)
        out.append(snap.version)
        if snap.version == 0:
            return sorted(out)
        upto = snap.version - 1


def read_all(store: EventStore) -> dict[str, dict[str, Any]]:
    """Every session as today's code reads it: each readable version's state, warnings, history."""
    out: dict[str, dict[str, Any]] = {}
    for info in store.sessions():
        sid = info.session_id
        states: dict[int, dict[str, Any]] = {}
        warned: dict[str, list[str]] = {}
        history: list[dict[str, Any]] = []
        for v in range(store.first_version(sid), info.version + 1):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ctx = Context.open(store, sid, at=v)
                states[v] = gf.flat_state(ctx)
                if v == info.version:
                    history = [e.to_dict() for e in ctx.history()]
            if caught:
                warned[str(v)] = [str(w.message) for w in caught]
        out[sid] = {"states": states, "warnings": warned, "history": history}
    return out


def check(rec: gs.Recorder, before_prune: dict[str, Any], final: dict[str, Any]) -> dict[str, dict[int, str]]:
    """Versions whose read is wrong (live state != read, or changed by a prune), with the reason."""
    wrong: dict[str, dict[int, str]] = {}
    for sid, versions in rec.live.items():
        for v, live in versions.items():
            read = final[sid]["states"].get(v)
            found = None if read is None else gf.difference(read, live)
            if found:
                wrong.setdefault(sid, {})[v] = f"reads differently from the live state: {found}"
    for sid, data in before_prune.items():
        for v, before in data["states"].items():
            read = final[sid]["states"].get(v)
            found = None if read is None else gf.difference(read, before)
            if found and v not in wrong.get(sid, {}):
                wrong.setdefault(sid, {})[v] = f"changed by a prune: {found}"
    return wrong


def expected_file(
    store: EventStore,
    final: dict[str, Any],
    wrong: dict[str, dict[int, str]],
    engine: dict[str, Any],
    leases: dict[str, int],
    info: dict[str, Any],
) -> dict[str, Any]:
    """The content of ``expected.json`` (see ``golden_format``)."""
    sessions = []
    for row in store.sessions():
        sid = row.session_id
        data = final[sid]
        states: dict[int, Any] = dict(data["states"])
        notes = []
        for v, reason in sorted(wrong.get(sid, {}).items()):
            states[v] = None
            notes.append(f"v{v} is not checked: with the code that wrote this store it {reason}")
        sessions.append(
            {
                "session_id": sid,
                "head": row.version,
                "first_version": store.first_version(sid),
                "parent_id": row.parent_id,
                "parent_version": row.parent_version,
                "created_at": row.created_at,
                "updated_at": row.updated_at,
                "meta": row.meta,
                "snapshots": own_snapshots(store, sid),
                "lease_token": leases.get(sid),
                "engine": engine.get(sid),
                "warnings": data["warnings"],
                "notes": notes,
                "states": gf.compress(states),
                "history": data["history"],
            }
        )
    return {"expected_format": gf.EXPECTED_FORMAT, **info, "sessions": sessions}


def write_and_read(
    store: EventStore, url: str, work: Path, damage: gs.Damage
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Write every session; return the final reads, the wrong versions and the engine sessions."""
    rec, engine = gs.write_all(store, url, work, damage)
    before = read_all(store)
    gs.prune_now(store)
    final = read_all(store)
    return final, check(rec, before, final), engine


# ------------------------------------------------------------ backends


def make_sqlite(target: Path, info: dict[str, Any]) -> None:
    from saucer.store.sqlite import SQLiteStore

    work = WORK / "sqlite"
    db = work / "store.db"
    url = f"sqlite:///{db}"

    def damage(sid: str, version: int) -> None:
        with sqlite3.connect(db) as conn:
            n = sum(
                conn.execute(
                    f"UPDATE {t} SET payload = ? WHERE session_id = ? AND version = ?", (gs.TORN, sid, version)
                ).rowcount
                for t in ("events", "events_recent")
            )
        conn.close()
        assert n == 1, n

    work.mkdir(parents=True)
    store = SQLiteStore(db)
    store.fold_every = 8  # a documented knob: older events in ``events``, the newest in ``events_recent``
    final, wrong, engine = write_and_read(store, url, work, damage)
    leases = dict(_sqlite_rows(db, "SELECT session_id, token FROM leases"))
    expected = expected_file(store, final, wrong, engine, leases, info)
    store.close()
    tables = {
        t: _sqlite_rows(db, f"SELECT count(*) FROM {t}")[0][0]
        for t in ("events", "events_recent", "snapshots", "leases")
    }
    print(f"  rows: {tables}")
    assert all(tables.values()), f"every table should hold rows: {tables}"
    for extra in ("-wal", "-shm"):
        assert not Path(f"{db}{extra}").exists(), f"{db}{extra} left behind: a connection is still open"
    target.mkdir(parents=True)
    shutil.copyfile(db, target / "store.db")
    expected.update(
        store_file="store.db", store_sha256=_sha256(target / "store.db"), sqlite_version=sqlite3.sqlite_version
    )
    gf.dump(expected, target / gf.EXPECTED_FILE)
    _report(target, wrong)


def _sqlite_rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def make_postgres(target: Path, info: dict[str, Any], base_url: str) -> None:
    import psycopg
    from psycopg import sql

    work = WORK / "postgres"
    schema = f"saucer_golden_{uuid.uuid4().hex[:8]}"
    check_schema = f"saucer_restore_check_{uuid.uuid4().hex[:8]}"
    ident = sql.Identifier(schema)

    def damage(sid: str, version: int) -> None:
        with psycopg.connect(base_url, autocommit=True) as conn:
            n = conn.execute(
                sql.SQL("UPDATE {}.events SET payload = %s WHERE session_id = %s AND version = %s").format(ident),
                (gs.TORN, sid, version),
            ).rowcount
        assert n == 1, n

    work.mkdir(parents=True)
    try:
        store = open_store(gf.with_schema(base_url, schema))
        final, wrong, engine = write_and_read(store, gf.with_schema(base_url, schema), work, damage)
        with psycopg.connect(base_url, autocommit=True) as conn:
            leases = dict(conn.execute(sql.SQL("SELECT session_id, token FROM {}.leases").format(ident)).fetchall())
            server = conn.execute("SHOW server_version").fetchone()[0]
        expected = expected_file(store, final, wrong, engine, leases, info)
        store.close()
        dump = _pg_dump(base_url, schema)
        # The test restores the dump this way: check here that it gives back what was written.
        gf.restore_dump(base_url, dump, schema, check_schema)
        with open_store(gf.with_schema(base_url, check_schema)) as restored:
            again = read_all(restored)
        for sid, data in final.items():
            for key in ("states", "history", "warnings"):
                found = gf.difference(gf.json_roundtrip(again[sid][key]), gf.json_roundtrip(data[key]))
                assert found is None, f"the restored dump reads {sid!r} differently: {key} {found}"
        target.mkdir(parents=True)
        (target / "dump.sql").write_text(dump, encoding="utf-8")
    finally:
        with psycopg.connect(base_url, autocommit=True) as conn:
            for name in (schema, check_schema):
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    expected.update(
        store_file="dump.sql", store_sha256=_sha256(target / "dump.sql"), dump_schema=schema, postgres_version=server
    )
    gf.dump(expected, target / gf.EXPECTED_FILE)
    _report(target, wrong)


def _pg_dump(base_url: str, schema: str) -> str:
    """A plain-SQL dump of the schema that any SQL client can run (``golden_format.restore_dump``).

    pg_dump's session settings (``SET ...``, ``set_config``) and comments are
    left out: they vary with pg_dump's version and are not needed to restore.
    """
    from saucer.store.postgres import split_url

    conninfo, _ = split_url(base_url)
    out = subprocess.run(
        [
            "pg_dump",
            "--dbname",
            conninfo,
            "--schema",
            schema,
            "--column-inserts",
            "--no-owner",
            "--no-privileges",
            "--no-comments",
            "--no-publications",
            "--no-subscriptions",
            "--no-security-labels",
            "--no-tablespaces",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    kept = [
        line
        for line in out.splitlines()
        if line and not line.startswith(("--", "SET ", "SELECT pg_catalog.set_config(", "\\"))
    ]
    version = subprocess.run(["pg_dump", "--version"], capture_output=True, text=True).stdout.strip()
    return (
        f"-- saucer golden store: {version} of saucer's schema (renamed on restore), session settings removed\n"
        + "\n".join(kept)
        + "\n"
    )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _report(target: Path, wrong: dict[str, dict[int, str]]) -> None:
    size = sum(p.stat().st_size for p in target.iterdir())
    print(f"wrote {target.relative_to(REPO)} ({size / 1024:.0f} KB)")
    for sid, versions in wrong.items():
        for v, reason in sorted(versions.items()):
            print(f"  BUG in today's code: session {sid!r} v{v} {reason}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--prefix", default=time.strftime("%Y-%m"), help="label prefix (default: this year-month)")
    parser.add_argument("--sqlite-only", action="store_true", help="skip PostgreSQL")
    parser.add_argument(
        "--postgres-url", default=os.environ.get("SAUCER_TEST_POSTGRES_URL"), help="default: $SAUCER_TEST_POSTGRES_URL"
    )
    args = parser.parse_args()
    from saucer.store.postgres import SCHEMA_VERSION as PG_SCHEMA
    from saucer.store.sqlite import SCHEMA_VERSION as SQLITE_SCHEMA

    targets = {"sqlite": HERE / f"{args.prefix}-saucer-{__version__}-sqlite-schema{SQLITE_SCHEMA}"}
    if not args.sqlite_only:
        if not args.postgres_url:
            raise SystemExit("set SAUCER_TEST_POSTGRES_URL (or --postgres-url), or pass --sqlite-only")
        targets["postgres"] = HERE / f"{args.prefix}-saucer-{__version__}-postgres-schema{PG_SCHEMA}"
    for target in targets.values():
        if target.exists():
            raise SystemExit(f"{target} exists: never regenerate a label (see README.md); use another --prefix")
    info = {
        "written_by": {
            "commit": _git_commit(),
            "saucer": __version__,
            "record_format": FORMAT_VERSION,
            "python": platform.python_version(),
            "script": "tests/golden/make_golden.py",
            "date": time.strftime("%Y-%m-%d"),
        }
    }
    shutil.rmtree(WORK, ignore_errors=True)
    try:
        for backend, target in targets.items():
            print(f"{backend}: writing {target.name}")
            make = make_sqlite if backend == "sqlite" else lambda t, i: make_postgres(t, i, args.postgres_url)
            make(target, {**info, "label": target.name, "backend": backend})
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


def _git_commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "src"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (with uncommitted changes in src/)" if dirty else "")


if __name__ == "__main__":
    main()
