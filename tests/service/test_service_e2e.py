"""End to end on loopback: a server process, device processes, HTTP and WebSocket clients.

The module shares one server (heartbeat 0.5 s, 3 missed = 1.5 s liveness
window, 64 KiB frames) with devices ``dev-a`` and ``dev-b``; tests that kill a
device start their own device process on that server.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from tests.support.service import ALICE, BOB, FLEET, Cluster, auth, device_online, wait_until
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

pytestmark = pytest.mark.anyio

LIVENESS_WINDOW = 0.5 * 3


def _plan(*steps: list[dict[str, Any]], name: str = "plan") -> dict[str, Any]:
    return {"task": name, "steps": [{"subtask": f"step {i}", "commands": cmds} for i, cmds in enumerate(steps)]}


def _append(path: Path, line: str, seconds: float = 0.0) -> dict[str, Any]:
    return {"tool_name": "append", "parameters": {"path": str(path), "line": line, "seconds": seconds}}


async def _submit(http: httpx.AsyncClient, device_id: str, task: dict[str, Any]) -> str:
    response = await http.post("/api/sessions", json={"device_id": device_id, "task": task})
    assert response.status_code == 201, response.text
    return response.json()["session_id"]


async def _finished(http: httpx.AsyncClient, session_id: str, timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = await http.get(f"/api/sessions/{session_id}", params={"wait": 2})
        assert response.status_code == 200, response.text
        body = response.json()
        if body["session"]["status"] in ("finished", "failed", "cancelled"):
            return body
    pytest.fail(f"session {session_id} did not end within {timeout} s")


@contextlib.asynccontextmanager
async def _ws(cluster: Cluster, token: str, **kwargs: Any) -> AsyncIterator[ClientConnection]:
    async with connect(
        cluster.ws, additional_headers=auth(token), ping_interval=None, compression=None, max_size=2**22, **kwargs
    ) as ws:
        yield ws


async def _send(ws: ClientConnection, frame: dict[str, Any] | str) -> None:
    await ws.send(frame if isinstance(frame, str) else orjson.dumps(frame).decode())


async def _recv(ws: ClientConnection, timeout: float = 5.0) -> dict[str, Any]:
    """The next frame that is not a heartbeat_ack."""
    async with asyncio.timeout(timeout):
        while True:
            frame = orjson.loads(await ws.recv())
            if frame["type"] != "heartbeat_ack":
                return frame


async def _register(ws: ClientConnection, client_id: str, role: str = "device") -> dict[str, Any]:
    await _send(ws, {"type": "register", "role": role, "client_id": client_id})
    frame = await _recv(ws)
    assert frame["type"] == "registered", frame
    return frame


async def _still_up(ws: ClientConnection) -> None:
    await _send(ws, {"type": "heartbeat", "sent_at": 1.0})
    async with asyncio.timeout(5):
        assert orjson.loads(await ws.recv()) == {"protocol_version": 1, "type": "heartbeat_ack", "sent_at": 1.0}


@contextlib.asynccontextmanager
async def _heartbeating(ws: ClientConnection) -> AsyncIterator[None]:
    """Keep a raw device connection alive while a test takes its time."""

    async def beat() -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                await _send(ws, {"type": "heartbeat"})
                await asyncio.sleep(0.2)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_two_devices_run_tasks_concurrently_for_one_client(cluster: Cluster, tmp_path: Path) -> None:
    async with httpx.AsyncClient(base_url=cluster.http, headers=auth(ALICE)) as http:
        files = {name: tmp_path / f"{name}.txt" for name in ("dev-a", "dev-b")}
        ids = {
            name: await _submit(
                http,
                name,
                _plan([_append(path, f"{name}-0", 0.2), {"tool_name": "whoami"}], [_append(path, f"{name}-1")]),
            )
            for name, path in files.items()
        }
        bodies = await asyncio.gather(*(_finished(http, sid) for sid in ids.values()))
        for (name, path), body in zip(files.items(), bodies, strict=False):
            assert body["session"]["status"] == "finished", body["session"]["error"]
            assert body["session"]["device_id"] == name
            first = body["steps"][0]["results"]
            # The command ran in that device's own process, and call_ids survived the trip.
            assert first[1]["result"]["pid"] == cluster.devices[name].popen.pid
            assert [r["call_id"] for r in first] == [f"{ids[name]}.0.0", f"{ids[name]}.0.1"]
            assert path.read_text().splitlines() == [f"{name}-0", f"{name}-1"]
        listed = {s["session_id"] for s in (await http.get("/api/sessions")).json()["sessions"]}
        assert set(ids.values()) <= listed


async def test_http_api_requires_a_valid_token(cluster: Cluster) -> None:
    async with httpx.AsyncClient(base_url=cluster.http) as http:
        assert (await http.get("/health")).status_code == 200
        for headers in ({}, auth("not-a-real-token-at-all"), {"Authorization": ALICE}):
            response = await http.get("/api/devices", headers=headers)
            assert response.status_code == 401
            assert response.headers["www-authenticate"] == "Bearer"
            assert response.json()["error"]["code"] == "unauthorized"
        response = await http.post("/api/sessions", json={}, headers=auth("not-a-real-token-at-all"))
        assert response.status_code == 401
        assert (await http.get("/api/devices", headers=auth(BOB))).status_code == 200


async def test_websocket_refuses_a_wrong_token_at_the_handshake(cluster: Cluster) -> None:
    with pytest.raises(InvalidStatus) as info:
        async with _ws(cluster, "not-a-real-token-at-all"):
            pass
    assert info.value.response.status_code == 401
    assert b"unauthorized" in info.value.response.body
    # A device process with a wrong token stops with a clear message instead of retrying forever.
    proc = cluster.procs.device(cluster.port, "dev-wrong", token="not-a-real-token-at-all", wait=False)
    wait_until(lambda: proc.popen.poll() is not None, 15, "the device with a wrong token to exit")
    assert proc.popen.returncode == 3
    assert "refused the token (HTTP 401)" in proc.output()


async def test_sessions_belong_to_their_submitter(cluster: Cluster) -> None:
    async with (
        httpx.AsyncClient(base_url=cluster.http, headers=auth(ALICE)) as alice,
        httpx.AsyncClient(base_url=cluster.http, headers=auth(BOB)) as bob,
    ):
        sid = await _submit(alice, "dev-a", _plan([{"tool_name": "echo", "parameters": {"secret": 42}}]))
        done = await _finished(alice, sid)
        assert done["session"]["owner"] == "alice"
        assert done["steps"][0]["results"][0]["result"] == {"secret": 42}
        # Another client cannot read, cancel or list it: the same 404 as an id that never existed.
        for response in (
            await bob.get(f"/api/sessions/{sid}"),
            await bob.get(f"/api/sessions/{sid}/results"),
            await bob.post(f"/api/sessions/{sid}/cancel"),
            await alice.get(f"/api/sessions/{uuid.uuid4().hex}"),
        ):
            assert response.status_code == 404
            assert response.json()["error"]["code"] == "unknown_session"
        assert sid not in {s["session_id"] for s in (await bob.get("/api/sessions")).json()["sessions"]}
        results = (await alice.get(f"/api/sessions/{sid}/results")).json()
        assert results["status"] == "finished" and results["results"][0]["results"][0]["result"] == {"secret": 42}
        # Clients cannot choose (or replay) a session id.
        replay = await alice.post(
            "/api/sessions", json={"session_id": sid, "device_id": "dev-a", "task": _plan([{"tool_name": "echo"}])}
        )
        assert replay.status_code == 422 and "assigned by the server" in replay.json()["error"]["message"]
        # Bad submissions get precise errors.
        assert (await alice.post("/api/sessions", content=b"{nope")).status_code == 400
        empty_step = {"task": "empty", "steps": [{"subtask": "nothing", "commands": []}]}
        unknown = await alice.post("/api/sessions", json={"device_id": "dev-zzz", "task": empty_step})
        assert unknown.status_code == 422  # a step without commands is refused before the device is looked up
        assert "task.steps.0: a step needs at least one command" in unknown.json()["error"]["message"]
        unknown = await alice.post(
            "/api/sessions", json={"device_id": "dev-zzz", "task": _plan([{"tool_name": "echo"}])}
        )
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_device"
        invalid = await alice.post(
            "/api/sessions",
            json={"device_id": "dev-a", "task": {"task": "x", "steps": [{"commands": [{"tool_name": ""}]}]}},
        )
        assert invalid.status_code == 422 and "task.steps.0.commands.0.tool_name" in invalid.json()["error"]["message"]
        huge = await alice.post("/api/sessions", content=b"x" * (70 * 1024))
        assert huge.status_code == 413
        # Ended sessions cannot be cancelled; they stay readable.
        assert (await alice.post(f"/api/sessions/{sid}/cancel")).status_code == 409


async def test_bad_frames_get_error_frames_and_the_connection_stays_up(cluster: Cluster) -> None:
    async with _ws(cluster, ALICE) as ws:
        await _send(ws, {"type": "heartbeat"})
        assert (await _recv(ws))["code"] == "not_registered"
        registered = await _register(ws, "alice-cli", role="client")
        assert registered["max_frame_bytes"] == 64 * 1024 and registered["server_instance"]
        cases = [
            ("{this is not json", "malformed_json"),
            ('"just a string"', "not_an_object"),
            ('{"type": "warp_drive"}', "unknown_type"),
            ('{"type": "heartbeat", "protocol_version": 9}', "unsupported_version"),
            ('{"type": "heartbeat", "extra": true}', "invalid_frame"),
            (
                '{"type": "command", "response_id": "r", "session_id": "s", "commands": [], "timeout": 1}',
                "unexpected_frame",
            ),
            (
                '{"type": "command_results", "prev_response_id": "r", "session_id": "s", "results": []}',
                "unexpected_frame",
            ),
            ('{"type": "register", "client_id": "again"}', "already_registered"),
            ('{"type": "task_end", "session_id": "someone-elses", "status": "cancelled"}', "unexpected_frame"),
            ('{"type": "heartbeat", "pad": "' + "x" * (70 * 1024) + '"}', "frame_too_large"),
        ]
        for raw, code in cases:
            await _send(ws, raw)
            error = await _recv(ws)
            assert (error["type"], error["code"]) == ("error", code), raw[:80]
            assert error["message"]
            await _still_up(ws)
        # Far beyond the limit the frame is not even buffered: the connection closes with 1009.
        await _send(ws, "x" * (300 * 1024))
        with pytest.raises(ConnectionClosed) as info:
            await _recv(ws)
        assert info.value.rcvd is not None and info.value.rcvd.code == 1009


async def test_forged_and_replayed_response_ids_are_refused(cluster: Cluster) -> None:
    async with (
        httpx.AsyncClient(base_url=cluster.http, headers=auth(ALICE)) as http,
        _ws(cluster, FLEET) as device,
        _ws(cluster, FLEET) as other_device,
        _ws(cluster, BOB) as client,
    ):
        await _register(device, "dev-raw")
        await _register(other_device, "dev-raw-2")
        await _register(client, "bob-cli", role="client")
        async with _heartbeating(device), _heartbeating(other_device):
            sid = await _submit(http, "dev-raw", _plan([{"tool_name": "echo", "parameters": {"v": 1}}]))
            command = await _recv(device)
            assert command["type"] == "command" and command["session_id"] == sid
            rid, call_id = command["response_id"], command["commands"][0]["call_id"]

            def answer(result: str, **overrides: str) -> dict[str, Any]:
                frame = {
                    "type": "command_results",
                    "prev_response_id": rid,
                    "session_id": sid,
                    "results": [{"status": "success", "result": result, "call_id": call_id}],
                }
                return {**frame, **overrides}

            forged = uuid.uuid4().hex
            await _send(device, answer("forged", prev_response_id=forged))
            error = await _recv(device)
            assert (error["code"], error["ref"]) == ("unknown_response", forged)
            await _send(device, answer("wrong session", session_id=uuid.uuid4().hex))
            assert (await _recv(device))["code"] == "session_mismatch"
            # Another device cannot answer dev-raw's commands, nor can a client.
            await _send(other_device, answer("hijack"))
            assert (await _recv(other_device))["code"] == "unknown_response"
            await _send(client, answer("hijack"))
            assert (await _recv(client))["code"] == "unexpected_frame"

            await _send(device, answer("genuine"))
            done = await _finished(http, sid)
            assert done["session"]["status"] == "finished"
            assert done["steps"][0]["results"][0]["result"] == "genuine"

            await _send(device, answer("replayed"))
            error = await _recv(device)
            assert error["code"] == "unknown_response" and "already answered" in error["message"]
            again = (await http.get(f"/api/sessions/{sid}")).json()
            assert again["steps"][0]["results"][0]["result"] == "genuine"

    # A device id is pinned to its token: alice cannot register as the fleet's dev-a.
    async with _ws(cluster, ALICE) as impostor:
        await _send(impostor, {"type": "register", "role": "device", "client_id": "dev-a"})
        error = await _recv(impostor)
        assert error["code"] == "device_owned"
        with pytest.raises(ConnectionClosed):
            await _recv(impostor)
    assert device_online(cluster.port, "dev-a")


async def test_a_websocket_client_submits_a_task_and_is_told_when_it_ends(cluster: Cluster) -> None:
    async with _ws(cluster, BOB) as ws:
        await _register(ws, "bob-cli", role="client")
        task = _plan([{"tool_name": "echo", "parameters": {"via": "ws"}}], name="over ws")
        await _send(ws, {"type": "task", "task": task, "target_device_id": "dev-b", "request_id": "q1"})
        accepted = await _recv(ws)
        assert accepted["type"] == "task_accepted" and accepted["request_id"] == "q1"
        assert accepted["device_id"] == "dev-b"
        sid = accepted["session_id"]
        end = await _recv(ws, timeout=15)
        assert end["type"] == "task_end" and end["session_id"] == sid and end["status"] == "completed"
        assert end["results"][0]["results"][0]["result"] == {"via": "ws"}

        await _send(ws, {"type": "task", "task": task, "target_device_id": "dev-nowhere", "request_id": "q2"})
        error = await _recv(ws)
        assert (error["code"], error["ref"]) == ("unknown_device", "q2")
        await _send(ws, {"type": "task", "task": task, "request_id": "q3"})
        assert (await _recv(ws))["code"] == "invalid_task"

    async with (
        httpx.AsyncClient(base_url=cluster.http, headers=auth(BOB)) as bob,
        httpx.AsyncClient(base_url=cluster.http, headers=auth(ALICE)) as alice,
    ):
        assert (await bob.get(f"/api/sessions/{sid}")).json()["session"]["status"] == "finished"
        assert (await alice.get(f"/api/sessions/{sid}")).status_code == 404


async def test_a_tool_error_on_the_device_fails_the_session_promptly(cluster: Cluster) -> None:
    async with httpx.AsyncClient(base_url=cluster.http, headers=auth(ALICE)) as http:
        started = time.monotonic()
        sid = await _submit(
            http,
            "dev-a",
            _plan([{"tool_name": "raise", "parameters": {"message": "disk on fire"}}, {"tool_name": "echo"}]),
        )
        done = await _finished(http, sid)
        assert time.monotonic() - started < 5
        assert done["session"]["status"] == "failed"
        assert "RuntimeError: disk on fire" in done["session"]["error"]
        assert device_online(cluster.port, "dev-a")


async def _kill_mid_command(cluster: Cluster, tmp_path: Path, device_id: str, sig: int) -> tuple[float, dict[str, Any]]:
    proc = cluster.procs.device(cluster.port, device_id)
    marker = tmp_path / f"{device_id}.txt"
    async with httpx.AsyncClient(base_url=cluster.http, headers=auth(ALICE)) as http:
        task = _plan([_append(marker, "started", seconds=30)], name="long")
        task["timeout"] = 60
        sid = await _submit(http, device_id, task)
        async with asyncio.timeout(15):
            while not (marker.exists() and marker.read_text()):
                await asyncio.sleep(0.02)
        started = time.monotonic()
        proc.kill(sig)
        done = await _finished(http, sid, timeout=15)
        elapsed = time.monotonic() - started
        device = (await http.get(f"/api/devices/{device_id}")).json()
        assert device["online"] is False
    proc.kill(signal.SIGKILL)
    return elapsed, done


async def test_device_killed_mid_command_fails_the_session_within_the_liveness_window(
    cluster: Cluster, tmp_path: Path
) -> None:
    elapsed, done = await _kill_mid_command(cluster, tmp_path, "dev-kill", signal.SIGKILL)
    assert done["session"]["status"] == "failed"
    assert "'dev-kill' disconnected" in done["session"]["error"]
    assert elapsed < LIVENESS_WINDOW + 1.0, elapsed  # not the 30 s command, not the 60 s timeout


async def test_device_frozen_mid_command_is_declared_offline_after_missed_heartbeats(
    cluster: Cluster, tmp_path: Path
) -> None:
    elapsed, done = await _kill_mid_command(cluster, tmp_path, "dev-frozen", signal.SIGSTOP)
    assert done["session"]["status"] == "failed"
    assert "missed 3 heartbeats" in done["session"]["error"]
    assert elapsed < LIVENESS_WINDOW + 2.0, elapsed


async def test_cancel_ends_a_running_session_and_keeps_what_it_did(cluster: Cluster, tmp_path: Path) -> None:
    marker = tmp_path / "cancel.txt"
    async with (
        httpx.AsyncClient(base_url=cluster.http, headers=auth(ALICE)) as alice,
        httpx.AsyncClient(base_url=cluster.http, headers=auth(BOB)) as bob,
    ):
        sid = await _submit(alice, "dev-b", _plan([_append(marker, "first")], [_append(marker, "second", 20)]))
        async with asyncio.timeout(10):
            while len(marker.read_text().splitlines() if marker.exists() else []) < 2:
                await asyncio.sleep(0.02)
        assert (await bob.post(f"/api/sessions/{sid}/cancel")).status_code == 404
        cancelled = await alice.post(f"/api/sessions/{sid}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        results = (await alice.get(f"/api/sessions/{sid}/results")).json()
        assert results["status"] == "cancelled" and results["error"] == "cancelled by alice"
        assert [s["index"] for s in results["results"]] == [0]  # the committed step stays readable
        assert device_online(cluster.port, "dev-b")
