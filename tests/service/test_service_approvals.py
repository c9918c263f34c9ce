"""Approvals end to end: ``saucer serve`` + ``saucer device`` (without ``--yes``) as real processes.

A sensitive command (``rm``) waits on the server as a pending approval in the
session's event log; the session's owner approves it through the HTTP API and
it runs; another principal is refused (403); a refusal and a timeout reach the
step's result, which is what an agent reads.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from tests.support.service import ALICE, BOB, FLEET, OPS, Processes, auth, free_port

from saucer.store import open_store

FINAL = ("finished", "failed", "cancelled")


def _config(tmp_path: Path, timeout: float) -> Path:
    path = tmp_path / "saucer.toml"
    path.write_text(
        f'[service]\ntokens = ["alice={ALICE}", "bob={BOB}", "fleet={FLEET}", "ops={OPS}"]\nadmins = ["ops"]\n'
        '[service.devices.laptop]\nprincipals = ["alice", "bob"]\n'
        f"[approvals]\ntimeout = {timeout}\n"
    )
    return path


def _start(processes: Processes, tmp_path: Path, timeout: float) -> tuple[int, str, Path]:
    port = free_port()
    store_url = f"sqlite:///{tmp_path / 'events.db'}"
    workspace = tmp_path / "workspace"
    processes.cli_server(port, tmp_path / "state", store_url, config=_config(tmp_path, timeout))
    processes.cli_device(port, "laptop", workspace, yes=False)
    return port, store_url, workspace


def _plan(command: str) -> dict[str, Any]:
    return {
        "task": "cleanup",
        "steps": [
            {"subtask": "look", "commands": [{"tool_name": "shell.run", "parameters": {"command": "ls"}}]},
            {"subtask": "remove junk", "commands": [{"tool_name": "shell.run", "parameters": {"command": command}}]},
        ],
    }


def _submit(http: httpx.Client, task: dict[str, Any]) -> str:
    response = http.post("/api/sessions", json={"device_id": "laptop", "task": task})
    assert response.status_code == 201, response.text
    return response.json()["session_id"]


def _pending(http: httpx.Client, sid: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = http.get(f"/api/sessions/{sid}/approvals")
        assert response.status_code == 200, response.text
        waiting = [a for a in response.json()["approvals"] if a["status"] == "pending"]
        if waiting:
            return waiting[0]
        status = http.get(f"/api/sessions/{sid}").json().get("session", {}).get("status")  # None: not this token's
        assert status not in FINAL, f"session {sid} ended ({status}) without asking for an approval"
        time.sleep(0.2)
    raise AssertionError(f"no pending approval in session {sid} within {timeout} s")


def _ended(http: httpx.Client, sid: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = http.get(f"/api/sessions/{sid}", params={"wait": 2}).json()
        if body["session"]["status"] in FINAL:
            return body
    raise AssertionError(f"session {sid} did not end within {timeout} s")


def _saucer(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAUCER_", "OPENAI_"))}
    return subprocess.run(
        [sys.executable, "-m", "saucer", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={**env, "COLUMNS": "200", "NO_COLOR": "1"},
    )


def _readme_api(port: int, token: str, sid: str, number: int) -> list[dict[str, Any]]:
    """Run docs/how-to/people-in-the-loop.md's approvals API block (curl) with ``$TOKEN``, ``$SID`` and ``$N``;
    one JSON answer per command."""
    page = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "people-in-the-loop.md"
    script = re.findall(r"```bash(?: [^\n]*)?\n(.*?)```", page.read_text(encoding="utf-8"), re.S)[-1]
    assert script.count("curl ") == 3 and ":8765/" in script
    script = script.replace(":8765/", f":{port}/").replace("curl ", "curl -s -w '\\n' ")
    env = {**os.environ, "TOKEN": token, "SID": sid, "N": str(number)}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def test_a_sensitive_command_waits_is_approved_by_its_owner_and_runs(processes: Processes, tmp_path: Path) -> None:
    port, store_url, workspace = _start(processes, tmp_path, timeout=120)
    (workspace / "junk.txt").write_text("junk")
    base = f"http://127.0.0.1:{port}"
    with (
        httpx.Client(base_url=base, headers=auth(ALICE), timeout=10) as alice,
        httpx.Client(base_url=base, headers=auth(BOB), timeout=10) as bob,
        httpx.Client(base_url=base, headers=auth(OPS), timeout=10) as ops,
    ):
        sid = _submit(alice, _plan("rm -f junk.txt"))
        approval = _pending(alice, sid)
        assert approval["action"] == "run shell.run" and "rm -f junk.txt" in approval["detail"]
        assert "matches sensitive pattern 'rm *'" in approval["reason"]
        assert (workspace / "junk.txt").exists()  # nothing ran while it waits
        # The CLI on the server's event store sees the same pending approval.
        listed = _saucer("approvals", "--store", store_url)
        assert listed.returncode == 0 and f"{sid} {approval['number']} pending" in listed.stdout, listed.stdout

        # bob may use the device, but the session is alice's: he can neither see nor decide its approvals.
        number = approval["number"]
        for attempt in (
            bob.post(f"/api/sessions/{sid}/approvals/{number}/approve"),
            bob.get(f"/api/sessions/{sid}/approvals"),
        ):
            assert attempt.status_code == 403, attempt.text
            assert attempt.json()["error"]["message"] == (
                f"principal 'bob' may not see, decide or answer approvals and questions of session '{sid}' (its owner, its participants and the service admins may)"
            )
        assert (workspace / "junk.txt").exists()
        assert alice.post(f"/api/sessions/{sid}/approvals/999/approve").status_code == 404

        # alice approves with the docs' curl lines, run as written: list, approve, then a refusal that comes too late.
        listed, decided, again = _readme_api(port, ALICE, sid, number)
        assert [a["status"] for a in listed["approvals"]] == ["pending"]
        assert decided["status"] == "approved" and decided["decided_by"] == "alice"
        assert again["error"]["code"] == "not_pending" and "already approved by alice" in again["error"]["message"]

        body = _ended(alice, sid)
        assert body["session"]["status"] == "finished", body["session"]["error"]
        assert not (workspace / "junk.txt").exists()
        assert body["steps"][1]["results"][0]["status"] == "success"

        # An admin refuses the next one, with a reason: the command does not run, its result says who and why.
        (workspace / "junk.txt").write_text("junk")
        second = _submit(alice, _plan("rm -f junk.txt"))
        approval = _pending(alice, second)
        refused = ops.post(
            f"/api/sessions/{second}/approvals/{approval['number']}/refuse", json={"reason": "keep the junk"}
        )
        assert refused.status_code == 200 and refused.json()["status"] == "refused", refused.text
        body = _ended(alice, second)
        assert body["session"]["status"] == "failed"
        error = body["steps"][1]["results"][0]["error"]
        assert error.startswith("refused: tool 'shell.run'") and "refused by ops" in error, error
        assert error.endswith(": keep the junk"), error
        assert (workspace / "junk.txt").exists()

        # A session that names bob as a participant: bob decides; the admin, not named, is refused.
        third = _submit(alice, {**_plan("rm -f junk.txt"), "participants": ["bob"]})
        approval = _pending(bob, third)
        outsider = ops.post(f"/api/sessions/{third}/approvals/{approval['number']}/approve")
        assert outsider.status_code == 403 and outsider.json()["error"]["message"].startswith(
            f"'ops' is not a participant of session '{third}', so nothing was written"
        ), outsider.text
        approved = bob.post(f"/api/sessions/{third}/approvals/{approval['number']}/approve")
        assert approved.status_code == 200 and approved.json()["decided_by"] == "bob", approved.text
        assert _ended(alice, third)["session"]["status"] == "finished"
        assert not (workspace / "junk.txt").exists()

        # One source: the CLI on the server's store and the API show the same approvals.
        for session_id in (sid, second, third):
            cli = _saucer("approvals", session_id, "--json", "--store", store_url)
            assert json.loads(cli.stdout) == alice.get(f"/api/sessions/{session_id}/approvals").json()["approvals"]

    # The request and the decision are events of the session, each with its author.
    with open_store(store_url) as store:
        kinds = [
            (e.meta.get("kind"), e.author)
            for e in store.read(sid)
            if str(e.meta.get("kind", "")).startswith("approval")
        ]
    assert kinds == [("approval_request", "system"), ("approval_decision", "alice")]


def test_an_unanswered_approval_is_refused_by_timeout_and_the_agent_reads_it(
    processes: Processes, tmp_path: Path
) -> None:
    port, store_url, workspace = _start(processes, tmp_path, timeout=3)
    (workspace / "junk.txt").write_text("junk")
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, headers=auth(ALICE), timeout=10) as alice:
        # Nobody decides: after 3 s the approval is refused by timeout, the command never runs.
        sid = _submit(alice, _plan("rm -f junk.txt"))
        body = _ended(alice, sid)
        assert body["session"]["status"] == "failed"
        result = body["steps"][1]["results"][0]
        assert result["status"] == "failure"
        assert result["error"].startswith("refused: tool 'shell.run'") and "refused by timeout" in result["error"]
        assert "within 3 s" in result["error"]
        assert (workspace / "junk.txt").exists()
        [timed_out] = alice.get(f"/api/sessions/{sid}/approvals").json()["approvals"]
        assert timed_out["status"] == "timed_out" and timed_out["decided_by"] == "system"
