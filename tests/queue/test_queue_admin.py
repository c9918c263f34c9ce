"""Steering the queue with real workers: SIGTERM hands sessions back, retry, cancel, job timeout, priority and limits."""

from __future__ import annotations

import collections
import json
import signal
from pathlib import Path
from typing import Any

import pytest
from tests.support.queueing import counts, status_here, status_json, wait_until, write_plans

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def _lines(out: Path) -> list[str]:
    return [line.split()[0] for line in out.read_text().splitlines()] if out.exists() else []


def test_sigterm_hands_running_sessions_back_and_another_worker_continues_them(
    qdir: Path, pg_url: str, saucer: Any, workers: Any
) -> None:
    out = qdir / "out.txt"
    write_plans(qdir / "plans", 2, 4, out, seconds=0.6)
    assert saucer("run", "--plan", "plans", "--queue").returncode == 0
    first = workers("--concurrency", "2")
    wait_until(lambda: len(_lines(out)) >= 3, 60, "a few steps", interval=0.05)
    first.send_signal(signal.SIGTERM)
    _, stderr = first.communicate(timeout=60)
    assert first.returncode == 0, stderr
    assert "saucer worker stopped" in stderr
    after = counts(pg_url)
    assert after["queued"] + after["done"] == 2 and after["running"] == 0, after  # handed back, none lost
    assert after["queued"] >= 1
    workers()
    wait_until(lambda: counts(pg_url)["done"] == 2, 90, "both jobs to finish")
    seen = collections.Counter(_lines(out))
    assert sorted(seen) == sorted(f"p{n:02d}-s{i}" for n in range(2) for i in range(4))
    assert (
        sum(1 for v in seen.values() if v == 2) <= 2 and max(seen.values()) <= 2
    )  # one in-flight step per handed-back session
    status = status_here(pg_url)
    assert status["counts"]["retried"] >= 1 and {j["session"] for j in status["jobs"]} == {"finished"}


def test_a_failed_job_is_retried_after_the_cause_is_fixed_and_cancel_stops_queued_jobs(
    qdir: Path, pg_url: str, saucer: Any, workers: Any
) -> None:
    out = qdir / "out.txt"
    flag = qdir / "ready"
    write_plans(qdir / "failing", 1, 2, out, needs=str(flag), prefix="f")
    write_plans(qdir / "waiting", 3, 1, out, prefix="w")
    assert saucer("run", "--plan", "waiting", "--queue").returncode == 0
    cancelled = saucer("queue", "cancel")  # every queued job: nothing runs them yet
    assert cancelled.returncode == 0 and cancelled.stdout.count(": cancelled") == 3, cancelled.stdout
    assert counts(pg_url)["cancelled"] == 3

    queued = saucer("run", "--plan", "failing", "--queue")
    assert "1 queued" in queued.stdout
    workers()
    wait_until(lambda: counts(pg_url)["failed"] == 1, 60, "the failing job to fail")
    status = status_here(pg_url)
    [failed] = [j for j in status["jobs"] if j["state"] == "failed"]
    assert failed["session"] == "failed"
    text = saucer("queue", "status").stdout
    assert "1 failed, 3 cancelled" in text and failed["session_id"] in text

    flag.write_text("ok")
    retried = saucer("queue", "retry")  # the failed and the cancelled ones
    assert retried.returncode == 0 and retried.stdout.count("queued again as job") == 4, retried.stdout
    wait_until(lambda: counts(pg_url)["done"] == 4, 90, "the retried jobs to finish")
    assert collections.Counter(_lines(out)) == collections.Counter(["f00-s0", "f00-s1", "w00-s0", "w01-s0", "w02-s0"])
    final = status_here(pg_url)
    assert final["counts"]["total"] == 4 and final["counts"]["retried"] == 4
    assert saucer("queue", "retry", "nosuchsession").stderr.startswith("error: no queued session 'nosuchsession'")


def test_job_timeout_fails_the_job_and_priority_and_queue_limits_come_from_configuration(
    qdir: Path, pg_url: str, saucer: Any, workers: Any
) -> None:
    out = qdir / "out.txt"
    write_plans(qdir / "slow", 1, 1, out, seconds=30, prefix="slow")
    write_plans(qdir / "low", 3, 1, out, seconds=0.4, prefix="low")
    write_plans(qdir / "high", 1, 1, out, seconds=0.4, prefix="high")
    limited = {"queue__limits": json.dumps({"sessions": 1})}
    assert saucer("run", "--plan", "low", "--queue", env=limited).returncode == 0
    assert saucer("run", "--plan", "high", "--queue", "--priority", "5", env=limited).returncode == 0
    assert saucer("run", "--plan", "slow", "--queue", "--queue-name", "slow").returncode == 0
    # Two slots, but queue "sessions" is limited to one session at a time (over all workers: a lock, not a slot count).
    workers("--concurrency", "2", "--queue", "sessions", env=limited)
    # The timeout is the slow queue's worker's own: 6 s, long enough to start the session on a loaded machine.
    workers("--queue", "slow", env={"queue__job_timeout": "6"})
    wait_until(lambda: (c := counts(pg_url))["done"] + c["failed"] == 5, 90, "all five jobs to end")
    ends = [line.split() for line in (qdir / "out.txt.ends").read_text().splitlines()]
    spans = sorted((float(start), float(end), name) for name, _pid, start, end in ends if not name.startswith("slow"))
    assert spans[0][2] == "high00-s0"  # the higher priority first
    assert all(a[1] <= b[0] + 0.05 for a, b in zip(spans, spans[1:], strict=False)), spans  # never two at once
    status = status_json(saucer)
    [slow] = [j for j in status["jobs"] if j["source"].endswith("slow00.json")]
    assert slow["state"] == "failed" and slow["session"] == "interrupted", slow
    assert status["counts"]["done"] == 4
