"""The device side of AIP: ``saucer device --protocol aip`` joins a UFO server (or any AIP server).

:class:`AipDeviceClient` connects with its token in the URL's query
(``?token=``, as UFO's server expects), registers as an AIP device (``metadata``
with ``system_info`` and ``platform``), heartbeats (every 120 s by default,
as UFO's client does, with WebSocket pings every 20 s) and runs each
``command`` message's actions on its local dispatcher, answering every one:

- the ``list_tools`` action answers with its tools (name, namespace, type,
  description, input schema), filtered by the ``tool_type``/``namespace``
  parameters;
- an action naming a tool the device does not have is a failure result
  saying so (with the closest names), and the others still run;
- a command whose ``agent_name`` is missing or not one this device serves
  gets ``command_results`` with status ``error``, an ``error`` saying why
  and a failure per action -- never silence, which would leave the server
  waiting;
- a ``task_end`` whose ``response_id`` names a running batch (saucer's
  cancel) stops it; its results, failures saying so, are the answer.

A message it cannot read, or of a type it does not know, is answered with
an AIP ``error`` message naming the problem.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import platform as platform_module
import random
import socket
import ssl as ssl_module
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from saucer.dispatch.messages import Command, Result
from saucer.dispatch.toolcheck import resolve_tool
from saucer.redaction import register_secret
from saucer.service.aip import (
    LIST_TOOLS,
    SAUCER_METADATA_KEY,
    AipClientMessage,
    AipServerMessage,
    AipStatus,
    encode_aip,
    new_id,
    parse_aip,
    result_to_aip,
    timestamp,
    tool_listing,
)
from saucer.service.device import CommandExecutor, DeviceAuthError, DeviceError, DeviceRefused, run_until_first
from saucer.service.protocol import ProtocolError, align_results, failure_results

__all__ = ["AipDeviceClient", "DEFAULT_AGENT_NAMES", "AIP_HEARTBEAT_INTERVAL", "token_url"]

_log = logging.getLogger("saucer.service.aip_device")

DEFAULT_AGENT_NAMES = ("LinuxAgent", "HostAgent", "AppAgent")
"""The ``agent_name`` s a saucer AIP device serves unless told otherwise."""

AIP_HEARTBEAT_INTERVAL = 120.0
"""Seconds between heartbeats, as UFO's device client sends them."""

_POLICY_CLOSE = 1008  # UFO's server closes a connection with a bad token with this code


def token_url(url: str, token: str) -> str:
    """``url`` with ``token`` as its ``token`` query parameter (replacing one already there)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "token"]
    query.append(("token", token))
    return urlunsplit(parts._replace(query=urlencode(query)))


class AipDeviceClient:
    """One AIP device connection loop (see the module docs); :meth:`run` until :attr:`stop` is set."""

    def __init__(
        self,
        server_url: str,
        token: str,
        device_id: str,
        dispatcher: CommandExecutor,
        *,
        tools: dict[str, dict[str, Any]] | None = None,
        info: dict[str, Any] | None = None,
        agent_names: tuple[str, ...] = DEFAULT_AGENT_NAMES,
        platform: str = "linux",
        heartbeat_interval: float = AIP_HEARTBEAT_INTERVAL,
        ping_interval: float = 20.0,
        command_timeout: float = 300.0,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        max_failures: int | None = None,
        open_timeout: float = 10.0,
        ssl: ssl_module.SSLContext | None = None,
        stop: asyncio.Event | None = None,
    ) -> None:
        if backoff_initial <= 0 or backoff_max < backoff_initial:
            raise ValueError("need 0 < backoff_initial <= backoff_max")
        self.server_url = server_url
        self.device_id = device_id
        self.dispatcher = dispatcher
        self.tools = dict(tools or {})
        self.info = dict(info or {})
        self.agent_names = tuple(agent_names)
        self.platform = platform
        self.heartbeat_interval = heartbeat_interval
        self.command_timeout = command_timeout
        self.stop = stop or asyncio.Event()
        self.registrations = 0
        self._token = token
        register_secret(token)
        self._ping = ping_interval
        self._backoff = (backoff_initial, backoff_max)
        self._max_failures = max_failures
        self._open_timeout = open_timeout
        self._ssl = ssl
        self._ws: ClientConnection | None = None
        self._send_lock = asyncio.Lock()
        self._running: dict[str, asyncio.Task[None]] = {}  # response_id -> its batch
        self._cancelled: dict[str, str] = {}  # response_id -> why the server ended it

    async def run(self) -> None:
        """Stay connected until :attr:`stop` is set; raise :class:`DeviceError` when retrying is pointless."""
        delay, failures = self._backoff[0], 0
        try:
            while not self.stop.is_set():
                before = self.registrations
                try:
                    await self._connection()
                except DeviceError:
                    raise
                except (OSError, WebSocketException, TimeoutError, ProtocolError, ConnectionError) as exc:
                    _log.warning(
                        "device %s: connection to %s failed: %s",
                        self.device_id,
                        _safe_url(self.server_url),
                        _reason(exc),
                    )
                if self.stop.is_set():
                    break
                if self.registrations > before:
                    delay, failures = self._backoff[0], 0
                failures += 1
                if self._max_failures is not None and failures > self._max_failures:
                    raise DeviceError(
                        f"gave up after {failures - 1} failed reconnection attempts to {_safe_url(self.server_url)}"
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), random.uniform(delay / 2, delay))
                delay = min(delay * 2, self._backoff[1])
        finally:
            for task in self._running.values():
                task.cancel()
            await asyncio.gather(*self._running.values(), return_exceptions=True)

    # ------------------------------------------------------------ connection

    async def _connection(self) -> None:
        try:
            ws = await connect(
                token_url(self.server_url, self._token),
                open_timeout=self._open_timeout,
                ping_interval=self._ping,
                ping_timeout=max(self._ping * 9, 60.0),
                max_size=100 * 1024 * 1024,
                ssl=self._ssl,
            )
        except InvalidStatus as exc:
            if exc.response.status_code in (401, 403):
                raise DeviceAuthError(f"server refused the token (HTTP {exc.response.status_code})") from None
            raise
        async with ws:
            try:
                await self._register(ws)
            except ConnectionClosed as exc:
                if exc.rcvd is not None and exc.rcvd.code == _POLICY_CLOSE:
                    raise DeviceAuthError(
                        f"server refused the connection: {exc.rcvd.reason or 'policy violation'}"
                    ) from None
                raise
            self._ws = ws
            try:
                await run_until_first(self._receive(ws), self._heartbeats(), self.stop.wait())
            finally:
                self._ws = None

    async def _register(self, ws: ClientConnection) -> None:
        metadata = {
            "system_info": self._system_info(),
            "platform": self.platform,
            "registration_time": timestamp(),
            SAUCER_METADATA_KEY: {"agent_names": list(self.agent_names), **self.info},
        }
        await ws.send(
            encode_aip(
                AipClientMessage(
                    type="register",
                    status=AipStatus.OK,
                    client_type="device",
                    client_id=self.device_id,
                    metadata=metadata,
                    timestamp=timestamp(),
                )
            )
        )
        answer: AipServerMessage = parse_aip(await asyncio.wait_for(ws.recv(), self._open_timeout), "server")
        if answer.status != AipStatus.OK:
            raise DeviceRefused(f"server refused device {self.device_id!r}: {answer.error or answer.status.value}")
        hint = (answer.result or {}).get(SAUCER_METADATA_KEY) if isinstance(answer.result, dict) else None
        if (
            isinstance(hint, dict)
            and isinstance(hint.get("heartbeat_interval"), (int, float))
            and hint["heartbeat_interval"] > 0
        ):
            self.heartbeat_interval = min(self.heartbeat_interval, float(hint["heartbeat_interval"]))
        self.registrations += 1
        _log.info("device %s registered with %s (AIP)", self.device_id, _safe_url(self.server_url))

    async def _send(self, message: AipClientMessage) -> None:
        ws = self._ws
        if ws is None:
            raise ConnectionError("not connected")
        async with self._send_lock:
            await ws.send(encode_aip(message))

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            await self._send(self._message("heartbeat", AipStatus.OK))

    def _message(self, kind: str, status: AipStatus, **fields: Any) -> AipClientMessage:
        return AipClientMessage(type=kind, status=status, client_id=self.device_id, timestamp=timestamp(), **fields)

    async def _receive(self, ws: ClientConnection) -> None:
        async for raw in ws:
            try:
                message: AipServerMessage = parse_aip(raw, "server")
            except ProtocolError as exc:
                await self._send(
                    self._message(
                        "error", AipStatus.ERROR, error=f"{exc.code}: {exc.message}", prev_response_id=exc.ref
                    )
                )
                continue
            kind = message.type
            if kind == "command":
                self._start(message)
            elif kind == "task_end":
                self._task_end(message)
            elif kind == "device_info_request":
                await self._send(
                    self._message(
                        "device_info_response",
                        AipStatus.OK,
                        request_id=message.response_id,
                        prev_response_id=message.response_id,
                        metadata={"system_info": self._system_info(), "platform": self.platform},
                    )
                )
            elif kind == "task":
                # As UFO's client does: a task the server assigns comes back as this device's task request.
                request = message.user_request or message.task_name or ""
                await self._send(
                    self._message(
                        "task",
                        AipStatus.CONTINUE,
                        request=request,
                        task_name=message.task_name,
                        session_id=message.session_id,
                        request_id=new_id(),
                    )
                )
            elif kind == "error":
                _log.warning("device %s: server error: %s", self.device_id, message.error)
            else:  # heartbeat (an acknowledgement) and device_info_response need nothing
                _log.debug("device %s: %s %s", self.device_id, kind, message.status.value)

    # -------------------------------------------------------------- commands

    def _start(self, message: AipServerMessage) -> None:
        response_id = message.response_id or ""
        task = asyncio.create_task(self._answer(message))
        self._running[response_id] = task
        task.add_done_callback(lambda _: self._running.pop(response_id, None))

    def _task_end(self, message: AipServerMessage) -> None:
        task = self._running.get(message.response_id or "")
        if task is None:
            _log.info("device %s: task %s ended (%s)", self.device_id, message.session_id, message.status.value)
            return
        self._cancelled[message.response_id or ""] = message.error or "the server ended the task"
        task.cancel()

    async def _answer(self, message: AipServerMessage) -> None:
        actions = message.actions or []
        commands = [
            Command(tool_name=a.tool_name, tool_type=a.tool_type, call_id=a.call_id, parameters=a.parameters or {})
            for a in actions
        ]
        status, error = message.status, None
        if not message.agent_name or message.agent_name not in self.agent_names:
            named = (
                f"agent_name {message.agent_name!r} is not served here"
                if message.agent_name
                else "the command names no agent_name"
            )
            error = f"{named}; device {self.device_id!r} serves {', '.join(self.agent_names)}"
            status, results = AipStatus.ERROR, failure_results(commands, error)
        else:
            try:
                results = await self._run(commands)
            except asyncio.CancelledError:
                why = self._cancelled.pop(message.response_id or "", None)
                if why is None:
                    raise
                results = failure_results(
                    commands, f"device {self.device_id!r}: the batch was stopped before it finished ({why})"
                )
        with contextlib.suppress(ConnectionClosed, ConnectionError):
            await self._send(
                self._message(
                    "command_results",
                    status,
                    session_id=message.session_id,
                    prev_response_id=message.response_id,
                    request_id=new_id(),
                    error=error,
                    action_results=[result_to_aip(r) for r in results],
                )
            )

    async def _run(self, commands: list[Command]) -> list[Result]:
        """One result per command: ``list_tools`` answered here, unknown tools refused, the rest run in order."""
        answers: dict[str, Result] = {}
        runnable: list[Command] = []
        for command in commands:
            if command.tool_name == LIST_TOOLS:
                answers[command.call_id] = Result(
                    status="success", result=self._listing(command.parameters), call_id=command.call_id
                )
                continue
            try:
                command.tool_name = resolve_tool(command.tool_name, self.tools) if self.tools else command.tool_name
            except LookupError as exc:
                answers[command.call_id] = Result.failure(command, f"device {self.device_id!r}: {exc}")
                continue
            runnable.append(command)
        if runnable:
            try:
                ran = await self.dispatcher.execute_commands(runnable, self.command_timeout)
                ran, _ = align_results(
                    runnable,
                    [r if isinstance(r, Result) else Result.model_validate(r) for r in ran],
                    source="dispatcher",
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - every command is answered
                ran = failure_results(runnable, f"device {self.device_id!r}: {type(exc).__name__}: {exc}")
            for command, result in zip(runnable, ran, strict=False):
                namespace = result.namespace or str(self.tools.get(command.tool_name, {}).get("server") or "") or None
                answers[command.call_id] = result.model_copy(update={"namespace": namespace})
        return [answers[c.call_id] for c in commands]

    def _listing(self, parameters: dict[str, Any]) -> list[dict[str, Any]]:
        wanted_type, wanted_ns = parameters.get("tool_type"), parameters.get("namespace")
        return [
            t
            for t in tool_listing(self.tools)
            if (wanted_type in (None, t["tool_type"])) and (wanted_ns in (None, t["namespace"]))
        ]

    def _system_info(self) -> dict[str, Any]:
        return {
            "device_id": self.device_id,
            "platform": self.platform,
            "os_version": platform_module.platform(),
            "hostname": socket.gethostname(),
            "supported_features": sorted({str(t.get("server")) for t in self.tools.values()}),
            "platform_type": "computer",
            "schema_version": "1.0",
        }


def _safe_url(url: str) -> str:
    return urlunsplit(urlsplit(url)._replace(query=""))


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
