"""AIP end to end, with real processes.

- ``saucer serve`` drives :class:`aip_peers.MiniAipDevice`, a device that
  speaks only AIP (plain JSON from AIP's definition, nothing of saucer's),
  connecting with its token in the URL's query as UFO's client does; the
  token never shows in the server's output, access log included, and the
  session's ``DEVICE_INFO`` (``saucer state``) is what the device reported.
- ``saucer device --protocol aip`` joins :class:`aip_peers.MiniAipServer`, a
  UFO-style server, and answers everything it is sent.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.support.aip_peers import MiniAipDevice, MiniAipServer
from tests.support.service import ALICE, FLEET, Processes, auth, free_port, wait_until

pytestmark = pytest.mark.anyio


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


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


async def _ended(http: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    for _ in range(30):
        body = (await http.get(f"/api/sessions/{sid}", params={"wait": 2})).json()
        if body["session"]["status"] in ("finished", "failed", "cancelled"):
            return body
    raise AssertionError(f"session {sid} did not end")


async def test_saucer_serve_drives_a_device_that_speaks_only_aip(processes: Processes, tmp_path: Path) -> None:
    port, store_url = free_port(), f"sqlite:///{tmp_path / 'events.db'}"
    config = tmp_path / "saucer.toml"
    config.write_text(
        f'[service]\ntokens = ["alice={ALICE}", "fleet={FLEET}"]\n[service.devices."ufo-box"]\nprincipals = ["alice"]\n'
    )
    server = processes.spawn(
        "saucer-serve",
        [
            "serve",
            "--port",
            str(port),
            "--state-dir",
            str(tmp_path / "state"),
            "--store",
            store_url,
            "--log-level",
            "debug",
            "--config",
            str(config),
        ],  # uvicorn's access log and the libraries' debug lines
        env={"SAUCER_SERVICE_TOKENS": ""},
        module="saucer",
    )
    await asyncio.to_thread(wait_until, lambda: _healthy(port), 30, "saucer serve to answer /health", server)
    wrong = "wrong-token-0123456789abcdef"
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus) as refused:
        await connect(f"ws://127.0.0.1:{port}/ws?token={wrong}")
    assert refused.value.response.status_code == 401

    device = MiniAipDevice(f"ws://127.0.0.1:{port}/ws?token={FLEET}", "ufo-box")
    answer = await device.start()
    assert answer is not None and (answer["type"], answer["status"]) == ("heartbeat", "ok")
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=auth(ALICE), timeout=30) as http:
            for _ in range(100):
                described = (await http.get("/api/devices/ufo-box")).json()
                if "tools" in described["info"]:
                    break
                await asyncio.sleep(0.1)
            assert described["protocol"] == "aip" and set(described["info"]["tools"]) == {
                "linux.execute_command",
                "linux.wait",
            }
            plan = {
                "task": "hello",
                "steps": [
                    {
                        "subtask": "greet",
                        "commands": [
                            {"tool_name": "execute_command", "parameters": {"command": "echo hello from AIP"}}
                        ],
                    },
                    {
                        "subtask": "check",
                        "commands": [{"tool_name": "execute_command", "parameters": {"command": "test 2 -gt 1"}}],
                    },
                ],
            }
            sid = (await http.post("/api/sessions", json={"device_id": "ufo-box", "task": plan})).json()["session_id"]
            body = await _ended(http, sid)
            assert body["session"]["status"] == "finished", body["session"]
            assert body["steps"][0]["results"][0]["result"]["stdout"] == "hello from AIP\n"
            failing = {
                "task": "exit2",
                "steps": [
                    {
                        "subtask": "ls",
                        "commands": [
                            {"tool_name": "execute_command", "parameters": {"command": "ls /nonexistent-dir"}}
                        ],
                    }
                ],
            }
            fsid = (await http.post("/api/sessions", json={"device_id": "ufo-box", "task": failing})).json()[
                "session_id"
            ]
            failed = await _ended(http, fsid)
            assert failed["session"]["status"] == "failed"
            result = failed["steps"][0]["results"][0]
            assert result["status"] == "failure" and "exit_code 2" in result["error"]
            # The device answered "success" (the call returned); saucer's verdict came from inside the result.
            raw = [m for d, m in device.exchange if d == "device→server" and m["type"] == "command_results"][-1]
            assert (
                raw["action_results"][0]["status"] == "success" and raw["action_results"][0]["result"]["exit_code"] == 2
            )
    finally:
        await device.stop()

    state = _saucer("state", sid, "--store", store_url, "--json")
    assert state.returncode == 0, state.stderr
    [info] = json.loads(state.stdout)["names"]["DEVICE_INFO"]
    assert (info["device_id"], info["protocol"], info["platform"]) == ("ufo-box", "aip", "linux")
    assert info["system_info"]["hostname"] == "ufo-box" and info["system_info"]["cpu_count"] == 4
    assert "tools" not in info  # they are TOOL_INFO's
    table = _saucer("state", sid, "--store", store_url)
    assert table.returncode == 0 and "DEVICE_INFO" in table.stdout and "ufo-box" in table.stdout

    server.kill(signal.SIGTERM)
    server.popen.wait(timeout=20)
    output = server.output()
    assert '"WebSocket /ws?token=***"' in output  # the access log line is there, without the token
    assert FLEET not in output and wrong not in output
    assert "ufo-box" in output or "GET /api/devices" in output


async def test_saucer_device_protocol_aip_joins_a_ufo_style_server(processes: Processes, tmp_path: Path) -> None:
    token = "ufo-server-api-key-0123456789"
    async with MiniAipServer(token=token) as ufo:
        device = processes.spawn(
            "saucer-device-aip",
            [
                "device",
                "--protocol",
                "aip",
                "--server",
                ufo.url,
                "--device-id",
                "saucer-box",
                "--workspace",
                str(tmp_path / "ws"),
                "--yes",
                "--heartbeat-interval",
                "0.5",
                "--backoff-initial",
                "0.1",
                "--log-level",
                "debug",
            ],  # debug: websockets logs each handshake's URL, where the token is
            env={"SAUCER_SERVICE_TOKEN": token},
            module="saucer",
        )
        try:
            await asyncio.wait_for(ufo.connected.wait(), 30)
        except TimeoutError:
            pytest.fail(f"saucer device did not register:\n{device.output()}")
        [register] = ufo.registrations
        assert (register["type"], register["status"], register["client_type"], register["client_id"]) == (
            "register",
            "ok",
            "device",
            "saucer-box",
        )
        assert (
            register["metadata"]["platform"] == "linux"
            and register["metadata"]["system_info"]["device_id"] == "saucer-box"
        )

        rid = await ufo.command([{"tool_name": "list_tools", "tool_type": "action", "call_id": "c0", "parameters": {}}])
        listed = await ufo.reply("command_results", prev_response_id=rid)
        [tools] = listed["action_results"]
        assert tools["status"] == "success" and tools["call_id"] == "c0"
        assert {("shell", "run"), ("files", "write")} <= {(t["namespace"], t["tool_name"]) for t in tools["result"]}

        rid = await ufo.command(
            [
                {"tool_name": "run", "tool_type": "action", "call_id": "c1", "parameters": {"command": "echo hi"}},
                {"tool_name": "run", "tool_type": "action", "call_id": "c2", "parameters": {"command": "exit 2"}},
            ]
        )
        ran = await ufo.reply("command_results", prev_response_id=rid)
        ok, exit2 = ran["action_results"]
        assert (ok["status"], ok["call_id"], ok["namespace"], ok["result"]["stdout"]) == (
            "success",
            "c1",
            "shell",
            "hi\n",
        )
        assert exit2["status"] == "failure" and exit2["call_id"] == "c2" and exit2["result"]["exit_code"] == 2
        assert ran["session_id"] == "s-1" and ran["client_id"] == "saucer-box"

        # An agent it does not serve, no agent at all, an unknown tool: an answer each, saying why.
        for agent, says in (
            ("WeirdAgent", "agent_name 'WeirdAgent' is not served here"),
            (None, "the command names no agent_name"),
        ):
            rid = await ufo.command(
                [{"tool_name": "run", "tool_type": "action", "call_id": "c3", "parameters": {"command": "touch nope"}}],
                agent_name=agent,
            )
            refused = await ufo.reply("command_results", prev_response_id=rid)
            assert refused["status"] == "error" and says in refused["error"] and "LinuxAgent" in refused["error"]
            assert (
                refused["action_results"][0]["status"] == "failure" and refused["action_results"][0]["call_id"] == "c3"
            )
        assert not (tmp_path / "ws" / "nope").exists()
        rid = await ufo.command(
            [
                {"tool_name": "frobnicate", "tool_type": "action", "call_id": "c4"},
                {"tool_name": "run", "tool_type": "action", "call_id": "c5", "parameters": {"command": "echo still"}},
            ]
        )
        mixed = await ufo.reply("command_results", prev_response_id=rid)
        unknown, still = mixed["action_results"]
        assert unknown["status"] == "failure" and "unknown tool 'frobnicate'" in unknown["error"]
        assert still["status"] == "success" and still["result"]["stdout"] == "still\n"

        await ufo.send({"type": "device_info_request", "status": "ok", "response_id": "q1"})
        info = await ufo.reply("device_info_response")
        assert info["request_id"] == "q1" and info["metadata"]["system_info"]["device_id"] == "saucer-box"
        await ufo.send({"type": "dance", "status": "ok"})
        error = await ufo.reply("error")
        assert "unknown_type" in error["error"] and "'dance'" in error["error"]
        await ufo.send({"type": "task", "status": "continue", "user_request": "tidy up", "task_name": "t1"})
        task = await ufo.reply("task")
        assert (task["request"], task["task_name"], task["client_id"]) == ("tidy up", "t1", "saucer-box")
        heartbeat = await ufo.reply("heartbeat", timeout=5)
        assert (heartbeat["status"], heartbeat["client_id"]) == ("ok", "saucer-box")

        wrong = processes.spawn(
            "saucer-device-aip-wrong",
            [
                "device",
                "--protocol",
                "aip",
                "--server",
                ufo.url,
                "--device-id",
                "intruder",
                "--workspace",
                str(tmp_path / "ws2"),
            ],
            env={"SAUCER_SERVICE_TOKEN": "not-the-servers-key-0000"},
            module="saucer",
        )
        code = await asyncio.to_thread(wrong.popen.wait, 30)
        assert code == 3 and "server refused the connection: Invalid or missing token" in wrong.output(), wrong.output()
        assert ufo.refused_tokens == 1
        device.kill(signal.SIGTERM)
        await asyncio.to_thread(device.popen.wait, 20)
    assert token not in device.output() and "GET /ws?token=*** HTTP/1.1" in device.output()
    assert "not-the-servers-key-0000" not in wrong.output()


async def test_saucer_device_protocol_aip_serves_saucer_serve_and_stops_a_cancelled_batch(
    processes: Processes, tmp_path: Path
) -> None:
    port, workspace = free_port(), tmp_path / "ws"
    processes.cli_server(port, tmp_path / "state", f"sqlite:///{tmp_path / 'events.db'}")
    device = processes.spawn(
        "saucer-device-aip",
        [
            "device",
            "--protocol",
            "aip",
            "--server",
            f"ws://127.0.0.1:{port}/ws",
            "--device-id",
            "box",
            "--workspace",
            str(workspace),
            "--yes",
            "--backoff-initial",
            "0.1",
        ],
        env={"SAUCER_SERVICE_TOKEN": FLEET},
        module="saucer",
    )
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=auth(ALICE), timeout=30) as http:
        for _ in range(300):
            listed = await http.get("/api/devices/box")
            if listed.status_code == 200 and "tools" in listed.json()["info"]:
                break
            assert device.popen.poll() is None, device.output()
            await asyncio.sleep(0.1)
        described = listed.json()
        assert described["protocol"] == "aip" and "shell.run" in described["info"]["tools"]
        plan = {
            "task": "hi",
            "steps": [{"commands": [{"tool_name": "shell.run", "parameters": {"command": "echo hi > hi.txt"}}]}],
        }
        sid = (await http.post("/api/sessions", json={"device_id": "box", "task": plan})).json()["session_id"]
        assert (await _ended(http, sid))["session"]["status"] == "finished"
        assert (workspace / "hi.txt").read_text() == "hi\n"
        long = {
            "task": "long",
            "timeout": 120,
            "steps": [
                {
                    "commands": [
                        {
                            "tool_name": "shell.run",
                            "parameters": {"command": "touch started; sleep 30; touch finished", "timeout": 120},
                        }
                    ]
                }
            ],
        }
        sid = (await http.post("/api/sessions", json={"device_id": "box", "task": long})).json()["session_id"]
        for _ in range(300):
            if (workspace / "started").exists():
                break
            await asyncio.sleep(0.05)
        cancelled = (await http.post(f"/api/sessions/{sid}/cancel")).json()
        # The AIP cancel (task_end naming the batch) stopped it on the device, which answered: acknowledged.
        assert cancelled["status"] == "cancelled" and cancelled["error"] == "cancelled by alice", cancelled
    await asyncio.sleep(0.5)
    assert not (workspace / "finished").exists()
