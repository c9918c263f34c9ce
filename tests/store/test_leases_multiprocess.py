"""Session ownership across real processes: one winner, takeover after SIGKILL, fencing.

Each worker is a separate Python process (``lease_worker.py``) on the same
store. Runs on SQLite and on PostgreSQL (when ``SAUCER_TEST_POSTGRES_URL`` is set).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from saucer.context import Context
from saucer.store import open_store

WORKER = Path(__file__).with_name("lease_worker.py")
TTL = 1.0

pytestmark = pytest.mark.parametrize("store_url", ["sqlite", "postgresql"], indirect=True)


class Worker:
    """A worker process whose output lines are collected as they come."""

    def __init__(self, url: str, session: str, owner: str, *args: str) -> None:
        self.owner = owner
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), url, session, owner, "--ttl", str(TTL), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append((time.monotonic(), line.strip()))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def has(self, prefix: str) -> bool:
        with self._cond:
            return any(line.startswith(prefix) for _, line in self.lines)

    def wait_for(self, prefix: str, timeout: float = 20.0) -> tuple[float, str]:
        """The time and text of the first line starting with ``prefix``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for stamp, line in self.lines:
                    if line.startswith(prefix):
                        return stamp, line
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"{self.owner}: no {prefix!r} line; output: {self.output()}")
                self._cond.wait(min(left, 0.1))

    def finish(self, timeout: float = 20.0) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(5)
        return code

    def output(self) -> str:
        err = ""
        if self.proc.poll() is not None and self.proc.stderr is not None:
            err = self.proc.stderr.read()
        return " | ".join(line for _, line in self.lines) + (f"\nstderr: {err}" if err else "")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def _final(url: str, session: str) -> tuple[Context, list]:
    ctx = Context.open(url, session, create=False)
    return ctx, ctx.history()


def test_one_worker_wins_and_the_other_takes_over_after_sigkill(store_url: str) -> None:
    session = "race"
    with open_store(store_url) as store:
        store.create_session(session)
    steps = 30
    a = Worker(store_url, session, "worker-a", "--steps", str(steps), "--delay", "0.05", "--wait")
    b = Worker(store_url, session, "worker-b", "--steps", str(steps), "--delay", "0.05", "--wait")
    try:
        # Both race for the lease: exactly one wins, the other is told who holds it.
        deadline = time.monotonic() + 20
        while not (a.has("LEASED") or b.has("LEASED")):
            assert time.monotonic() < deadline, a.output() + b.output()
            time.sleep(0.01)
        winner, loser = (a, b) if a.has("LEASED") else (b, a)
        _, held = loser.wait_for("HELD")
        assert held == f"HELD {winner.owner}"
        assert winner.wait_for("LEASED")[1] == "LEASED 1"

        winner.wait_for("STEP 4")
        assert not loser.has("LEASED"), "both workers hold the lease"
        os.kill(winner.proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        assert winner.finish() == -signal.SIGKILL

        taken_at, leased = loser.wait_for("LEASED", timeout=TTL + 10)
        assert leased == "LEASED 2"
        # The winner renewed at most a step before it died, so its lease outlived it.
        assert taken_at - killed_at > TTL / 3, "the lease was taken over before it expired"
        loser.wait_for("DONE")
        assert loser.finish() == 0, loser.output()
    finally:
        a.kill()
        b.kill()

    ctx, history = _final(store_url, session)
    try:
        assert ctx.get_var("step") == steps
        assert ctx.get_var("done") == list(range(steps)), "a committed step is missing or repeated"
        authors = [e.author for e in history]
        first_b = authors.index(loser.owner)
        assert set(authors[:first_b]) == {winner.owner}
        assert set(authors[first_b:]) == {loser.owner}, "the writers interleaved"
        # Every step the winner reported committed is in the log, once.
        reported = [int(line.split()[1]) for _, line in winner.lines if line.startswith("STEP")]
        assert reported == list(range(len(reported))) and len(reported) <= first_b
    finally:
        ctx.close()


def test_a_fenced_off_worker_cannot_commit_late(store_url: str) -> None:
    session = "zombie"
    with open_store(store_url) as store:
        store.create_session(session)
    steps = 20
    stall = 2.0 * TTL + 0.5
    a = Worker(
        store_url,
        session,
        "worker-a",
        "--steps",
        str(steps),
        "--delay",
        "0.02",
        "--pause-after",
        "3",
        "--pause",
        str(stall),
    )
    b: Worker | None = None
    try:
        a.wait_for("PAUSED")
        b = Worker(store_url, session, "worker-b", "--steps", str(steps), "--delay", "0.02", "--wait")
        b.wait_for("LEASED", timeout=TTL + 10)
        assert b.wait_for("LEASED")[1] == "LEASED 2"
        # a wakes up believing it still runs the session, and tries to commit step 4.
        _, fenced = a.wait_for("FENCED", timeout=stall + 10)
        assert fenced == "FENCED worker-b 2"
        assert a.finish() == 3
        b.wait_for("DONE")
        assert b.finish() == 0, b.output()
    finally:
        a.kill()
        if b is not None:
            b.kill()

    ctx, history = _final(store_url, session)
    try:
        assert ctx.get_var("done") == list(range(steps))
        authors = [e.author for e in history]
        assert authors == ["worker-a"] * 4 + ["worker-b"] * (steps - 4), "the late commit got in"
    finally:
        ctx.close()
