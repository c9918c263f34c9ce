"""The model's question in a service session: ``saucer serve`` (its LLM agent against the tests' fake
OpenAI server) + ``saucer device`` as real processes. The agent's ask_user waits on the server as a pending
question; the session's owner answers it through the API and the model's next request carries the answer;
another principal is refused; unanswered, it times out into "no answer (timeout)"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.support.fake_openai import FakeOpenAI
from tests.support.service import ALICE, BOB, FLEET, OPS, Processes, auth, free_port

from saucer.store import open_store  # noqa: E402

FINAL = ("finished", "failed", "cancelled")


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


def _start(processes: Processes, tmp_path: Path, fake: FakeOpenAI, timeout: float) -> tuple[int, str, Path]:
    config = tmp_path / "saucer.toml"
    config.write_text(
        f'[service]\ntokens = ["alice={ALICE}", "bob={BOB}", "fleet={FLEET}", "ops={OPS}"]\nadmins = ["ops"]\n'
        '[service.devices.laptop]\nprincipals = ["alice", "bob"]\n'
        f"[approvals]\ntimeout = {timeout}\n"
        f'[llm]\nbase_url = "{fake.base_url}"\nmodel = "gpt-4o-mini"\napi_key = "unused-locally"\n'
        "[system]\nmax_step = 6\neva_session = false\nsave_ui_tree = false\n"
    )
    port = free_port()
    store_url = f"sqlite:///{tmp_path / 'events.db'}"
    workspace = tmp_path / "workspace"
    processes.cli_server(port, tmp_path / "state", store_url, config=config)
    processes.cli_device(port, "laptop", workspace)
    (workspace / "notes.txt").write_text("buy milk\n")
    return port, store_url, workspace


def _submit(http: httpx.Client, request: str) -> str:
    response = http.post("/api/sessions", json={"device_id": "laptop", "task": {"task": request}})
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
        session = http.get(f"/api/sessions/{sid}").json().get("session", {})
        assert session.get("status") not in FINAL, f"session {sid} ended without asking: {session}"
        time.sleep(0.2)
    raise AssertionError(f"no pending question in session {sid} within {timeout} s")


def _ended(http: httpx.Client, sid: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = http.get(f"/api/sessions/{sid}", params={"wait": 2}).json()
        if body["session"]["status"] in FINAL:
            return body
    raise AssertionError(f"session {sid} did not end within {timeout} s")


def _tool_message(request: Any, call_id: str) -> str:
    [message] = [m for m in request.json["messages"] if m.get("role") == "tool" and m.get("tool_call_id") == call_id]
    return message["content"]


def test_the_owner_answers_the_models_question_through_the_api(
    processes: Processes, tmp_path: Path, fake: FakeOpenAI
) -> None:
    fake.push(
        fake.tool_calls(("ask_user", {"question": "Which file holds your notes?"}, "call_q")),
        fake.tool_calls(("files.read", {"path": "notes.txt"}, "call_read")),
        fake.text("Your notes say: buy milk."),
    )
    port, store_url, _ = _start(processes, tmp_path, fake, timeout=120)
    base = f"http://127.0.0.1:{port}"
    with (
        httpx.Client(base_url=base, headers=auth(ALICE), timeout=10) as alice,
        httpx.Client(base_url=base, headers=auth(BOB), timeout=10) as bob,
    ):
        sid = _submit(alice, "read my notes")
        question = _pending(alice, sid)
        assert (question["kind"], question["detail"], question["action"]) == (
            "question",
            "Which file holds your notes?",
            "ask_user",
        )
        number = question["number"]
        assert len(fake.requests) == 1  # the model waits for the answer

        # bob may use the device, but the session is alice's: he can neither see nor answer its question.
        refused = bob.post(f"/api/sessions/{sid}/approvals/{number}/answer", json={"answer": "secrets.txt"})
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["message"] == (
            f"principal 'bob' may not see, decide or answer approvals and questions of session '{sid}' "
            "(its owner, its participants and the service admins may)"
        )
        wrong = alice.post(f"/api/sessions/{sid}/approvals/{number}/approve")
        assert wrong.status_code == 409 and "is a question, not an approval" in wrong.json()["error"]["message"], (
            wrong.text
        )
        blank = alice.post(f"/api/sessions/{sid}/approvals/{number}/answer", json={"answer": " "})
        assert blank.status_code == 422, blank.text
        huge = alice.post(f"/api/sessions/{sid}/approvals/{number}/answer", json={"answer": "x" * 10_001})
        assert huge.status_code == 422 and huge.json()["error"]["message"] == "answer: at most 10000 characters", (
            huge.text
        )

        answered = alice.post(f"/api/sessions/{sid}/approvals/{number}/answer", json={"answer": "notes.txt"})
        assert answered.status_code == 200, answered.text
        assert (answered.json()["status"], answered.json()["answer"], answered.json()["decided_by"]) == (
            "answered",
            "notes.txt",
            "alice",
        )
        body = _ended(alice, sid)
        assert body["session"]["status"] == "finished", body["session"]
        # One source: the CLI on the server's event store and the API show the same question.
        cli = subprocess.run(
            [sys.executable, "-m", "saucer", "approvals", sid, "--json", "--store", store_url],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")},
        )
        assert json.loads(cli.stdout) == alice.get(f"/api/sessions/{sid}/approvals").json()["approvals"], cli.stderr
    assert _tool_message(fake.requests[1], "call_q") == "the user (alice) answered: notes.txt"
    assert _tool_message(fake.requests[2], "call_read").find("buy milk") >= 0
    with open_store(store_url) as store:
        kinds = [
            (e.meta.get("kind"), e.author)
            for e in store.read(sid)
            if str(e.meta.get("kind", "")).startswith("approval")
        ]
    assert [k for k, _ in kinds] == ["approval_request", "approval_decision"] and kinds[1][1] == "alice"


def test_an_unanswered_question_times_out_and_the_model_reads_it(
    processes: Processes, tmp_path: Path, fake: FakeOpenAI
) -> None:
    fake.push(
        fake.tool_calls(("ask_user", {"question": "Which file?"}, "call_q")),
        fake.tool_calls(("files.read", {"path": "notes.txt"}, "call_read")),
        fake.text("Read notes.txt without an answer."),
    )
    port, _, _ = _start(processes, tmp_path, fake, timeout=2)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=auth(ALICE), timeout=10) as alice:
        sid = _submit(alice, "read my notes")
        _ended(alice, sid)
        [question] = alice.get(f"/api/sessions/{sid}/approvals").json()["approvals"]
    assert (question["kind"], question["status"], question["decided_by"], question["answer"]) == (
        "question",
        "timed_out",
        "system",
        None,
    )
    content = _tool_message(fake.requests[1], "call_q")
    assert content.startswith(
        f"no answer (timeout): nobody answered question {question['number']} of session {sid} within 2 s"
    ), content
