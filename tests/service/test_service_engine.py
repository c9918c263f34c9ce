"""``saucer serve`` + ``saucer device`` as real processes: engine sessions, the event store, ``saucer show``, restart.

The server is the CLI's ``saucer serve`` (engine runner, SQLite event store),
the device the CLI's ``saucer device`` with the built-in shell and files tools
in a temporary workspace, the client plain HTTP.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.support.service import ALICE, BOB, FLEET, Processes, auth, device_online, free_port, wait_until

from saucer.context import Context, ContextNames
from saucer.store import open_store

FINAL = ("finished", "failed", "cancelled")


def _wait_ended(http: httpx.Client, session_id: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = http.get(f"/api/sessions/{session_id}", params={"wait": 2}).json()
        if body["session"]["status"] in FINAL:
            return body
    raise AssertionError(f"session {session_id} did not end within {timeout} s")


def _submit(http: httpx.Client, device_id: str, task: dict[str, Any]) -> str:
    response = http.post("/api/sessions", json={"device_id": device_id, "task": task})
    assert response.status_code == 201, response.text
    return response.json()["session_id"]


def _saucer(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAUCER_", "OPENAI_"))}
    return subprocess.run(
        [sys.executable, "-m", "saucer", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        env={**env, "COLUMNS": "200", "NO_COLOR": "1"},
    )


def _show(session_id: str, store_url: str) -> str:
    done = _saucer("show", session_id, "--store", store_url)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_serve_and_device_say_what_is_missing(tmp_path: Path) -> None:
    serve = _saucer("serve", "--port", "0", cwd=tmp_path)
    assert serve.returncode == 2
    assert "SAUCER_SERVICE_TOKENS=NAME=TOKEN" in serve.stderr and "[service]" in serve.stderr
    short = _saucer("serve", "--port", "0", "--config", str(_toml(tmp_path, 'tokens = ["alice=short"]')), cwd=tmp_path)
    assert short.returncode == 2 and "shorter than 16 characters" in short.stderr
    device = _saucer("device", "--server", "ws://127.0.0.1:9/ws", "--device-id", "d", cwd=tmp_path)
    assert device.returncode == 2 and "SAUCER_SERVICE_TOKEN=TOKEN" in device.stderr
    url = _saucer("device", "--server", "ftp://x", "--device-id", "d", "--token", "t" * 20, cwd=tmp_path)
    assert url.returncode == 2 and "--server must be a URL like ws://" in url.stderr
    assert not list(tmp_path.glob("logs")) and not (tmp_path / ".saucer").exists()  # nothing was started


def _toml(tmp_path: Path, service: str) -> Path:
    path = tmp_path / "bad.toml"
    path.write_text(f"[service]\n{service}\n")
    return path


def _shell(command: str) -> dict[str, Any]:
    return {"tool_name": "shell.run", "parameters": {"command": command}}


def test_saucer_serve_and_device_run_tasks_as_engine_sessions_in_the_store(
    processes: Processes, tmp_path: Path
) -> None:
    port = free_port()
    store_url = f"sqlite:///{tmp_path / 'events.db'}"
    workspace = tmp_path / "workspace"
    config = tmp_path / "saucer.toml"
    # The fleet's laptop is shared with alice only: bob can neither see it nor read alice's sessions.
    config.write_text(
        f'[service]\ntokens = ["alice={ALICE}", "bob={BOB}", "fleet={FLEET}"]\n'
        '[service.devices.laptop]\nprincipals = ["alice"]\n'
    )
    processes.cli_server(port, tmp_path / "state", store_url, config=config)
    processes.cli_device(port, "laptop", workspace)
    wrong = _saucer(
        "device",
        "--server",
        f"ws://127.0.0.1:{port}/ws",
        "--device-id",
        "intruder",
        "--token",
        "x" * 20,
        "-w",
        str(workspace),
    )
    assert wrong.returncode == 3 and "refused the token" in wrong.stderr, wrong.stderr
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=auth(ALICE), timeout=10) as http:
        device = http.get("/api/devices/laptop").json()
        assert {"files.write", "shell.run"} <= set(device["info"]["tools"])  # what LLM agents on it may call
        plan = {
            "task": "notes",
            "steps": [
                {
                    "subtask": "write",
                    "commands": [{"tool_name": "files.write", "parameters": {"path": "notes.txt", "content": "hello"}}],
                },
                {
                    "subtask": "check",
                    "commands": [
                        {"tool_name": "files.read", "parameters": {"path": "notes.txt"}},
                        _shell("wc -c < notes.txt"),
                    ],
                },
            ],
        }
        sid = _submit(http, "laptop", plan)
        body = _wait_ended(http, sid)
        assert body["session"]["status"] == "finished", body["session"]["error"]
        assert (workspace / "notes.txt").read_text() == "hello"
        assert [s["index"] for s in body["steps"]] == [0, 1]
        read, count = body["steps"][1]["results"]
        assert read["result"]["content"] == "hello" and count["result"]["stdout"].strip() == "5"
        assert [r["call_id"] for r in body["steps"][1]["results"]] == [f"{sid}.1.0", f"{sid}.1.1"]

        # A plan is checked against the device's tools before anything runs: 422 naming the step and the tool.
        for command, message in (
            ({"tool_name": "frobnicate"}, "unknown tool 'frobnicate'"),
            ({"tool_name": "file.write", "parameters": {"path": "x", "content": "y"}}, "(closest: files.write"),
            ({"tool_name": "files.write", "parameters": {"path": "x"}}, "'content' is a required property"),
        ):
            steps = [
                {"subtask": "ok", "commands": [_shell("echo ran > ran.txt")]},
                {"subtask": "bad", "commands": [command]},
            ]
            refused = http.post("/api/sessions", json={"device_id": "laptop", "task": {"task": "bad", "steps": steps}})
            error = refused.json()["error"]
            assert refused.status_code == 422 and error["code"] == "invalid_task", refused.text
            assert error["message"].startswith("task.steps.1.commands.0: ") and message in error["message"], error
            assert "'laptop'" in error["message"]
        assert not (workspace / "ran.txt").exists()  # nothing ran
        # A command that exits non-zero on the device is a failed result, and fails its session.
        exit3 = _submit(
            http, "laptop", {"task": "exit3", "steps": [{"subtask": "x", "commands": [_shell("echo out; exit 3")]}]}
        )
        ended = _wait_ended(http, exit3)
        assert ended["session"]["status"] == "failed" and "exited with code 3" in ended["session"]["error"]
        [result] = ended["steps"][0]["results"]
        assert (
            result["status"] == "failure"
            and result["result"]["exit_code"] == 3
            and result["result"]["stdout"] == "out\n"
        )

        # A failing command fails its session with the step and the tool's error.
        failing = _submit(
            http,
            "laptop",
            {
                "task": "missing",
                "steps": [
                    {"subtask": "read", "commands": [{"tool_name": "files.read", "parameters": {"path": "nope.txt"}}]}
                ],
            },
        )
        failed = _wait_ended(http, failing)["session"]
        assert (
            failed["status"] == "failed"
            and failed["error"].startswith("step 0 ('read') failed: ")
            and "nope.txt" in failed["error"]
        )

        # A request without steps needs the LLM agent; none is configured, and the error says what to set.
        request = _submit(http, "laptop", {"task": "tidy my notes"})
        unconfigured = _wait_ended(http, request)["session"]
        assert unconfigured["status"] == "failed" and "SAUCER_LLM_MODEL" in unconfigured["error"]
        assert http.get(f"/api/sessions/{sid}", headers=auth(BOB)).status_code == 404
        assert http.get("/api/devices", headers=auth(BOB)).json()["devices"] == []

    # The sessions' Contexts are in the saucer store under the same ids.
    with open_store(store_url) as store:
        ctx = Context.open(store, sid, create=False)
        assert ctx.get(ContextNames.MODE) == "service"
        assert ctx.get(ContextNames.SESSION_STEP) == 2
        assert [s["subtask"] for s in ctx.get(ContextNames.PREVIOUS_SUBTASKS)] == ["write", "check"]
        assert "files.write" in ctx.get(ContextNames.TOOL_INFO)
        [device_info] = ctx.get(ContextNames.DEVICE_INFO)  # what the device reported when it registered
        assert (device_info["device_id"], device_info["protocol"]) == ("laptop", "saucer") and "hostname" in device_info
        assert [e.meta["session_status"] for e in store.read(sid)][-1] == "finished"
        assert list(store.read(failing))[-1].meta["session_status"] == "failed"
        assert list(store.read(request))[-1].meta["session_status"] == "error"
    timeline = _show(sid, store_url)
    assert "session started (service mode)" in timeline
    assert "files.write" in timeline and "shell.run" in timeline and "session finished" in timeline


def test_saucer_serve_killed_mid_session_resumes_from_the_store_without_repeating_a_step(
    processes: Processes, tmp_path: Path
) -> None:
    port = free_port()
    state = tmp_path / "state"
    store_url = f"sqlite:///{tmp_path / 'events.db'}"
    workspace = tmp_path / "workspace"
    server = processes.cli_server(port, state, store_url)
    device = processes.cli_device(port, "box", workspace)
    lines = workspace / "steps.txt"
    steps = 5
    # Each step writes its line first, then works for 0.4 s: a kill then catches it run but not committed.
    plan = {
        "task": "five steps",
        "steps": [
            {"subtask": f"step {i}", "commands": [_shell(f"echo step-{i} >> steps.txt && sleep 0.4")]}
            for i in range(steps)
        ],
    }
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=auth(ALICE), timeout=10) as http:
        sid = _submit(http, "box", plan)
        wait_until(lambda: lines.exists() and len(lines.read_text().splitlines()) >= 3, 20, "step 2 to start", device)
    server.kill(signal.SIGKILL)
    server.popen.wait(timeout=10)
    with open_store(store_url) as store:
        committed = [e.meta["plan_index"] for e in store.read(sid) if e.meta.get("kind") == "step"]
    assert committed == [0, 1]  # step 2 was running on the device when the server died

    processes.cli_server(port, state, store_url)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=auth(ALICE), timeout=10) as http:
        wait_until(lambda: device_online(port, "box"), 20, "the device to reconnect", device)
        done = _wait_ended(http, sid)
        session = done["session"]
        assert session["status"] == "finished", session["error"]
        assert (session["attempts"], session["resumed_from_step"]) == (2, 2)
        assert [s["index"] for s in done["steps"]] == list(range(steps))
    # Every step ran exactly once on the device, the one in flight at the crash included.
    assert lines.read_text().splitlines() == [f"step-{i}" for i in range(steps)]
    with open_store(store_url) as store:
        events = list(store.read(sid))
    kinds = [e.meta.get("kind") for e in events]
    assert kinds.count("session_start") == 1 and kinds.count("session_resume") == 1
    assert [e.meta["plan_index"] for e in events if e.meta.get("kind") == "step"] == list(range(steps))
    assert events[-1].meta["session_status"] == "finished"
    assert "session finished" in _show(sid, store_url)


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.parametrize("isolate", [False, True], ids=["inprocess", "isolated"])
def test_a_device_starts_its_tools_once_not_per_session(processes: Processes, tmp_path: Path, isolate: bool) -> None:
    """Three sessions on one device: every command's shell has the same parent, the tools started with the device.

    In-process the parent is the device itself; isolated it is the device's one shell server process,
    still the same one after the third session (a server started per session would be a new process each time).
    """
    port = free_port()
    processes.cli_server(port, tmp_path / "state", f"sqlite:///{tmp_path / 'events.db'}")
    env = {"SAUCER_MCP__ISOLATE": "true"} if isolate else {}
    device = processes.cli_device(port, "box", tmp_path / "workspace", env=env)
    parents = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=auth(ALICE), timeout=10) as http:
        for i in range(3):
            sid = _submit(
                http, "box", {"task": f"ppid{i}", "steps": [{"subtask": "who", "commands": [_shell("echo $PPID")]}]}
            )
            body = _wait_ended(http, sid)
            assert body["session"]["status"] == "finished", body["session"]["error"]
            parents.append(int(body["steps"][0]["results"][0]["result"]["stdout"]))
    assert len(set(parents)) == 1, parents
    [parent] = set(parents)
    if isolate:
        assert parent != device.popen.pid and _parent_of(parent) == device.popen.pid
        assert b"saucer.tools.shell" in Path(f"/proc/{parent}/cmdline").read_bytes()
    else:
        assert parent == device.popen.pid
