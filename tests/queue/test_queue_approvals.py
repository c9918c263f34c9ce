"""Real processes: a queued session's sensitive step waits on its ``saucer worker`` as a pending
approval (nobody is at a worker's terminal), and runs once someone approves it from another process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from queue_support import status_json, wait_until

pytestmark = [pytest.mark.postgres]


def test_a_queued_sensitive_step_waits_on_its_worker_until_approved(qdir: Path, pg_url: str, saucer: Any, workers: Any) -> None:
    (qdir / "saucer.toml").write_text('[system]\nsave_experience = "always_not"\nlog_to_markdown = false\n')
    workspace = qdir / "ws"
    workspace.mkdir()
    (workspace / "junk.txt").write_text("junk")
    plan = {"task": "cleanup", "steps": [
        {"subtask": "remove junk", "commands": [{"tool_name": "shell.run", "parameters": {"command": "rm -f junk.txt"}}]}]}
    (qdir / "plan.json").write_text(json.dumps(plan))
    queued = saucer("run", "--plan", "plan.json", "--queue", "--workspace", str(workspace))
    assert queued.returncode == 0, queued.stderr
    workers("--concurrency", "1")

    listed = saucer("approvals", "--wait", "90", "--json", timeout=120)
    assert listed.returncode == 0, listed.stderr
    [approval] = json.loads(listed.stdout)
    assert approval["status"] == "pending" and "rm -f junk.txt" in approval["detail"]
    assert (workspace / "junk.txt").exists()
    done = saucer("approve", approval["session_id"], str(approval["number"]), "--author", "user:ops")
    assert done.returncode == 0, done.stderr

    def ended() -> Any:
        jobs = status_json(saucer)["jobs"]
        return jobs if jobs and all(j["state"] in ("done", "failed") for j in jobs) else None

    [job] = wait_until(ended, 90, "the queued session to end")
    assert job["state"] == "done" and job["session"] == "finished", job
    assert not (workspace / "junk.txt").exists()
