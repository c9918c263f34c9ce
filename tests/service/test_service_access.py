"""Devices belong to principals: cross-principal list, submit, info and cancel against real server and device processes."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from tests.support.service import ALICE, BOB, FLEET, OPS, Processes, auth, device_online, free_port, wait_until
from websockets.asyncio.client import connect

from saucer.service.server import ServiceConfig, create_app

SHARE = {"shared-box": ["bob"]}


def _plan(*commands: dict[str, Any]) -> dict[str, Any]:
    return {"task": "t", "steps": [{"subtask": "s", "commands": list(commands)}]}


def _ids(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [d["device_id"] for d in response.json()["devices"]]


def _wait_status(http: httpx.Client, sid: str, statuses: tuple[str, ...], timeout: float = 20) -> dict[str, Any]:
    body: dict[str, Any] = {}

    def ended() -> bool:
        nonlocal body
        body = http.get(f"/api/sessions/{sid}", params={"wait": 1}).json()
        return body["session"]["status"] in statuses

    wait_until(ended, timeout, f"session {sid} to reach {statuses}")
    return body


async def _ws_frames(port: int, token: str, frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Register as a client, send ``frames`` and return the answer to each."""
    answers = []
    async with connect(f"ws://127.0.0.1:{port}/ws", additional_headers=auth(token), ping_interval=None) as ws:
        await ws.send(orjson.dumps({"type": "register", "role": "client", "client_id": "probe"}).decode())
        assert orjson.loads(await ws.recv())["type"] == "registered"
        for frame in frames:
            await ws.send(orjson.dumps(frame).decode())
            answers.append(orjson.loads(await asyncio.wait_for(ws.recv(), 5)))
    return answers


def test_a_device_is_only_seen_and_used_by_its_owner_those_it_is_shared_with_and_admins(
    processes: Processes, tmp_path: Path
) -> None:
    port, state = free_port(), tmp_path / "state"
    server = processes.server(port, state, share=SHARE)
    processes.device(port, "alice-box", token=ALICE)
    processes.device(port, "shared-box", token=FLEET, wait=False)
    wait_until(lambda: device_online(port, "shared-box", token=BOB), 20, "shared-box to register")
    base = f"http://127.0.0.1:{port}"
    with (
        httpx.Client(base_url=base, headers=auth(ALICE), timeout=10) as alice,
        httpx.Client(base_url=base, headers=auth(BOB), timeout=10) as bob,
        httpx.Client(base_url=base, headers=auth(OPS), timeout=10) as ops,
        httpx.Client(base_url=base, headers=auth(FLEET), timeout=10) as fleet,
    ):
        # Listing: each principal sees what it may use, nothing else (no hostname, pid or workspace leaks).
        assert _ids(alice.get("/api/devices")) == ["alice-box"]
        assert _ids(bob.get("/api/devices")) == ["shared-box"]
        assert _ids(fleet.get("/api/devices")) == ["shared-box"]
        assert _ids(ops.get("/api/devices")) == ["alice-box", "shared-box"]
        assert alice.get("/api/devices/alice-box").json()["owner"] == "alice"

        # Someone else's device answers exactly like an id that never registered.
        for path in ("/api/devices/{}", "/api/devices/{}/info", "/api/devices/{}/grants"):
            theirs, unknown = bob.get(path.format("alice-box")), bob.get(path.format("no-such-box"))
            assert theirs.status_code == unknown.status_code == 404
            assert theirs.json()["error"]["message"].replace("alice-box", "X") == unknown.json()["error"][
                "message"
            ].replace("no-such-box", "X")
        for device_id in ("alice-box", "no-such-box"):
            refused = bob.post("/api/sessions", json={"device_id": device_id, "task": _plan({"tool_name": "whoami"})})
            assert refused.status_code == 404 and refused.json()["error"]["code"] == "unknown_device"
        task_answer, info_answer = asyncio.run(
            _ws_frames(
                port,
                BOB,
                [
                    {
                        "type": "task",
                        "task": _plan({"tool_name": "whoami"}),
                        "target_device_id": "alice-box",
                        "request_id": "q",
                    },
                    {"type": "device_info_request", "request_id": "i", "device_id": "alice-box"},
                ],
            )
        )
        assert (task_answer["code"], task_answer["ref"]) == ("unknown_device", "q")
        assert (info_answer["code"], info_answer["ref"]) == ("unknown_device", "i")

        # Sharing by configuration, and the admin, work; a session is cancelled by those who see it (its owner,
        # its participants, an admin: saucer.service.sessions.sees_session), recorded as the one who cancelled.
        shared = bob.post("/api/sessions", json={"device_id": "shared-box", "task": _plan({"tool_name": "whoami"})})
        assert shared.status_code == 201
        assert _wait_status(bob, shared.json()["session_id"], ("finished",))["session"]["owner"] == "bob"
        admin = ops.post("/api/sessions", json={"device_id": "alice-box", "task": _plan({"tool_name": "echo"})})
        assert admin.status_code == 201
        long = alice.post(
            "/api/sessions",
            json={"device_id": "alice-box", "task": _plan({"tool_name": "sleep", "parameters": {"seconds": 30}})},
        )
        sid = long.json()["session_id"]
        _wait_status(alice, sid, ("running",))
        assert bob.post(f"/api/sessions/{sid}/cancel").status_code == 404  # bob does not even see it
        assert alice.get(f"/api/sessions/{sid}").json()["session"]["status"] == "running"
        by_admin = ops.post(f"/api/sessions/{sid}/cancel")
        assert by_admin.status_code == 200 and by_admin.json()["status"] == "cancelled"
        assert alice.get(f"/api/sessions/{sid}").json()["session"]["error"].startswith("cancelled by ops")

        # Grants through the API: only the owner (or an admin) manages them; they are durable.
        assert bob.put("/api/devices/alice-box/grants/bob").status_code == 404
        assert alice.put("/api/devices/alice-box/grants/nobody").status_code == 422
        granted = alice.put("/api/devices/alice-box/grants/bob")
        assert granted.status_code == 200 and granted.json()["granted"] == ["bob"]
        assert _ids(bob.get("/api/devices")) == ["alice-box", "shared-box"]
        forbidden = bob.put("/api/devices/alice-box/grants/fleet")
        assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "not_device_owner"
        ran = bob.post("/api/sessions", json={"device_id": "alice-box", "task": _plan({"tool_name": "whoami"})})
        assert _wait_status(bob, ran.json()["session_id"], ("finished",))["session"]["device_id"] == "alice-box"
        assert ops.get("/api/devices/shared-box/grants").json() == {
            "device_id": "shared-box",
            "owner": "fleet",
            "configured": ["bob"],
            "granted": [],
        }

    server.kill(signal.SIGTERM)
    server.popen.wait(timeout=20)
    processes.server(port, state, share=SHARE)
    with (
        httpx.Client(base_url=base, headers=auth(ALICE), timeout=10) as alice,
        httpx.Client(base_url=base, headers=auth(BOB), timeout=10) as bob,
    ):
        wait_until(lambda: device_online(port, "alice-box", token=BOB), 20, "the grant to survive the restart")
        wait_until(lambda: device_online(port, "shared-box", token=BOB), 20, "shared-box to reconnect")
        revoked = alice.delete("/api/devices/alice-box/grants/bob")
        assert revoked.status_code == 200 and revoked.json()["granted"] == []
        assert alice.delete("/api/devices/alice-box/grants/bob").status_code == 404
        assert _ids(bob.get("/api/devices")) == ["shared-box"]
        again = bob.post("/api/sessions", json={"device_id": "alice-box", "task": _plan({"tool_name": "whoami"})})
        assert again.status_code == 404


def test_a_device_id_pinned_to_an_owner_in_the_config_cannot_be_taken(processes: Processes, tmp_path: Path) -> None:
    port = free_port()
    processes.server(port, tmp_path / "state", share={"reserved": {"owner": "alice", "principals": ["bob"]}})
    squatter = processes.device(port, "reserved", token=BOB, wait=False)  # bob may use it, not register it
    wait_until(lambda: squatter.popen.poll() is not None, 20, "bob's device to be refused")
    assert squatter.popen.returncode == 3 and "device_owned" in squatter.output()
    processes.device(port, "reserved", token=ALICE)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=auth(BOB), timeout=10) as bob:
        assert bob.get("/api/devices/reserved").json()["owner"] == "alice"


def test_a_sharing_config_naming_an_unknown_principal_is_refused() -> None:
    config = ServiceConfig(
        port=0,
        tokens={"alice": ALICE, "bob": BOB},
        state_dir=None,
        devices={"laptop": {"principals": ["bbo"]}},
        admins=["root"],
    )
    with pytest.raises(ValueError) as info:
        create_app(config)
    message = str(info.value)
    assert "service.devices.laptop.principals names 'bbo'" in message and "service.admins names 'root'" in message
    assert "principals with tokens: alice, bob" in message and "\n" not in message
