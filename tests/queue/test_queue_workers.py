"""Real processes: saucer worker processes share one queue; one is SIGKILLed mid-step; enqueuers race.

What a crash may repeat: a worker killed during a step has run that step's
commands without committing the step, so the worker that continues the
session runs that one step again (its line shows at most twice). Every step
committed before the kill shows exactly once, and every plan finishes once.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.support.queueing import SAUCER, counts, queue_env, status_json, wait_until, write_plans

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

STEPS = 2


def _lines(out: Path) -> list[tuple[str, int]]:
    if not out.exists():
        return []
    return [(parts[0], int(parts[1])) for parts in (line.split() for line in out.read_text().splitlines())]


def _events(url: str, session_id: str) -> list[Any]:
    from saucer.store import open_store

    with open_store(url) as store:
        return list(store.read(session_id))


def _ends(events: list[Any]) -> list[str]:
    return [e.meta.get("session_status") for e in events if e.meta.get("kind") == "session_end"]


def test_three_workers_one_killed_mid_step_every_plan_finishes_once(
    qdir: Path, pg_url: str, saucer: Any, workers: Any
) -> None:
    out = qdir / "out.txt"
    plans = write_plans(qdir / "plans", 30, STEPS, out, seconds=0.3)
    queued = saucer("run", "--plan", "plans", "--queue")
    assert queued.returncode == 0, queued.stderr
    assert "30 plan(s) in plans: 30 queued, 0 skipped" in queued.stdout

    procs = [workers("--concurrency", "2") for _ in range(3)]
    victim = procs[0]
    # Kill the first worker just after one of its steps appended its line: it is mid-step (0.3 s of work left).
    wait_until(
        lambda: any(pid == victim.pid for _, pid in _lines(out)), 60, "the first worker to run a step", interval=0.05
    )
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)

    wait_until(lambda: (c := counts(pg_url))["done"] + c["failed"] == 30, 120, "all 30 jobs to end")
    status = status_json(saucer)
    total = status["counts"]
    assert total["total"] == 30 and total["done"] == 30, total
    assert {j["state"] for j in status["jobs"]} == {"done"}
    assert all(j["session"] == "finished" for j in status["jobs"])
    assert total["retried"] >= 1  # the killed worker's jobs went back to the queue

    seen = collections.Counter(line for line, _ in _lines(out))
    resumed_sessions = 0
    for plan in plans:
        name = plan.stem
        [job] = [j for j in status["jobs"] if j["source"].endswith(f"{name}.json")]
        sid = job["session_id"]
        events = _events(pg_url, sid)
        assert _ends(events) == ["finished"], (name, _ends(events))  # finished exactly once
        assert sum(1 for e in events if e.meta.get("kind") == "session_start") == 1
        resumes = sum(1 for e in events if e.meta.get("kind") == "session_resume")
        resumed_sessions += bool(resumes)
        twice = [f"{name}-s{i}" for i in range(STEPS) if seen[f"{name}-s{i}"] == 2]
        for i in range(STEPS):
            assert 1 <= seen[f"{name}-s{i}"] <= 2, (name, i, seen[f"{name}-s{i}"])
        # Only a continued session may repeat a step: the one step in flight when its runner died or lost its
        # lease (on a loaded machine a live worker can miss its 2 s lease too), one per continuation.
        assert len(twice) <= resumes, (name, twice, resumes)
    assert resumed_sessions >= 1  # the victim's session(s) went on elsewhere
    for proc in procs[1:]:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, proc.communicate(timeout=10)[1][-3000:]  # its stderr says why


def test_two_concurrent_enqueuers_over_one_folder_queue_each_plan_once(
    qdir: Path, pg_url: str, saucer: Any, workers: Any
) -> None:
    out = qdir / "out.txt"
    write_plans(qdir / "plans", 20, 1, out)
    assert saucer("store", "migrate").returncode == 0  # both racers find the schema; the race is over the plans
    env = queue_env(pg_url)
    racers = [
        subprocess.Popen(
            [*SAUCER, "run", "--plan", "plans", "--queue"],
            cwd=qdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=60) for p in racers]
    assert [p.returncode for p in racers] == [0, 0], outputs
    queued = [int(o.split(" queued,")[0].rsplit(" ", 1)[1]) for o, _ in outputs]
    assert sum(queued) == 20, outputs

    import psycopg

    with psycopg.connect(pg_url.split("?")[0]) as conn:
        schema = pg_url.split("schema=")[1] + "_queue"
        jobs = conn.execute(f'SELECT count(*) FROM "{schema}".procrastinate_jobs').fetchone()[0]
    assert jobs == 20

    workers("--concurrency", "4")
    waited = saucer("run", "--plan", "plans", "--queue", "--wait", timeout=120)  # follows what is queued or running
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert "0 queued, 20 skipped" in waited.stdout and waited.stdout.rstrip().endswith("finished"), waited.stdout
    assert counts(pg_url)["done"] == 20
    seen = collections.Counter(line for line, _ in _lines(out))
    assert sorted(seen) == [f"p{n:02d}-s0" for n in range(20)]
    assert set(seen.values()) == {1}  # each plan ran once
    again = saucer("run", "--plan", "plans", "--queue")
    assert "0 queued, 20 skipped" in again.stdout and again.stdout.count("already finished") == 20, again.stdout


def test_a_queue_needs_postgresql(tmp_path: Path) -> None:
    from saucer.queue import QueueUnavailableError, queue_location

    for url in ("sqlite:///x.db", "memory://", "memory://shared"):
        with pytest.raises(QueueUnavailableError, match="a queue needs a PostgreSQL store"):
            queue_location(url)
    write_plans(tmp_path / "plans", 1, 1, tmp_path / "out.txt")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")}
    for args in (
        ["worker", "--store", "sqlite:///x.db"],
        ["run", "--plan", "plans", "--queue", "--store", "memory://"],
        ["queue", "status"],
    ):
        proc = subprocess.run([*SAUCER, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert proc.stderr.startswith("error: a queue needs a PostgreSQL store"), (args, proc.stderr)
        assert "Traceback" not in proc.stderr
