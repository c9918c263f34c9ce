"""A minimal AIP device and a minimal AIP server, written for the tests from AIP's message definitions.

Neither imports anything of saucer: they speak plain JSON over ``websockets``
the way UFO's published protocol describes it, so a test that passes with
them shows saucer interoperating with AIP, not with itself. Every frame they
send and receive is kept in ``exchange`` (direction, message), in order.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import subprocess
import uuid
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve


def now() -> str:
    """ISO 8601 UTC, as AIP's timestamps."""
    return datetime.datetime.now(datetime.UTC).isoformat()


# The tools a UFO Linux device's MCP servers would list (AIP's MCPToolInfo shape).
LINUX_TOOLS = [
    {
        "tool_key": "action::execute_command",
        "tool_name": "execute_command",
        "namespace": "linux",
        "tool_type": "action",
        "description": "Run a shell command; returns success, exit_code, stdout, stderr.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "api_key": {"type": "string"}},
            "required": ["command"],
        },
    },
    {
        "tool_key": "action::wait",
        "tool_name": "wait",
        "namespace": "linux",
        "tool_type": "action",
        "description": "Sleep for some seconds.",
        "input_schema": {"type": "object", "properties": {"seconds": {"type": "number"}}},
    },
]


@dataclass
class MiniAipDevice:
    """A device as UFO's client behaves: registers, heartbeats, runs actions, answers with command_results.

    Like UFO's client it answers a command for an unknown agent or tool with
    nothing at all (``silent_on_unknown``) -- which is what saucer must cope with.
    """

    url: str
    client_id: str
    heartbeat: float = 120.0
    agent_names: tuple[str, ...] = ("LinuxAgent",)
    exchange: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    ws: ClientConnection | None = None
    registered: asyncio.Event = field(default_factory=asyncio.Event)
    inbox: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    send_heartbeats: bool = True
    #: Like UFO's Linux MCP server with UFO_MCP_API_KEY set: execute_command wants this key in its parameters.
    api_key: str | None = None
    _tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    async def send(self, message: dict[str, Any]) -> None:
        """Send one message (kept in the exchange)."""
        assert self.ws is not None
        self.exchange.append(("device→server", message))
        await self.ws.send(json.dumps(message))

    async def send_raw(self, text: str) -> None:
        """Send text that need not be a valid message."""
        assert self.ws is not None
        await self.ws.send(text)

    async def start(self, register: bool = True) -> dict[str, Any] | None:
        """Connect (token already in the URL's query) and register; return the server's answer."""
        self.ws = await connect(self.url, ping_interval=20, ping_timeout=180)
        if not register:
            self._tasks.append(asyncio.create_task(self._receive()))
            return None
        await self.send(
            {
                "type": "register",
                "status": "ok",
                "client_type": "device",
                "client_id": self.client_id,
                "timestamp": now(),
                "metadata": {
                    "system_info": {
                        "device_id": self.client_id,
                        "platform": "linux",
                        "os_version": "Debian 12",
                        "cpu_count": 4,
                        "memory_total_gb": 8.0,
                        "hostname": "ufo-box",
                        "ip_address": "10.0.0.7",
                        "supported_features": ["shell"],
                        "platform_type": "computer",
                        "schema_version": "1.0",
                        "custom_metadata": {},
                    },
                    "platform": "linux",
                    "registration_time": now(),
                },
            }
        )
        answer = json.loads(await self.ws.recv())
        self.exchange.append(("server→device", answer))
        if answer.get("status") == "ok":
            self.registered.set()
        self._tasks.append(asyncio.create_task(self._receive()))
        if self.send_heartbeats:
            self._tasks.append(asyncio.create_task(self._heartbeats()))
        return answer

    async def stop(self) -> None:
        """Close the connection and stop the loops."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.ws is not None:
            await self.ws.close()

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat)
            await self.send({"type": "heartbeat", "status": "ok", "client_id": self.client_id, "timestamp": now()})

    async def _receive(self) -> None:
        assert self.ws is not None
        async for raw in self.ws:
            message = json.loads(raw)
            self.exchange.append(("server→device", message))
            await self.inbox.put(message)
            if message.get("type") == "command":
                asyncio.create_task(self._command(message))

    async def _command(self, message: dict[str, Any]) -> None:
        if message.get("agent_name") not in self.agent_names:
            return  # UFO's client finds no agent configuration and answers nothing
        results = []
        for action in message.get("actions") or []:
            result = await self._run(action)
            if result is None:
                return  # an unknown tool: nothing at all, as UFO's client
            results.append({**result, "call_id": action.get("call_id"), "namespace": "linux"})
        await self.send(
            {
                "type": "command_results",
                "status": message.get("status", "continue"),
                "client_id": self.client_id,
                "session_id": message.get("session_id"),
                "prev_response_id": message.get("response_id"),
                "request_id": str(uuid.uuid4()),
                "timestamp": now(),
                "action_results": results,
            }
        )

    async def _run(self, action: dict[str, Any]) -> dict[str, Any] | None:
        name, params = action.get("tool_name"), action.get("parameters") or {}
        if name == "list_tools":
            return {"status": "success", "result": LINUX_TOOLS}
        if name == "execute_command":
            if self.api_key is not None and params.get("api_key") != self.api_key:
                return {
                    "status": "success",
                    "result": {"success": False, "error": "Authentication failed. Invalid or missing API key."},
                }
            proc = await asyncio.to_thread(
                subprocess.run, params["command"], shell=True, capture_output=True, text=True
            )
            # "success": the call returned -- whatever the command's exit code (as UFO's Linux MCP server).
            body = {
                "success": proc.returncode == 0,
                "exit_code": proc.returncode,
                "stdout": proc.stdout,
                "stderr": proc.stderr,
            }
            return {"status": "success", "result": body}
        if name == "wait":
            await asyncio.sleep(float(params.get("seconds", 1)))
            return {"status": "success", "result": {"waited": params.get("seconds", 1)}}
        return None

    async def next(self, kind: str, timeout: float = 10.0) -> dict[str, Any]:
        """The next message of type ``kind`` the server sent (others are skipped)."""

        async def find() -> dict[str, Any]:
            while True:
                message = await self.inbox.get()
                if message.get("type") == kind:
                    return message

        return await asyncio.wait_for(find(), timeout)


@dataclass
class MiniAipServer:
    """A UFO-style server: ``/ws?token=``, register answered by a heartbeat ``ok``, commands, results.

    ``script`` runs against the first device that registers; the messages it
    got are in ``exchange`` and, per ``response_id``, in ``answers``.
    """

    token: str
    host: str = "127.0.0.1"
    port: int = 0
    exchange: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    registrations: list[dict[str, Any]] = field(default_factory=list)
    refused_tokens: int = 0
    device: ServerConnection | None = None
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    inbox: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)

    async def __aenter__(self) -> MiniAipServer:
        self._server = await serve(self._handler, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._server.close()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        """Where devices connect (without the token)."""
        return f"ws://{self.host}:{self.port}/ws"

    async def _handler(self, ws: ServerConnection) -> None:
        from urllib.parse import parse_qs, urlsplit

        query = parse_qs(urlsplit(ws.request.path).query)
        if query.get("token") != [self.token]:
            self.refused_tokens += 1
            await ws.close(1008, "Invalid or missing token")
            return
        register = json.loads(await ws.recv())
        self.exchange.append(("device→server", register))
        self.registrations.append(register)
        ack = {"type": "heartbeat", "status": "ok", "timestamp": now(), "response_id": str(uuid.uuid4())}
        await self.send_to(ws, ack)
        self.device = ws
        self.connected.set()
        async for raw in ws:
            message = json.loads(raw)
            self.exchange.append(("device→server", message))
            await self.inbox.put(message)

    async def send_to(self, ws: ServerConnection, message: dict[str, Any]) -> None:
        """Send one message (kept in the exchange)."""
        self.exchange.append(("server→device", message))
        await ws.send(json.dumps(message))

    async def send(self, message: dict[str, Any]) -> None:
        """Send one message to the registered device."""
        assert self.device is not None
        await self.send_to(self.device, message)

    async def command(self, actions: list[dict[str, Any]], agent_name: str | None = "LinuxAgent", **extra: Any) -> str:
        """Send a command message; return its response_id."""
        response_id = str(uuid.uuid4())
        message = {
            "type": "command",
            "status": "continue",
            "session_id": "s-1",
            "response_id": response_id,
            "timestamp": now(),
            "actions": actions,
            **extra,
        }
        if agent_name is not None:
            message["agent_name"] = agent_name
        await self.send(message)
        return response_id

    async def reply(self, kind: str, timeout: float = 20.0, **match: Any) -> dict[str, Any]:
        """The next message of type ``kind`` (whose fields equal ``match``) the device sent."""

        async def find() -> dict[str, Any]:
            while True:
                message = await self.inbox.get()
                if message.get("type") == kind and all(message.get(k) == v for k, v in match.items()):
                    return message

        return await asyncio.wait_for(find(), timeout)
