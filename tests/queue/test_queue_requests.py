"""Requests on the queue: ``saucer run --request ... --queue`` and the service's ``POST /api/sessions`` with ``"queue": true``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.support.queueing import status_here

pytestmark = [pytest.mark.postgres]

OPS = "ops-token-0123456789abcdef"
ALICE = "alice-token-0123456789abcdef"
TASK = {
    "task": "notes",
    "steps": [
        {
            "subtask": "write",
            "commands": [{"tool_name": "files.write", "parameters": {"path": "n.md", "content": "hi"}}],
        }
    ],
}


def test_run_request_queue_puts_one_request_job_on_the_queue(pg_url: str, saucer: Any) -> None:
    proc = saucer("run", "--request", "tidy the notes", "--queue", "--session-id", "tidy-1")
    assert proc.returncode == 0, proc.stderr
    assert "1 request: 1 queued, 0 skipped" in proc.stdout
    [job] = status_here(pg_url)["jobs"]
    assert (job["session_id"], job["kind"], job["state"]) == ("tidy-1", "request", "queued")
    again = saucer("run", "--request", "tidy the notes", "--queue", "--session-id", "tidy-1")
    assert "skipped request: already queued (session tidy-1)" in again.stdout


def _service(store_url: str | None) -> Any:
    from saucer.service.server import ServiceConfig, create_app

    return create_app(
        ServiceConfig(port=0, tokens={"ops": OPS, "alice": ALICE}, state_dir=None, admins=["ops"], store_url=store_url)
    )


def test_the_service_queues_a_task_for_workers_for_admins_only(pg_url: str, tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    with TestClient(_service(pg_url)) as client:
        refused = client.post(
            "/api/sessions", json={"queue": True, "task": TASK}, headers={"Authorization": f"Bearer {ALICE}"}
        )
        assert refused.status_code == 403 and "only service admins may queue" in refused.json()["error"]["message"]
        queued = client.post(
            "/api/sessions", json={"queue": True, "task": TASK}, headers={"Authorization": f"Bearer {OPS}"}
        )
        assert queued.status_code == 202, queued.text
        body = queued.json()
        assert body["queued"] is True and body["job_id"]
        nodevice = client.post("/api/sessions", json={"task": TASK}, headers={"Authorization": f"Bearer {OPS}"})
        assert nodevice.status_code == 422 and "device_id" in nodevice.json()["error"]["message"]
    [job] = status_here(pg_url)["jobs"]
    assert job["session_id"] == body["session_id"] and job["state"] == "queued" and job["source"] == "service"


def test_the_service_says_a_queue_needs_postgresql(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    with TestClient(_service(f"sqlite:///{tmp_path}/s.db")) as client:
        r = client.post("/api/sessions", json={"queue": True, "task": TASK}, headers={"Authorization": f"Bearer {OPS}"})
    assert r.status_code == 409 and r.json()["error"]["message"].startswith("a queue needs a PostgreSQL store"), r.text
