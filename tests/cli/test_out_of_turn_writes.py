"""Out-of-turn writes into a running session, with real processes (issue 26).

``saucer run`` runs a follower plan of eight one-second steps while another
process commits 40 set/delete writes into the same session: the run is not
harmed (exit 0, ``finished``), every step's command ran once and its step is
committed, and every write is in the final state and in ``saucer history`` in
the order it was made. The same on PostgreSQL, the writer on a connection of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SAUCER = [sys.executable, "-m", "saucer"]
POSTGRES_ENV = "SAUCER_TEST_POSTGRES_URL"
STEPS = 8
WRITES = 40

#: The writer: waits for the session's first commit, then makes WRITES writes, one commit each.
_WRITER = """
import sys, time
from saucer.context import Context
from saucer.store import open_store
url, sid, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = open_store(url)
deadline = time.monotonic() + 60
while not (store.exists(sid) and store.head(sid) >= 2):
    assert time.monotonic() < deadline, "the run never started"
    time.sleep(0.05)
ctx = Context.open(store, sid, author="human:writer", create=False, serialise=True)
for i in range(n):
    delete = [f"k{i - 3}"] if i % 4 == 3 else []
    ctx.update_vars(set={f"k{i}": i, "seq": i}, delete=delete)
    print(ctx.commit(), flush=True)
    time.sleep(0.15)
ctx.close()
store.close()
"""


def _writes(n: int) -> list[tuple[dict[str, Any], list[str]]]:
    return [({f"k{i}": i, "seq": i}, [f"k{i - 3}"] if i % 4 == 3 else []) for i in range(n)]


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/oob.db"
        return
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{POSTGRES_ENV} is not set under CI=true")
        pytest.skip(f"set {POSTGRES_ENV}=postgresql://postgres@127.0.0.1:5432/test to run the PostgreSQL leg")
    import psycopg
    from psycopg import sql

    schema = "oob_" + uuid.uuid4().hex[:12]
    try:
        yield f"{url}{'&' if '?' in url else '?'}schema={schema}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def test_a_running_session_takes_40_out_of_turn_writes_unharmed(tmp_path: Path, store_url: str) -> None:
    plan = {
        "task": "oob",
        "steps": [
            {
                "subtask": f"step {i}",
                "commands": [{"tool_name": "shell.run", "parameters": {"command": f"sleep 1 && echo {i} >> ran.txt"}}],
            }
            for i in range(1, STEPS + 1)
        ],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")}
    run = subprocess.Popen(
        [*SAUCER, "run", "--plan", "plan.json", "--session-id", "oob", "--yes", "--store", store_url],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, store_url, "oob", str(WRITES)],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        w_out, w_err = writer.communicate(timeout=90)
        r_out, r_err = run.communicate(timeout=90)
    finally:
        for proc in (run, writer):
            if proc.poll() is None:
                proc.kill()
    assert writer.returncode == 0, w_err
    assert run.returncode == 0, r_out + r_err
    assert "session oob finished" in r_out
    # Every step's command ran exactly once.
    assert (tmp_path / "ran.txt").read_text().split() == [str(i) for i in range(1, STEPS + 1)]

    from saucer.context import Context
    from saucer.store import open_store

    store = open_store(store_url)
    try:
        events = list(store.read("oob"))
        steps = [e for e in events if e.meta.get("kind") == "step"]
        assert [e.step for e in steps] == list(range(1, STEPS + 1))
        assert all(e.meta["results"][0]["status"] == "success" for e in steps), [e.meta.get("results") for e in steps]
        # The writes overlapped the steps: some step commits were ordered after them.
        serialised = [e for e in steps if "serialised" in e.meta]
        assert serialised, "no step met a concurrent write"
        for e in serialised:
            record = e.meta["serialised"]
            assert record["ordered_after"] and record["ordered_after"][-1] == e.version - 1
            assert record["based_on"] == record["ordered_after"][0] - 1
        assert events[-1].meta["kind"] == "session_end" and events[-1].meta["session_status"] == "finished"
        # Every write, in the order made, one event each.
        written = [e for e in events if e.author == "human:writer"]
        assert [e.version for e in written] == [int(v) for v in w_out.split()]
        expected_ops = [
            [{"op": "delete", "var": k} for k in delete]
            + [{"op": "set", "var": k, "value": v} for k, v in sets.items()]
            for sets, delete in _writes(WRITES)
        ]
        assert [e.ops for e in written] == expected_ops
        # ... and in the final state.
        state: dict[str, Any] = {}
        for sets, delete in _writes(WRITES):
            for k in delete:
                state.pop(k, None)
            state.update(sets)
        final = Context.open(store, "oob", create=False)
        assert dict(final.vars) == state
        final.close()
    finally:
        store.close()
    history = subprocess.run(
        [*SAUCER, "history", "oob", "--json", "--store", store_url],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert history.returncode == 0, history.stderr
    shown = [e for e in json.loads(history.stdout) if e["author"] == "human:writer"]
    assert [e["ops"] for e in shown] == expected_ops
