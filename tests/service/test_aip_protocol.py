"""AIP conformance: every message type of AIP's definition, both directions, and what is refused.

The unit tests read and write each message type with :mod:`saucer.service.aip`
and translate it to and from saucer's frames. The wire tests run a server in
this process and talk to it with :class:`aip_peers.MiniAipDevice` (plain JSON,
written from AIP's definition, nothing of saucer's).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from tests.support.aip_peers import MiniAipDevice
from tests.support.service import ALICE, BOB, auth
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from saucer.dispatch.messages import Command, Result, ResultStatus
from saucer.service.aip import (
    AIP_CLIENT_TYPES,
    AIP_SERVER_TYPES,
    AipResult,
    inner_failure,
    parse_aip,
    result_from_aip,
    tool_listing,
    tools_from_listing,
)
from saucer.service.aip_server import AipServerDialect, InfoPush, TaskEndNotice, agent_name_for
from saucer.service.protocol import (
    CancelFrame,
    CommandFrame,
    CommandResultsFrame,
    DeviceInfoRequestFrame,
    DeviceInfoResponseFrame,
    ErrorFrame,
    HeartbeatAckFrame,
    HeartbeatFrame,
    ProtocolError,
    RegisteredFrame,
    RegisterFrame,
    TaskAcceptedFrame,
    TaskEndFrame,
    TaskFrame,
)
from saucer.service.server import ServiceConfig, running_server

# One valid message of each client type, as AIP's definition describes them.
CLIENT_MESSAGES: dict[str, dict[str, Any]] = {
    "register": {
        "type": "register",
        "status": "ok",
        "client_type": "device",
        "client_id": "box",
        "metadata": {"system_info": {"platform": "linux", "cpu_count": 4}, "platform": "linux"},
    },
    "heartbeat": {"type": "heartbeat", "status": "ok", "client_id": "box"},
    "task": {"type": "task", "status": "continue", "request": "list files", "task_name": "t", "request_id": "q1"},
    "command_results": {
        "type": "command_results",
        "status": "continue",
        "session_id": "s",
        "prev_response_id": "r1",
        "action_results": [{"status": "success", "result": {"exit_code": 0}, "call_id": "c1", "namespace": "linux"}],
    },
    "task_end": {"type": "task_end", "status": "completed", "session_id": "s"},
    "device_info_request": {
        "type": "device_info_request",
        "status": "ok",
        "client_type": "constellation",
        "target_id": "box",
        "request_id": "q2",
    },
    "device_info_response": {"type": "device_info_response", "status": "ok", "metadata": {"cpu_count": 8}},
    "error": {"type": "error", "status": "error", "error": "tool server crashed", "prev_response_id": "r1"},
}

SERVER_MESSAGES: dict[str, dict[str, Any]] = {
    "heartbeat": {"type": "heartbeat", "status": "ok", "response_id": "h"},
    "task": {"type": "task", "status": "continue", "user_request": "list files", "task_name": "t", "session_id": "s"},
    "command": {
        "type": "command",
        "status": "continue",
        "agent_name": "LinuxAgent",
        "session_id": "s",
        "response_id": "r1",
        "actions": [
            {"tool_name": "execute_command", "tool_type": "action", "call_id": "c1", "parameters": {"command": "ls"}}
        ],
    },
    "task_end": {"type": "task_end", "status": "failed", "session_id": "s", "error": "boom"},
    "device_info_request": {"type": "device_info_request", "status": "ok", "response_id": "q"},
    "device_info_response": {
        "type": "device_info_response",
        "status": "ok",
        "response_id": "q",
        "result": {"cpu_count": 8},
    },
    "error": {"type": "error", "status": "error", "error": "nope"},
}


def test_the_samples_cover_every_message_type_of_both_directions() -> None:
    assert set(CLIENT_MESSAGES) == set(AIP_CLIENT_TYPES)
    assert set(SERVER_MESSAGES) == set(AIP_SERVER_TYPES)


@pytest.mark.parametrize("kind", AIP_CLIENT_TYPES)
def test_every_client_message_parses_and_becomes_a_saucer_frame(kind: str) -> None:
    message = parse_aip(json.dumps(CLIENT_MESSAGES[kind]), "client")
    assert message.type == kind
    dialect = AipServerDialect(heartbeat_interval=120, session_of=lambda rid: None)
    frame = dialect.decode(json.dumps(CLIENT_MESSAGES[kind]), None)
    expected = {
        "register": RegisterFrame,
        "heartbeat": HeartbeatFrame,
        "task": TaskFrame,
        "command_results": CommandResultsFrame,
        "task_end": TaskEndNotice,
        "device_info_request": DeviceInfoRequestFrame,
        "device_info_response": InfoPush,
        "error": ErrorFrame,
    }[kind]
    assert isinstance(frame, expected)
    if kind == "register":
        assert (frame.role, frame.client_id, frame.info["system_info"]["cpu_count"]) == ("device", "box", 4)
    elif kind == "task":
        assert (frame.task.task, frame.request_id) == ("list files", "q1")
    elif kind == "command_results":
        assert frame.prev_response_id == "r1" and frame.results[0].status is ResultStatus.SUCCESS
    elif kind == "device_info_request":
        assert frame.device_id == "box" and frame.request_id == "q2"
    elif kind == "error":
        assert frame.ref == "r1" and frame.message == "tool server crashed"


@pytest.mark.parametrize("kind", AIP_SERVER_TYPES)
def test_every_server_message_parses(kind: str) -> None:
    assert parse_aip(json.dumps(SERVER_MESSAGES[kind]), "server").type == kind


def test_every_frame_the_server_sends_is_written_as_an_aip_message_that_parses() -> None:
    dialect = AipServerDialect(heartbeat_interval=120, session_of=lambda rid: None)
    dialect.namespaces = {"linux"}
    command = Command(tool_name="linux.execute_command", parameters={"command": "ls"}, call_id="c1")
    frames = [
        (
            RegisteredFrame(
                client_id="box", role="device", server_instance="i", heartbeat_interval=10, max_frame_bytes=1024
            ),
            ("heartbeat", "ok"),
        ),
        (HeartbeatAckFrame(), ("heartbeat", "ok")),
        (TaskAcceptedFrame(session_id="s", device_id="box", request_id="q1"), ("heartbeat", "ok")),
        (TaskEndFrame(session_id="s", status="completed", results=[1]), ("task_end", "completed")),
        (TaskEndFrame(session_id="s", status="cancelled", error="by its owner"), ("task_end", "failed")),
        (CommandFrame(response_id="r1", session_id="s", commands=[command], timeout=5), ("command", "continue")),
        (CancelFrame(response_id="r1", session_id="s", reason="stop"), ("task_end", "failed")),
        (DeviceInfoRequestFrame(request_id="q"), ("device_info_request", "ok")),
        (DeviceInfoResponseFrame(request_id="q", info={"a": 1}), ("device_info_response", "ok")),
        (ErrorFrame(code="unknown_type", message="what", ref="r9"), ("error", "error")),
    ]
    for frame, (kind, status) in frames:
        message = parse_aip(dialect.encode(frame), "server")
        assert (message.type, message.status.value) == (kind, status), frame
    sent = parse_aip(
        dialect.encode(CommandFrame(response_id="r1", session_id="s", commands=[command], timeout=5)), "server"
    )
    assert sent.agent_name == "LinuxAgent" and sent.response_id == "r1" and sent.session_id == "s"
    assert [(a.tool_name, a.tool_type, a.call_id, a.parameters) for a in sent.actions] == [
        ("execute_command", "action", "c1", {"command": "ls"})
    ]
    accepted = parse_aip(dialect.encode(TaskAcceptedFrame(session_id="s", device_id="box", request_id="q1")), "server")
    assert (accepted.session_id, accepted.response_id) == ("s", "q1")
    cancel = parse_aip(dialect.encode(CancelFrame(response_id="r1", session_id="s", reason="stop")), "server")
    assert cancel.response_id == "r1" and cancel.error == "cancelled: stop"
    error = parse_aip(dialect.encode(ErrorFrame(code="unknown_type", message="what", ref="r9")), "server")
    assert error.error == "unknown_type: what" and error.response_id == "r9"


@pytest.mark.parametrize(
    ("raw", "sender", "code", "says"),
    [
        ("{not json", "client", "malformed_json", "not valid JSON"),
        ("[1, 2]", "client", "not_an_object", "JSON object, got list"),
        ('{"status": "ok"}', "client", "missing_type", "no 'type'"),
        ('{"type": "dance", "status": "ok"}', "client", "unknown_type", "unknown AIP message type 'dance'"),
        ('{"type": "command", "status": "ok"}', "client", "unknown_type", "from a client"),
        ('{"type": "register", "status": "ok"}', "server", "unknown_type", "from a server"),
        ('{"type": "heartbeat"}', "client", "invalid_frame", "status: Field required"),
        ('{"type": "heartbeat", "status": "fine"}', "client", "invalid_frame", "status: Input should be"),
        ('{"type": "register", "status": "ok"}', "client", "invalid_frame", "client_id: required"),
        (
            '{"type": "register", "status": "ok", "client_id": "x", "client_type": "robot"}',
            "client",
            "invalid_frame",
            "client_type",
        ),
        ('{"type": "task", "status": "continue"}', "client", "invalid_frame", "request: required"),
        (
            '{"type": "command_results", "status": "ok", "action_results": []}',
            "client",
            "invalid_frame",
            "prev_response_id",
        ),
        (
            '{"type": "command_results", "status": "ok", "prev_response_id": "r", "action_results": [{"status": "meh"}]}',
            "client",
            "invalid_frame",
            "action_results.0.status",
        ),
        (
            '{"type": "command", "status": "continue", "response_id": "r"}',
            "server",
            "invalid_frame",
            "actions: required",
        ),
        (
            '{"type": "command", "status": "continue", "actions": [{"tool_name": "x", "tool_type": "action"}]}',
            "server",
            "invalid_frame",
            "response_id: required",
        ),
        (
            '{"type": "command", "status": "continue", "response_id": "r", "actions": [{"tool_name": "x"}]}',
            "server",
            "invalid_frame",
            "actions.0.tool_type",
        ),
    ],
)
def test_malformed_and_unknown_messages_are_refused_saying_what_and_where(
    raw: str, sender: str, code: str, says: str
) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_aip(raw, sender)  # type: ignore[arg-type]
    assert info.value.code == code and says in info.value.message, info.value.message


def test_a_result_verdict_reads_what_the_call_returned_not_only_aips_status() -> None:
    def verdict(**fields: Any) -> Result:
        return result_from_aip(AipResult(**fields))

    assert (
        verdict(status="success", result={"success": True, "exit_code": 0, "stdout": "hi"}).status
        is ResultStatus.SUCCESS
    )
    exit2 = verdict(status="success", result={"success": False, "exit_code": 2, "stderr": "ls: no such file"})
    assert exit2.status is ResultStatus.FAILURE and "exit_code 2: ls: no such file" in (exit2.error or "")
    refused = verdict(status="success", result={"success": False, "error": "Command blocked by security policy."})
    assert refused.status is ResultStatus.FAILURE and "blocked by security policy" in (refused.error or "")
    assert verdict(status="success", result='{"isError": true}').status is ResultStatus.FAILURE
    assert verdict(status="success", result={"status": "error"}).status is ResultStatus.FAILURE
    assert verdict(status="success", result="exit code 2 is just text").status is ResultStatus.SUCCESS
    assert (
        verdict(status="success", result=[{"success": False}]).status is ResultStatus.SUCCESS
    )  # no verdict of its own
    bare = verdict(status="failure")
    assert bare.status is ResultStatus.FAILURE and bare.error
    assert verdict(status="skipped", error="early exit").status is ResultStatus.SKIPPED
    assert inner_failure({"returncode": True}) is None  # a bool is not an exit code


def test_tool_listings_round_trip_and_agent_names_follow_the_platform() -> None:
    tools = tools_from_listing(
        [
            {"tool_name": "execute_command", "namespace": "linux", "tool_type": "action", "description": "d"},
            {"not": "a tool"},
        ]
    )
    assert list(tools) == ["linux.execute_command"] and tools["linux.execute_command"]["tool"] == "execute_command"
    assert tools_from_listing(tool_listing(tools)) == tools
    assert tools_from_listing("not json") == {}
    assert agent_name_for({"platform": "windows"}) == "HostAgent"
    assert agent_name_for({"system_info": {"platform": "linux"}}) == "LinuxAgent"
    assert agent_name_for({"platform": "windows", "saucer": {"agent_name": "AppAgent"}}) == "AppAgent"


# ----------------------------------------------------------------------------- on the wire


def _config(**overrides: Any) -> ServiceConfig:
    settings: dict[str, Any] = dict(port=0, tokens={"alice": ALICE, "bob": BOB}, state_dir=None, heartbeat_interval=1.0)
    settings.update(overrides)
    return ServiceConfig(**settings)


async def _device(server: Any, client_id: str = "ufo-box", token: str = ALICE, **options: Any) -> MiniAipDevice:
    device = MiniAipDevice(f"{server.ws_url}?token={token}", client_id, **options)
    answer = await device.start()
    assert answer is not None and answer["type"] == "heartbeat" and answer["status"] == "ok", answer
    return device


async def _until(check: Any, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


@pytest.mark.anyio
async def test_an_aip_device_registers_with_its_token_in_the_query_and_is_answered_in_aip() -> None:
    async with running_server(_config()) as server:
        device = await _device(server)
        try:
            # The server asks for its tools with a list_tools action, and keeps them.
            listing = await device.next("command")
            assert listing["agent_name"] == "LinuxAgent" and listing["actions"][0]["tool_name"] == "list_tools"
            async with httpx.AsyncClient(base_url=server.http_url, headers=auth(ALICE)) as http:
                await _until(lambda: "tools" in (server.state.hub.get("ufo-box").info))
                described = (await http.get("/api/devices/ufo-box")).json()
                assert described["protocol"] == "aip" and described["online"] is True
                assert described["info"]["system_info"]["cpu_count"] == 4
                assert set(described["info"]["tools"]) == {"linux.execute_command", "linux.wait"}
                assert (await http.get("/api/devices/ufo-box", headers=auth(BOB))).status_code == 404  # alice's device
            # heartbeat -> heartbeat ok; task_end -> nothing (an acknowledgement); a push replaces the info.
            await device.send(
                {"type": "task_end", "status": "completed", "session_id": "whatever", "client_id": "ufo-box"}
            )
            await device.send(
                {
                    "type": "device_info_response",
                    "status": "ok",
                    "client_id": "ufo-box",
                    "metadata": {"system_info": {"cpu_count": 16}, "platform": "linux"},
                }
            )
            await device.send({"type": "heartbeat", "status": "ok", "client_id": "ufo-box"})
            ack = await asyncio.wait_for(device.inbox.get(), 5)
            assert (ack["type"], ack["status"]) == ("heartbeat", "ok")  # the first answer: nothing for the two before
            info = server.state.hub.get("ufo-box").info
            assert info["system_info"]["cpu_count"] == 16 and "linux.execute_command" in info["tools"]
            # Unknown and malformed messages get an AIP error saying what was wrong; the connection stays up.
            for raw, says in (
                ('{"type": "dance", "status": "ok"}', "unknown_type: unknown AIP message type 'dance'"),
                ("{oops", "malformed_json: message is not valid JSON"),
                ('{"type": "heartbeat"}', "invalid_frame: invalid AIP 'heartbeat' message: status: Field required"),
                (
                    '{"type": "command_results", "status": "ok", "prev_response_id": "nope", "action_results": []}',
                    "unknown_response: response_id 'nope' was not issued to this device",
                ),
                ('{"type": "register", "status": "ok", "client_id": "again"}', "already_registered"),
            ):
                await device.send_raw(raw)
                error = await device.next("error")
                assert error["status"] == "error" and error["error"].startswith(says), error
        finally:
            await device.stop()


@pytest.mark.anyio
async def test_before_registering_and_with_a_wrong_token_an_aip_peer_is_refused() -> None:
    async with running_server(_config()) as server:
        device = MiniAipDevice(f"{server.ws_url}?token={ALICE}", "early")
        await device.start(register=False)
        try:
            for kind in ("heartbeat", "task_end", "device_info_response"):
                await device.send({"type": kind, "status": "ok"})
                error = await device.next("error")
                assert error["error"].startswith(f"not_registered: send a register frame before {kind!r}"), error
        finally:
            await device.stop()
        # The same handshake, with a token nobody has: refused before any message.
        with pytest.raises(InvalidStatus) as info:
            await connect(f"{server.ws_url}?token=not-a-token-of-this-server")
        assert info.value.response.status_code == 401


@pytest.mark.anyio
async def test_sessions_on_an_aip_device_run_commands_and_read_verdicts_from_results() -> None:
    async with running_server(_config()) as server:
        device = await _device(server)
        try:
            await _until(lambda: "tools" in server.state.hub.get("ufo-box").info)
            async with httpx.AsyncClient(base_url=server.http_url, headers=auth(ALICE), timeout=30) as http:
                plan = {
                    "task": "ok",
                    "steps": [{"commands": [{"tool_name": "execute_command", "parameters": {"command": "echo hi"}}]}],
                }
                sid = (await http.post("/api/sessions", json={"device_id": "ufo-box", "task": plan})).json()[
                    "session_id"
                ]
                body = (await http.get(f"/api/sessions/{sid}", params={"wait": 20})).json()
                assert body["session"]["status"] == "finished", body
                [result] = body["steps"][0]["results"]
                assert (
                    result["status"] == "success"
                    and result["result"]["stdout"] == "hi\n"
                    and result["namespace"] == "linux"
                )
                # exit code 2 comes back as AIP "success": the verdict reads the result, and fails the session.
                plan = {
                    "task": "exit2",
                    "steps": [
                        {"commands": [{"tool_name": "linux.execute_command", "parameters": {"command": "exit 2"}}]}
                    ],
                }
                sid = (await http.post("/api/sessions", json={"device_id": "ufo-box", "task": plan})).json()[
                    "session_id"
                ]
                body = (await http.get(f"/api/sessions/{sid}", params={"wait": 20})).json()
                assert body["session"]["status"] == "failed"
                [result] = body["steps"][0]["results"]
                assert result["status"] == "failure" and "exit_code 2" in result["error"]
                # An unknown tool is refused before anything is sent (the device would answer it with silence).
                plan = {"task": "bad", "steps": [{"commands": [{"tool_name": "frobnicate"}]}]}
                refused = await http.post("/api/sessions", json={"device_id": "ufo-box", "task": plan})
                assert refused.status_code == 422 and "unknown tool 'frobnicate'" in refused.text
                commands = [m for d, m in device.exchange if d == "server→device" and m["type"] == "command"]
                assert (
                    commands[-1]["actions"][0]["tool_name"] == "execute_command"
                )  # the bare name, as the device knows it
                assert commands[-1]["session_id"] == sid and commands[-1]["status"] == "continue"
        finally:
            await device.stop()


@pytest.mark.anyio
async def test_an_aip_device_may_submit_its_own_task_and_an_orchestrator_only_to_devices_it_may_use() -> None:
    async with running_server(_config()) as server:
        device = await _device(server)
        bob = MiniAipDevice(f"{server.ws_url}?token={BOB}", "bob-orchestrator")
        try:
            await _until(lambda: "tools" in server.state.hub.get("ufo-box").info)
            plan = {
                "task": "mine",
                "steps": [{"commands": [{"tool_name": "execute_command", "parameters": {"command": "true"}}]}],
            }
            await device.send(
                {
                    "type": "task",
                    "status": "continue",
                    "client_id": "ufo-box",
                    "request": "mine",
                    "request_id": "q1",
                    "metadata": {"saucer": {"task": plan}},
                }
            )
            accepted = await device.next("heartbeat")
            while "session_id" not in accepted:
                accepted = await device.next("heartbeat")
            assert accepted["status"] == "ok" and accepted["response_id"] == "q1"
            ended = await device.next("task_end", timeout=20)
            assert (ended["session_id"], ended["status"]) == (accepted["session_id"], "completed")
            # Bob's orchestrator (client_type constellation) cannot see alice's device: not for tasks, not for info.
            bob.send_heartbeats = False
            await bob.start(register=False)
            await bob.send(
                {"type": "register", "status": "ok", "client_type": "constellation", "client_id": "bob-orchestrator"}
            )
            assert (await bob.next("heartbeat"))["status"] == "ok"
            await bob.send(
                {
                    "type": "task",
                    "status": "continue",
                    "client_type": "constellation",
                    "request": "x",
                    "target_id": "ufo-box",
                    "request_id": "q2",
                }
            )
            error = await bob.next("error")
            assert error["error"].startswith("unknown_device") and error["response_id"] == "q2"
            await bob.send(
                {
                    "type": "device_info_request",
                    "status": "ok",
                    "client_type": "constellation",
                    "target_id": "ufo-box",
                    "request_id": "q3",
                }
            )
            assert (await bob.next("error"))["error"].startswith("unknown_device")
            # Alice's own orchestrator gets the device's info.
            alice = MiniAipDevice(f"{server.ws_url}?token={ALICE}", "alice-orchestrator", send_heartbeats=False)
            await alice.start(register=False)
            await alice.send(
                {"type": "register", "status": "ok", "client_type": "constellation", "client_id": "alice-orchestrator"}
            )
            await alice.next("heartbeat")
            await alice.send(
                {
                    "type": "device_info_request",
                    "status": "ok",
                    "client_type": "constellation",
                    "target_id": "ufo-box",
                    "request_id": "q4",
                }
            )
            info = await alice.next("device_info_response")
            assert info["response_id"] == "q4" and info["result"]["info"]["system_info"]["hostname"] == "ufo-box"
            await alice.stop()
        finally:
            await bob.stop()
            await device.stop()


@pytest.mark.anyio
async def test_cancel_reaches_an_aip_device_as_a_task_end_naming_the_batch() -> None:
    async with running_server(_config(cancel_timeout=0.5)) as server:
        device = await _device(server)
        try:
            await _until(lambda: "tools" in server.state.hub.get("ufo-box").info)
            async with httpx.AsyncClient(base_url=server.http_url, headers=auth(ALICE), timeout=30) as http:
                plan = {"task": "long", "steps": [{"commands": [{"tool_name": "wait", "parameters": {"seconds": 30}}]}]}
                sid = (await http.post("/api/sessions", json={"device_id": "ufo-box", "task": plan})).json()[
                    "session_id"
                ]
                command = await device.next("command")
                while command["actions"][0]["tool_name"] != "wait":
                    command = await device.next("command")
                answer = (await http.post(f"/api/sessions/{sid}/cancel")).json()
                end = await device.next("task_end")
                assert (end["status"], end["response_id"], end["session_id"]) == ("failed", command["response_id"], sid)
                assert end["error"] == "cancelled: cancelled by alice"
                # A UFO device cannot stop a running action: the server says so instead of waiting forever.
                assert (
                    answer["status"] == "cancelled" and "did not acknowledge the cancel within 0.5 s" in answer["error"]
                )
        finally:
            await device.stop()


@pytest.mark.anyio
async def test_an_aip_device_is_kept_for_its_own_heartbeat_window_and_its_websocket_pings() -> None:
    config = _config(heartbeat_interval=0.2, missed_heartbeats=2, aip_heartbeat_interval=0.5)
    assert config.aip_liveness_window == 1.0
    async with running_server(config) as server:
        # Both send no heartbeat at all; "pinging" answers the server's WebSocket pings, "frozen" stops reading.
        pinging = await _device(server, "pinging", send_heartbeats=False)
        frozen = await _device(server, "frozen", send_heartbeats=False)
        try:
            hub = server.state.hub
            await asyncio.sleep(0.7)  # longer than saucer's own 0.4 s window
            assert hub.get("pinging").online and hub.get("frozen").online
            assert frozen.ws is not None
            frozen.ws.transport.pause_reading()  # no pong comes back from here on
            await _until(lambda: not hub.get("frozen").online, 5)  # by the pong timeout or the AIP window
            assert hub.get("frozen").offline_reason
            await asyncio.sleep(1.5)  # past the AIP window: the pongs kept it alive
            assert hub.get("pinging").online
        finally:
            if frozen.ws is not None:
                frozen.ws.transport.resume_reading()
            await pinging.stop()
            await frozen.stop()


@pytest.mark.anyio
async def test_an_aip_device_id_stays_with_the_token_that_registered_it() -> None:
    async with running_server(_config()) as server:
        device = await _device(server)
        await device.stop()
        thief = MiniAipDevice(f"{server.ws_url}?token={BOB}", "ufo-box")
        answer = await thief.start()
        try:
            # Not "ok": a UFO client reads this as a failed registration.
            assert answer is not None and (answer["type"], answer["status"]) == ("error", "error")
            assert answer["error"].startswith("device_owned: device id 'ufo-box' is registered to another token")
            assert not thief.registered.is_set()
            assert server.state.hub.get("ufo-box").owner == "alice"
        finally:
            await thief.stop()


def test_messages_with_every_optional_field_null_as_ufos_pydantic_writes_them() -> None:
    nulls = dict.fromkeys(
        (
            "session_id",
            "task_name",
            "target_id",
            "request",
            "action_results",
            "timestamp",
            "request_id",
            "prev_response_id",
            "error",
            "metadata",
        )
    )
    dialect = AipServerDialect(heartbeat_interval=120, session_of=lambda rid: "s-known")
    register = dialect.decode(
        json.dumps({**nulls, "type": "register", "status": "ok", "client_type": "device", "client_id": "box"}), None
    )
    assert isinstance(register, RegisterFrame) and register.info == {}
    heartbeat = dialect.decode(
        json.dumps({**nulls, "type": "heartbeat", "status": "ok", "client_type": "device", "client_id": "box"}), None
    )
    assert isinstance(heartbeat, HeartbeatFrame)
    results = dialect.decode(
        json.dumps(
            {
                **nulls,
                "type": "command_results",
                "status": "continue",
                "client_type": "device",
                "prev_response_id": "r1",
                "action_results": [
                    {"status": "success", "error": None, "result": None, "namespace": None, "call_id": "c"}
                ],
            }
        ),
        None,
    )
    assert results.session_id == "s-known"  # left out by the device: the batch's own session
    server = {
        k: None
        for k in (
            "user_request",
            "agent_name",
            "process_name",
            "root_name",
            "actions",
            "messages",
            "error",
            "session_id",
            "task_name",
            "timestamp",
            "response_id",
            "result",
        )
    }
    assert parse_aip(json.dumps({**server, "type": "heartbeat", "status": "ok"}), "server").type == "heartbeat"


@pytest.mark.anyio
async def test_a_device_credential_is_added_on_the_wire_only_to_the_tools_that_declare_it() -> None:
    key = "ufo-mcp-api-key-5b1e77c2"
    plan = {
        "task": "k",
        "steps": [
            {
                "commands": [
                    {"tool_name": "execute_command", "parameters": {"command": "echo ok"}},
                    {"tool_name": "wait", "parameters": {"seconds": 0}},
                ]
            }
        ],
    }
    for configured in (False, True):
        config = _config(aip_parameters={"ufo-box": {"api_key": key}} if configured else {})
        async with running_server(config) as server:
            device = await _device(server, api_key=key)
            try:
                await _until(lambda: "tools" in server.state.hub.get("ufo-box").info)
                async with httpx.AsyncClient(base_url=server.http_url, headers=auth(ALICE), timeout=30) as http:
                    sid = (await http.post("/api/sessions", json={"device_id": "ufo-box", "task": plan})).json()[
                        "session_id"
                    ]
                    body = (await http.get(f"/api/sessions/{sid}", params={"wait": 20})).json()
            finally:
                await device.stop()
        sent = [m for d, m in device.exchange if d == "server→device" and m["type"] == "command"]
        if not configured:
            # UFO's server answers "success" with the refusal inside: the verdict reads it.
            assert body["session"]["status"] == "failed"
            assert "success is false: Authentication failed" in body["steps"][0]["results"][0]["error"]
            continue
        assert body["session"]["status"] == "finished", body
        listing, run = sent[0]["actions"], sent[-1]["actions"]
        assert "api_key" not in listing[0]["parameters"]  # list_tools takes no credential
        assert run[0]["parameters"] == {"command": "echo ok", "api_key": key}  # declared by execute_command
        assert run[1]["parameters"] == {"seconds": 0}  # wait does not declare it
        assert key not in json.dumps(body)  # nor is it in the session's record
