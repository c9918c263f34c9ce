"""Cancel reaches the device; dead client connections are found; refusals and dead pipes are one line."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from tests.support.service import ALICE, Processes, auth, free_port, wait_until
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from saucer.service.server import ServiceConfig, running_server

pytestmark = pytest.mark.anyio


def _live_in_group(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that have not exited (zombies waiting to be reaped count as gone)."""
    live = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            live.append(int(entry))
    return live


def test_cancel_kills_the_running_shell_command_on_the_device_within_a_second_and_a_dead_device_its_own(
    processes: Processes, tmp_path: Path
) -> None:
    port, workspace = free_port(), tmp_path / "workspace"
    processes.cli_server(port, tmp_path / "state", f"sqlite:///{tmp_path / 'events.db'}")
    # Isolated: the end of this test is about the stdio shell server seeing its client die (in-process, the
    # tools die with the device; tests/dispatch/test_inprocess_tools.py checks their commands die too).
    device = processes.cli_device(port, "dev-cancel", workspace, env={"SAUCER_MCP__ISOLATE": "true"})
    plan = {
        "task": "long",
        "timeout": 120,
        "steps": [
            {
                "subtask": "wait",
                "commands": [
                    {
                        "tool_name": "shell.run",
                        "parameters": {"command": "echo $$ > pgid.txt; sleep 30", "timeout": 120},
                    }
                ],
            }
        ],
    }
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=auth(ALICE), timeout=30) as http:
        sid = http.post("/api/sessions", json={"device_id": "dev-cancel", "task": plan}).json()["session_id"]
        pgid_file = workspace / "pgid.txt"
        wait_until(
            lambda: pgid_file.exists() and pgid_file.read_text().strip() != "", 30, "the command to start", device
        )
        pgid = int(pgid_file.read_text())
        wait_until(lambda: len(_live_in_group(pgid)) == 2, 10, "the shell and its sleep to run")

        started = time.monotonic()
        cancelled = http.post(f"/api/sessions/{sid}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        # The answer came after the device acknowledged: no note about a missing acknowledgement.
        assert cancelled.json()["error"] == "cancelled by alice"
        while _live_in_group(pgid) and time.monotonic() - started < 1.0:
            time.sleep(0.01)
        assert _live_in_group(pgid) == [], "the sleep 30 still runs on the device a second after the cancel"

        # The device goes on serving.
        again = http.post(
            "/api/sessions",
            json={
                "device_id": "dev-cancel",
                "task": {
                    "task": "after",
                    "steps": [{"commands": [{"tool_name": "shell.run", "parameters": {"command": "echo alive"}}]}],
                },
            },
        )
        sid2 = again.json()["session_id"]
        wait_until(
            lambda: http.get(f"/api/sessions/{sid2}").json()["session"]["status"] == "finished",
            30,
            "a session after the cancel",
            device,
        )

        # Killed outright, the device takes its running command with it: its shell server sees the client
        # gone, stops the command, and says so in one line (no BrokenPipe traceback).
        last = {
            "task": "t",
            "steps": [
                {
                    "commands": [
                        {
                            "tool_name": "shell.run",
                            "parameters": {"command": "touch started; sleep 1; echo finished > done"},
                        }
                    ]
                }
            ],
        }
        http.post("/api/sessions", json={"device_id": "dev-cancel", "task": last})
        wait_until(lambda: (workspace / "started").exists(), 30, "the last command to start", device)
    device.kill(signal.SIGKILL)
    wait_until(lambda: "broken pipe" in device.output(), 10, "the shell server to notice the dead client")
    time.sleep(1.5)
    assert not (workspace / "done").exists()  # the command did not outlive its device
    assert "Traceback" not in device.output(), device.output()
    assert device.output().count("saucer-shell: warning: the client closed the connection (broken pipe)") == 1


class RawDevice:
    """A hand-driven device connection: it registers, heartbeats, and does what the test says with frames."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.frames: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def run(self) -> None:
        async def beat() -> None:
            while True:
                await self.ws.send('{"type": "heartbeat"}')
                await asyncio.sleep(0.2)

        beating = asyncio.create_task(beat())
        try:
            async for raw in self.ws:
                frame = orjson.loads(raw)
                if frame["type"] != "heartbeat_ack":
                    await self.frames.put(frame)
        except ConnectionClosed:
            pass
        finally:
            beating.cancel()

    async def next(self, kind: str) -> dict[str, Any]:
        frame = await asyncio.wait_for(self.frames.get(), 10)
        assert frame["type"] == kind, frame
        return frame


def _config(**overrides: Any) -> ServiceConfig:
    settings: dict[str, Any] = dict(port=0, tokens={"alice": ALICE}, state_dir=None, heartbeat_interval=1.0)
    settings.update(overrides)
    return ServiceConfig(**settings)


@pytest.mark.parametrize("behaviour", ["acknowledges", "ignores", "vanishes"])
async def test_cancel_waits_for_the_device_acknowledgement_or_its_loss(behaviour: str) -> None:
    async with (
        running_server(_config(cancel_timeout=0.5)) as server,
        connect(server.ws_url, additional_headers=auth(ALICE), ping_interval=None) as ws,
    ):
        await ws.send(orjson.dumps({"type": "register", "role": "device", "client_id": "raw"}).decode())
        assert orjson.loads(await ws.recv())["type"] == "registered"
        device = RawDevice(ws)
        reader = asyncio.create_task(device.run())
        async with httpx.AsyncClient(base_url=server.http_url, headers=auth(ALICE)) as http:
            plan = {"task": "t", "steps": [{"commands": [{"tool_name": "sleep", "parameters": {"seconds": 30}}]}]}
            sid = (await http.post("/api/sessions", json={"device_id": "raw", "task": plan})).json()["session_id"]
            command = await device.next("command")
            cancel_call = asyncio.create_task(http.post(f"/api/sessions/{sid}/cancel"))
            cancel = await device.next("cancel")
            assert (cancel["response_id"], cancel["session_id"]) == (command["response_id"], sid)
            assert not cancel_call.done()  # the session is not cancelled before the device answers
            if behaviour == "acknowledges":
                results = [
                    {"status": "failure", "error": "cancelled", "call_id": c["call_id"]} for c in command["commands"]
                ]
                await ws.send(
                    orjson.dumps(
                        {
                            "type": "command_results",
                            "prev_response_id": command["response_id"],
                            "session_id": sid,
                            "results": results,
                        }
                    ).decode()
                )
            elif behaviour == "vanishes":
                await ws.close()
            answer = (await cancel_call).json()
        reader.cancel()
    assert answer["status"] == "cancelled"
    expected = {
        "acknowledges": "cancelled by alice",
        "ignores": "cancelled by alice; device 'raw' did not acknowledge the cancel within 0.5 s; "
        "its commands may still be running",
        "vanishes": "cancelled by alice; device 'raw' went away or refused the cancel without acknowledging it",
    }[behaviour]
    assert answer["error"] == expected


async def test_a_dead_client_connection_is_closed_by_websocket_pings() -> None:
    async with running_server(_config(heartbeat_interval=0.2, missed_heartbeats=2)) as server:
        async with connect(server.ws_url, additional_headers=auth(ALICE), ping_interval=None) as ws:
            await ws.send(orjson.dumps({"type": "register", "role": "client", "client_id": "sleepy"}).decode())
            assert orjson.loads(await ws.recv())["type"] == "registered"
            ws.transport.pause_reading()  # a peer that is gone: no pong will ever come back
            await asyncio.sleep(0.2 * 3 + 1.0)
            ws.transport.resume_reading()
            with pytest.raises(ConnectionClosed) as info:
                while True:
                    await asyncio.wait_for(ws.recv(), 5)
            assert info.value.rcvd is not None and info.value.rcvd.code == 1011  # keepalive ping timeout
        # A live client is not affected: its library answers the pings.
        async with connect(server.ws_url, additional_headers=auth(ALICE), ping_interval=None) as ws:
            await ws.send(orjson.dumps({"type": "register", "role": "client", "client_id": "awake"}).decode())
            await ws.recv()
            await asyncio.sleep(1.2)
            await ws.send('{"type": "heartbeat"}')
            assert orjson.loads(await ws.recv())["type"] == "heartbeat_ack"


async def test_a_refused_handshake_is_one_warning_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with running_server(_config()) as server:
        with pytest.raises(InvalidStatus):
            async with connect(server.ws_url, additional_headers=auth("not-the-token-at-all"), ping_interval=None):
                pass
        await asyncio.sleep(0.2)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "refused a WebSocket connection from 127.0.0.1:" in warnings[0]
    assert "Traceback" not in caplog.text
