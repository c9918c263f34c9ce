"""A queued job that fails before its session runs is visible where it was queued (issue 33, item 4):
its reason is in ``queue status`` (text and JSON), ``run --queue --wait`` and ``show``, in one line,
and the session's status is ``error``; a worker says at start what it cannot run."""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest
from tests.support.queueing import status_json

pytestmark = [pytest.mark.postgres]

WHY = "needs an LLM"  # part of LLMUnavailableError's sentence for a request without [llm]


def test_a_request_on_a_worker_without_llm_says_why_everywhere(pg_url: str, saucer: Any, workers: Any) -> None:
    worker = workers("--concurrency", "1")
    waited = saucer("run", "--request", "create notes.txt", "--queue", "--session-id", "nollm-1", "--wait", timeout=120)
    assert waited.returncode == 1
    [line] = [x for x in waited.stdout.splitlines() if "nollm-1" in x]
    assert "failed, session error: " in line and "llm" in line.lower(), waited.stdout
    # queue status, text: one line per failed job, with the reason
    text = saucer("queue", "status")
    [why] = [x for x in text.stdout.splitlines() if x.strip().startswith("nollm-1:")]
    assert "failed, session error: " in why and "llm" in why.lower(), text.stdout
    # queue status --json
    [job] = status_json(saucer)["jobs"]
    assert job["state"] == "failed" and job["session"] == "error" and "llm" in job["reason"].lower(), job
    # the session: status error with the reason, in show (text and JSON) and sessions --json
    show = saucer("show", "nollm-1")
    assert show.returncode == 0, show.stderr
    [title] = [x for x in show.stdout.splitlines() if "session nollm-1 · " in x]
    assert f"· error: {' '.join(title.split('· error: ', 1)[1].split())}" in title and "llm" in title.lower(), (
        show.stdout
    )
    shown = json.loads(saucer("show", "nollm-1", "--json").stdout)["session"]
    assert shown["status"] == "error" and shown["reason"] == job["reason"]
    [row] = json.loads(saucer("sessions", "--json").stdout)
    assert (row["id"], row["status"]) == ("nollm-1", "error")
    # the worker said at start that it cannot run requests, in one line
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=30)
    [said] = [x for x in err.splitlines() if "cannot run requests" in x]
    assert "llm" in said.lower()
    assert "Traceback" not in waited.stdout + waited.stderr + text.stdout + show.stdout


def test_a_retried_job_starts_its_session_afresh(pg_url: str, saucer: Any, workers: Any, qdir: Any) -> None:
    workers("--concurrency", "1")
    waited = saucer("run", "--request", "x", "--queue", "--session-id", "nollm-2", "--wait", timeout=120)
    assert waited.returncode == 1
    [job] = status_json(saucer)["jobs"]
    assert job["reason"]
    # Retried on the same (LLM-less) worker it fails again, from the start: the session is made afresh.
    assert saucer("queue", "retry", "nollm-2").returncode == 0
    from tests.support.queueing import wait_until

    wait_until(
        lambda: status_json(saucer)["jobs"][0]["state"] == "failed" and status_json(saucer)["jobs"][0]["retries"] >= 1,
        60,
        "the retried job to fail again",
    )
    [job] = status_json(saucer)["jobs"]
    assert job["session"] == "error" and "llm" in job["reason"].lower()
