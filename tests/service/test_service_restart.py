"""The server is SIGKILLed mid-session and restarted: the session completes, no step runs twice."""

from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path

import httpx
from tests.support.service import ALICE, BOB, Processes, auth, device_online, free_port, wait_until

from saucer.store import open_store

STEPS = 6


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _wait_ended(http: httpx.Client, session_id: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = http.get(f"/api/sessions/{session_id}", params={"wait": 2}).json()
        if body["session"]["status"] in ("finished", "failed", "cancelled"):
            return body
    raise AssertionError(f"session {session_id} did not end within {timeout} s")


def test_server_killed_mid_session_resumes_from_the_last_committed_step(processes: Processes, tmp_path: Path) -> None:
    port = free_port()
    state = tmp_path / "state"
    server = processes.server(port, state)
    device = processes.device(port, "dev-r")
    steps_file = tmp_path / "steps.txt"
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=auth(ALICE), timeout=10) as http:
        # A session that ends before the crash must stay readable after it.
        quick = http.post(
            "/api/sessions",
            json={
                "device_id": "dev-r",
                "task": {"task": "quick", "steps": [{"commands": [{"tool_name": "echo", "parameters": {"q": 1}}]}]},
            },
        ).json()["session_id"]
        assert _wait_ended(http, quick)["session"]["status"] == "finished"

        # Each step appends its line *first*, then works for 0.4 s: a kill during
        # that time catches the step executed on the device but not yet committed.
        plan = {
            "task": "six steps",
            "steps": [
                {
                    "subtask": f"step {i}",
                    "commands": [
                        {
                            "tool_name": "append",
                            "parameters": {"path": str(steps_file), "line": f"step-{i}", "seconds": 0.4},
                        }
                    ],
                }
                for i in range(STEPS)
            ],
        }
        created = http.post("/api/sessions", json={"device_id": "dev-r", "task": plan})
        assert created.status_code == 201, created.text
        session_id = created.json()["session_id"]
        wait_until(lambda: len(_lines(steps_file)) >= 3, 20, "step 2 to start on the device", device)

    server.kill(signal.SIGKILL)
    server.popen.wait(timeout=10)
    with sqlite3.connect(state / "sessions.sqlite3") as db:
        committed = [
            row[0] for row in db.execute("SELECT idx FROM steps WHERE session_id = ? ORDER BY idx", (session_id,))
        ]
    # Steps 0 and 1 were committed; step 2 was running on the device when the server died.
    assert committed == [0, 1]
    assert device.popen.poll() is None  # the device lives on and reconnects with backoff

    processes.server(port, state)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=auth(ALICE), timeout=10) as http:
        wait_until(lambda: device_online(port, "dev-r"), 20, "the device to reconnect", device)
        done = _wait_ended(http, session_id)
        session = done["session"]
        assert session["status"] == "finished", session["error"]
        assert session["attempts"] == 2
        assert session["resumed_from_step"] == 2
        assert [s["index"] for s in done["steps"]] == list(range(STEPS))
        # The proof: every step ran exactly once on the device, including the
        # one in flight at the crash (the device answered it from its cache).
        assert _lines(steps_file) == [f"step-{i}" for i in range(STEPS)]

        before = http.get(f"/api/sessions/{quick}/results").json()
        assert before["status"] == "finished"
        assert before["results"][0]["results"][0]["result"] == {"q": 1}
        ids = [s["session_id"] for s in http.get("/api/sessions").json()["sessions"]]
        assert ids == [quick, session_id]
        # Ownership survived the restart too.
        assert http.get(f"/api/sessions/{session_id}", headers=auth(BOB)).status_code == 404

    # The session is an engine session in the event store of the state dir: resumed once, each step committed once.
    with open_store(f"sqlite:///{state / 'saucer.db'}") as store:
        events = list(store.read(session_id))
    kinds = [e.meta.get("kind") for e in events]
    assert kinds.count("session_start") == 1 and kinds.count("session_resume") == 1
    assert [e.meta["plan_index"] for e in events if e.meta.get("kind") == "step"] == list(range(STEPS))
    assert events[-1].meta["session_status"] == "finished"
