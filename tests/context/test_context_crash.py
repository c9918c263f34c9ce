"""Crashes and concurrent writers on one SQLite file.

- A child process commits multi-change steps in a loop and acknowledges each
  committed version; the parent SIGKILLs it at random moments, dozens of
  times. Each reopen must be exactly a committed prefix (no half step) that
  holds every acknowledged version.
- Two processes, and several threads, increment the same var with their own
  Contexts: nothing is lost.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from saucer.context import Context, ContextNames
from saucer.store import open_store

STEPPER = r"""
import os, sys
from saucer.context import Context, ContextNames

url, sid, ack_path = sys.argv[1:4]
ctx = Context.open(url, sid, snapshot_every=7)  # frequent snapshots: kills land in those too
ack = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
while True:
    i = ctx.version + 1
    with ctx.step(author="agent:stepper", step=i):
        ctx.update_vars(set={"a": i, "b": i})
        ctx.append("l", i)
        ctx.incr(ContextNames.SESSION_STEP)
        ctx.set(ContextNames.REQUEST, "x" * (i % 50))
    os.write(ack, b"%d\n" % ctx.version)  # acknowledged: commit() has returned
"""

ASYNC_STEPPER = r"""
import asyncio, os, sys
from saucer.context import Context, ContextNames
from saucer.store.sqlite import SQLiteStore

path, ack_path, sessions = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = SQLiteStore(path)
store.fold_every = 5  # recent events move into the events table often: kills land in those moves too
ack = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

async def session(sid):
    ctx = Context.open(store, sid, snapshot_every=7)
    while True:
        i = ctx.version + 1
        ctx.update_vars(set={"a": i, "b": i})
        ctx.append("l", i)
        ctx.incr(ContextNames.SESSION_STEP)
        ctx.set(ContextNames.REQUEST, "x" * (i % 50))
        await ctx.acommit_step(author="agent:stepper", step=i)
        os.write(ack, b"%s %d\n" % (sid.encode(), ctx.version))  # acknowledged: acommit has returned

async def main():
    await asyncio.gather(*(session(f"s{k}") for k in range(sessions)))

asyncio.run(main())
"""

INCREMENTER = r"""
import random, sys, time
from saucer.context import Context

url, sid, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ctx = Context.open(url, sid)
print("ready", flush=True)
sys.stdin.readline()  # start together
interleaved = 0
for _ in range(n):
    before = ctx.version
    ctx.incr("n")
    if ctx.commit() > before + 1:
        interleaved += 1  # the other process committed in between: this one was re-based
    time.sleep(random.random() / 1000)  # some work between steps: lets the other writer in
ctx.close()
print(interleaved, flush=True)
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _acked(path: Path) -> list[int]:
    if not path.exists():
        return []
    # a kill can cut the last line short: only whole lines were acknowledged
    text = path.read_text()
    return [int(line) for line in text.split("\n")[:-1] if line]


def _check_committed_prefix(url: str, sid: str) -> int:
    ctx = Context.open(url, sid, durability="exit")
    v = ctx.version
    assert ctx.get_var("a") == (v or None) and ctx.get_var("b") == (v or None), "half a step"
    assert ctx.get_var("l") == (list(range(1, v + 1)) or None)
    assert ctx.get(ContextNames.SESSION_STEP) == v
    assert ctx.get(ContextNames.REQUEST) == "x" * (v % 50)
    history = ctx.history()
    assert [e.version for e in history] == list(range(1, v + 1))
    assert all(len(e.ops) == 5 for e in history)
    ctx._work.closed = True  # noqa: SLF001  (read only: leave the log exactly as the crash left it)
    ctx.store.close()  # type: ignore[union-attr]
    return v


def test_sigkill_at_random_moments_leaves_a_committed_prefix(tmp_path: Path) -> None:
    db = tmp_path / "crash.db"
    url = f"sqlite:///{db}"
    ack = tmp_path / "acks"
    script = tmp_path / "stepper.py"
    script.write_text(STEPPER)
    rng = random.Random(20261122)
    trials = 30
    last = 0
    for trial in range(trials):
        acked_before = len(_acked(ack))
        proc = subprocess.Popen([sys.executable, str(script), url, "s", str(ack)], env=_env(), stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while len(_acked(ack)) == acked_before:  # wait until it is committing
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the child never committed"
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.04))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.stderr:
            proc.stderr.close()
        acked = _acked(ack)
        version = _check_committed_prefix(url, "s")
        assert acked and max(acked) <= version, (
            f"trial {trial}: acknowledged v{max(acked)} lost (reopened at v{version})"
        )
        assert version >= last
        last = version
    assert last > trials  # the children really committed across all the trials


def test_sigkill_of_sessions_committing_from_one_event_loop_leaves_committed_prefixes(tmp_path: Path) -> None:
    """Many sessions of one loop share transactions (group commit): a kill never splits a step or loses an ack."""
    db = tmp_path / "crash.db"
    ack = tmp_path / "acks"
    script = tmp_path / "async_stepper.py"
    script.write_text(ASYNC_STEPPER)
    rng = random.Random(1122)
    sessions, trials = 6, 12
    last = dict.fromkeys((f"s{k}" for k in range(sessions)), 0)

    def acked() -> dict[str, int]:
        best: dict[str, int] = {}
        text = ack.read_text() if ack.exists() else ""
        for line in text.split("\n")[:-1]:  # a kill can cut the last line short
            sid, version = line.split()
            best[sid] = max(best.get(sid, 0), int(version))
        return best

    for trial in range(trials):
        before = sum(acked().values())
        proc = subprocess.Popen(
            [sys.executable, str(script), str(db), str(ack), str(sessions)], env=_env(), stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + 20
        while sum(acked().values()) == before:  # wait until it is committing
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the child never committed"
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.05))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.stderr:
            proc.stderr.close()
        best = acked()
        for sid in last:
            version = _check_committed_prefix(f"sqlite:///{db}", sid)
            assert best.get(sid, 0) <= version, (
                f"trial {trial}: {sid} acknowledged v{best[sid]}, reopened at v{version}"
            )
            assert version >= last[sid]
            last[sid] = version
    assert sum(last.values()) > trials * sessions


def test_two_processes_incrementing_the_same_var_lose_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'two.db'}"
    Context.open(url, "s").close()  # create it before the race
    script = tmp_path / "incr.py"
    script.write_text(INCREMENTER)
    n = 300
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), url, "s", str(n)],
            env=_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    interleaved = 0
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        interleaved += int(out.split()[-1])
    assert interleaved >= 5  # the two really raced: many commits were re-based
    ctx = Context.open(url, "s")
    assert ctx.get_var("n") == 2 * n
    assert ctx.version == 2 * n  # one event per increment
    ctx.close()


@pytest.mark.parametrize("shared_store", [False, True], ids=["own-connections", "one-store"])
def test_threads_incrementing_the_same_var_lose_nothing(tmp_path: Path, shared_store: bool) -> None:
    url = f"sqlite:///{tmp_path / 'threads.db'}"
    store = open_store(url)
    Context.open(store, "s").close()
    threads_n, n = 4, 100
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads_n)

    def work() -> None:
        try:
            ctx = Context.open(store if shared_store else url, "s")
            barrier.wait()
            for _i in range(n):
                ctx.incr("n")
                ctx.append("who", threading.get_ident() % 1000)
                ctx.incr(ContextNames.SESSION_STEP)
                ctx.commit()
            ctx.close()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    ctx = Context.open(store, "s")
    assert ctx.get_var("n") == threads_n * n
    assert len(ctx.get_var("who")) == threads_n * n
    assert ctx.get(ContextNames.SESSION_STEP) == threads_n * n
    ctx.close()
    store.close()


def test_threads_with_strict_durability_on_a_memory_store(tmp_path: Path) -> None:
    store = open_store("memory://")
    threads_n, n = 4, 200

    def work() -> None:
        ctx = Context.open(store, "s", durability="strict")
        for _ in range(n):
            ctx.incr("n")

    threads = [threading.Thread(target=work) for _ in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert Context.open(store, "s").get_var("n") == threads_n * n
