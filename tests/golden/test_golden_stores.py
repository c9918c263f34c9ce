"""Golden stores: stores written by earlier saucer releases stay readable, for ever (ARCHITECTURE invariant 13).

Each folder here holds a store written by an older saucer (``store.db``, or a
PostgreSQL ``dump.sql``) and ``expected.json``: for every session its head,
first readable version, state at every readable version, history and
snapshots, as that saucer read them (see ``README.md`` and ``golden_format``).
These tests open each store with the current code -- a copy of the SQLite
file, or the dump restored into a fresh schema, never the committed file --
and require the same answers. A format change must keep them green through
upcasters; it never edits these files.

PostgreSQL stores need ``SAUCER_TEST_POSTGRES_URL`` (under ``CI=true`` a
missing server fails, elsewhere those tests skip).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import golden_format as gf
import pytest

from saucer.context import Context, ContextNames
from saucer.context import names as names_module
from saucer.store import EventStore, VersionPrunedError, open_store

HERE = Path(__file__).resolve().parent
LABELS = sorted(d for d in HERE.iterdir() if (d / gf.EXPECTED_FILE).is_file())
POSTGRES_ENV = "SAUCER_TEST_POSTGRES_URL"
POSTGRES_HINT = f"set {POSTGRES_ENV}=postgresql://postgres@127.0.0.1:5432/test to run the PostgreSQL tests"


@cache
def expected_of(label: Path) -> dict[str, Any]:
    return gf.load(label / gf.EXPECTED_FILE)


@dataclass
class Golden:
    """One golden store, opened by the current code on a copy."""

    url: str
    expected: dict[str, Any]
    store: EventStore

    @property
    def sessions(self) -> dict[str, dict[str, Any]]:
        return {s["session_id"]: s for s in self.expected["sessions"]}


@pytest.fixture(params=LABELS, ids=lambda label: label.name)
def golden(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Golden]:
    """The store of a label: a copy of the SQLite file, or the dump restored into a schema of its own."""
    label: Path = request.param
    expected = expected_of(label)
    if expected["backend"] == "sqlite":
        copy = tmp_path / "store.db"
        shutil.copyfile(label / expected["store_file"], copy)
        url = f"sqlite:///{copy}"
        with open_store(url) as store:
            yield Golden(url, expected, store)
        return
    base = os.environ.get(POSTGRES_ENV)
    if not base:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{POSTGRES_ENV} is not set under CI=true; {POSTGRES_HINT}")
        pytest.skip(POSTGRES_HINT)
    import psycopg
    from psycopg import sql

    schema = "t_golden_" + uuid.uuid4().hex[:12]
    try:
        dump = (label / expected["store_file"]).read_text(encoding="utf-8")
        gf.restore_dump(base, dump, expected["dump_schema"], schema)
        url = gf.with_schema(base, schema)
        with open_store(url) as store:
            yield Golden(url, expected, store)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


# ------------------------------------------------------------ helpers


def _new_name_default(key: str, value: Any) -> bool:
    """A ``names.X`` entry the old saucer did not have, holding the new name's default."""
    member = ContextNames.__members__.get(key.removeprefix("names."))
    if not key.startswith("names.") or member is None:
        return False
    default = member.default_value if member.durable else None
    return gf.difference(value, gf.encode(default)) is None


def _through_registry(ctx: Context, expected: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """``expected`` with the names renamed since the label was written under their new
    names, and those retired since taken out (they must be in ``ctx.retired``), through
    the registry the code reads with (``names.RENAMED`` / ``RETIRED``)."""
    mapped: dict[str, Any] = {}
    for key, value in expected.items():
        name = key.removeprefix("names.")
        if not key.startswith("names.") or name in ContextNames.__members__ and name not in names_module.RETIRED:
            mapped[key] = value
            continue
        current = names_module.stored_name(name)
        if current is None:
            unset = value in (None, "", 0, [], {}, {"$items": []})  # the old name's default: never written
            if name not in ctx.retired and not unset:
                return mapped, f"retired name {name} is not kept in Context.retired"
            continue
        mapped[f"names.{current}"] = value
    return mapped, None


def _state_problem(ctx: Context, expected: dict[str, Any]) -> str | None:
    expected, problem = _through_registry(ctx, expected)
    if problem:
        return problem
    actual = gf.flat_state(ctx)
    for key in actual.keys() - expected.keys():
        if _new_name_default(key, actual[key]):
            del actual[key]  # a name added since: it reads as its default
    return gf.difference(actual, expected)


def _first_version(s: dict[str, Any]) -> int:
    """The session's first readable version as the current code must report it.

    The code that wrote a label could lose versions of a fork to a prune of its
    parent (its ``null`` states, "changed by a prune" in its notes) and still
    call them readable. Since issue 12 those versions, and every one below them,
    are refused with ``VersionPrunedError`` instead of reading as an empty state.
    """
    lost = [
        version
        for version, state in gf.expand(s["states"])
        if state is None
        and any(note.startswith(f"v{version} ") and "by a prune" in note for note in s.get("notes", []))
    ]
    return max([s["first_version"], *(version + 1 for version in lost)])


def _check_states(g: Golden) -> list[str]:
    """Every session's state at every readable version, against the expected file."""
    problems: list[str] = []
    for sid, s in g.sessions.items():
        warned: set[str] = set()
        first = _first_version(s)
        for version, state in gf.expand(s["states"]):
            if version < first:
                try:
                    Context.open(g.store, sid, at=version)
                    problems.append(f"{sid!r}: v{version} opens, but its history below v{first} was lost to a prune")
                except VersionPrunedError as exc:
                    if exc.first != first:
                        problems.append(f"{sid!r}: v{version} is refused naming v{exc.first}, not v{first}")
                continue
            if state is None:
                continue  # see the session's notes: a bug of the code that wrote the store
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ctx = Context.open(g.store, sid, at=version)
                problem = _state_problem(ctx, state)
            if problem:
                problems.append(f"{sid!r} at v{version}: {problem}")
            if caught:
                warned.add(str(version))
        if warned != set(s["warnings"]):
            problems.append(f"{sid!r}: warnings at versions {sorted(warned)}, expected at {sorted(s['warnings'])}")
        for outside in (first - 1, s["head"] + 1):
            if outside >= 0:
                try:
                    Context.open(g.store, sid, at=outside)
                    problems.append(f"{sid!r}: v{outside} opens, but the session has versions {first}..{s['head']}")
                except ValueError:
                    pass
    return problems


def _saucer(*args: str, cwd: Path) -> subprocess.Popen[str]:
    """Start the ``saucer`` command of this environment, with nothing from the caller's settings (and no log files)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")}
    clean.update(COLUMNS="10000", SAUCER_LOGS__ENABLED="false")
    exe = str(Path(sys.executable).with_name("saucer"))
    return subprocess.Popen(
        [exe, *args],
        cwd=cwd,
        env=clean,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def _json_names(state: dict[str, Any]) -> dict[str, Any]:
    """What ``saucer state --json`` prints as ``names`` for an expected flat state."""

    def plain(value: Any) -> Any:
        if isinstance(value, list):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            if set(value) == {"$enum"}:
                cls, member = value["$enum"].split(".")
                return getattr(names_module, cls)[member].value
            if set(value) == {"$items"}:
                return {str(plain(k)): plain(v) for k, v in value["$items"]}
            return {k: plain(v) for k, v in value.items()}
        return value

    return {k.removeprefix("names."): plain(v) for k, v in state.items() if k.startswith("names.")}


def _engine(g: Golden, kind: str) -> dict[str, Any]:
    (session,) = [s for s in g.sessions.values() if (s["engine"] or {}).get("kind") == kind]
    return session


# ------------------------------------------------------------ tests


def test_there_are_golden_stores_of_each_backend() -> None:
    assert {expected_of(label)["backend"] for label in LABELS} >= {"sqlite", "postgres"}


@pytest.mark.parametrize("label", LABELS, ids=lambda label: label.name)
def test_the_committed_files_are_unchanged(label: Path) -> None:
    expected = expected_of(label)
    digest = hashlib.sha256((label / expected["store_file"]).read_bytes()).hexdigest()
    assert digest == expected["store_sha256"], (
        f"{label.name}/{expected['store_file']} was modified: never regenerate a label"
    )


def test_sessions_and_their_rows(golden: Golden) -> None:
    infos = {i.session_id: i for i in golden.store.sessions()}
    assert sorted(infos) == sorted(golden.sessions)
    for sid, s in golden.sessions.items():
        info = infos[sid]
        row = {
            "head": info.version,
            "first_version": golden.store.first_version(sid),
            "parent_id": info.parent_id,
            "parent_version": info.parent_version,
            "created_at": info.created_at,
            "updated_at": info.updated_at,
            "meta": gf.json_roundtrip(info.meta),
        }
        expected = {**{k: s[k] for k in row}, "first_version": _first_version(s)}
        assert gf.difference(row, expected) is None, f"{sid!r}: {gf.difference(row, expected)}"


def test_state_at_every_version(golden: Golden) -> None:
    problems = _check_states(golden)
    assert not problems, "\n".join(problems)


def test_state_at_every_version_from_the_events_alone(golden: Golden) -> None:
    for sid in golden.sessions:
        golden.store.prune_snapshots(sid, 0)
    for sid in golden.sessions:
        assert golden.store.latest_snapshot(sid) is None
    problems = _check_states(golden)
    assert not problems, "\n".join(problems)


def test_history_and_attribution(golden: Golden) -> None:
    for sid, s in golden.sessions.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a torn trailing record is skipped with a warning
            events = Context.open(golden.store, sid, at=s["head"]).history()
        found = gf.difference(gf.json_roundtrip([e.to_dict() for e in events]), s["history"])
        assert found is None, f"history of {sid!r}: {found}"


def test_snapshots_read_back(golden: Golden) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for sid, s in golden.sessions.items():
            for version in s["snapshots"]:
                snap = golden.store.latest_snapshot(sid, version)
                assert snap is not None and (snap.session_id, snap.version) == (sid, version)


def test_leases_are_taken_over_with_the_next_token(golden: Golden) -> None:
    leased = {sid: s["lease_token"] for sid, s in golden.sessions.items() if s["lease_token"] is not None}
    assert leased
    for sid, token in leased.items():
        assert golden.store.acquire_lease(sid, "golden-test", ttl=5).token == token + 1


def test_engine_session_through_the_cli(golden: Golden, tmp_path: Path) -> None:
    """``saucer state``/``history`` print the stored values; ``saucer resume`` reports the session's stored result."""
    s = _engine(golden, "finished")
    sid = s["session_id"]
    # At once: each is a new interpreter (resume only takes the lease of a session that ended).
    procs = [
        _saucer(*args, sid, "--store", golden.url, cwd=tmp_path)
        for args in (("state", "--json"), ("history", "--json"), ("resume",))
    ]
    (state_code, state_out, state_err), (history_code, history_out, history_err), (code, out, err) = map(_finish, procs)
    assert state_code == 0 and history_code == 0, state_err + history_err
    printed = json.loads(state_out)
    assert (printed["session_id"], printed["version"]) == (sid, s["head"])
    expected = dict(gf.expand(s["states"]))[s["head"]]
    want = _json_names(expected)
    assert {k: printed["names"].get(k) for k in want} == gf.json_roundtrip(want)
    assert printed["vars"] == gf.json_roundtrip({k[5:]: v for k, v in expected.items() if k.startswith("vars.")})
    found = gf.difference(json.loads(history_out), s["history"])
    assert found is None, f"saucer history {sid}: {found}"
    summary = s["history"][-1]["meta"]["summary"]
    assert code == 0, err
    assert f"session {sid}: {summary['status']} ({summary['reason']})" in out


@pytest.mark.slow  # it runs the built-in MCP tool servers: ~3 s
def test_a_session_interrupted_mid_step_resumes_at_its_first_uncommitted_step(golden: Golden, tmp_path: Path) -> None:
    s = _engine(golden, "interrupted")
    sid, plan = s["session_id"], s["engine"]
    workspace = tmp_path / "ws"
    workspace.mkdir()
    code, out, err = _finish(
        _saucer("resume", sid, "--store", golden.url, "--workspace", str(workspace), "--yes", cwd=tmp_path)
    )
    assert code == 0, out + err
    assert f"session {sid}: finished" in out
    # Step 1 was committed before the crash: it is not run again. Steps 2 and 3 run now.
    assert not (workspace / "first.txt").exists()
    assert (workspace / "last.txt").read_text() == "3\n"
    events = Context.open(golden.store, sid, at=golden.store.head(sid)).history()
    new = [e for e in events if e.version > s["head"]]
    assert new[0].meta["kind"] == "session_resume" and new[-1].meta["session_status"] == "finished"
    final = Context.open(golden.store, sid)
    assert final.get(ContextNames.SESSION_STEP) == plan["plan_steps"]
    assert [p["subtask"] for p in final.get(ContextNames.PREVIOUS_SUBTASKS)] == plan["subtasks"]
    final.close()
    # What was there before the resume reads as it did.
    for version, state in gf.expand(s["states"]):
        assert _state_problem(Context.open(golden.store, sid, at=version), state) is None
