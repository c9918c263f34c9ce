"""The server side of AIP: a connection that speaks UFO's protocol is served like any other.

The server decides a connection's dialect from its first message (an AIP
message always carries ``status``, a saucer frame never does on
registration). From then on :class:`AipServerDialect` translates: what the
AIP peer sends becomes saucer's frames, handled by the same code as saucer's
own devices and clients (principals, ownership, sharing, cancel, liveness,
results correlation), and every frame the server sends that connection is
written as an AIP message.

====================  =====================================================
AIP (device → server)  saucer
====================  =====================================================
register              ``register``: ``client_type`` device → role device,
                      constellation → role client; ``metadata`` is the
                      device's info (``DEVICE_INFO`` of its sessions)
heartbeat             ``heartbeat``
task                  ``task`` (``request``; ``target_id`` names the device)
command_results       ``command_results``; each result's verdict reads its
                      payload (:func:`~saucer.service.aip.result_from_aip`)
task_end              acknowledged silently (AIP's answer to a ``task_end``)
device_info_request   ``device_info_request`` (``target_id``)
device_info_response  the device's info, replaced
error                 ``error`` (fails the batch its ``prev_response_id`` names)
====================  =====================================================

The server's answers: registration and a heartbeat are answered by
``heartbeat``/``ok``, a task by ``heartbeat``/``ok`` with its
``session_id``, a session's end by ``task_end`` (``completed`` or
``failed``), commands by ``command`` (``agent_name`` from the device's
platform), a refusal by ``error``/``error``.

Saucer's extensions ride where AIP leaves room, under the ``saucer`` key:
in a client's ``metadata`` (``agent_name`` to use in commands, ``inflight``
batches after a reconnect, a whole ``task`` spec with plan steps) and in
the ``result`` of the server's registration answer (``server_instance``,
``heartbeat_interval``, ``max_frame_bytes``). A cancel, which AIP has no
message for, is a ``task_end`` with status ``failed`` whose ``response_id``
names the batch to stop; a device that does not know it simply answers the
batch when it is done.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from saucer.dispatch.messages import Command
from saucer.redaction import REDACTED, register_secret
from saucer.service.aip import (
    LIST_TOOLS,
    SAUCER_METADATA_KEY,
    AipClientMessage,
    AipServerMessage,
    AipStatus,
    action_of,
    encode_aip,
    is_aip,
    new_id,
    parse_aip,
    result_from_aip,
    timestamp,
    tools_from_listing,
)
from saucer.service.hub import Connection, DeviceHub
from saucer.service.protocol import (
    CancelFrame,
    CommandFrame,
    CommandResultsFrame,
    DeviceInfoRequestFrame,
    DeviceInfoResponseFrame,
    ErrorCode,
    ErrorFrame,
    HeartbeatAckFrame,
    HeartbeatFrame,
    ProtocolError,
    RegisteredFrame,
    RegisterFrame,
    TaskAcceptedFrame,
    TaskEndFrame,
    TaskFrame,
    TaskSpec,
    frame_size,
)

__all__ = [
    "AGENT_NAMES",
    "AipServerDialect",
    "InfoPush",
    "TaskEndNotice",
    "AIP_PARAMETERS_ENV",
    "agent_name_for",
    "aip_parameters",
    "discover_tools",
    "speaks_aip",
]

_log = logging.getLogger("saucer.service.aip")

AGENT_NAMES = {"windows": "HostAgent", "linux": "LinuxAgent", "android": "MobileAgent", "mobile": "MobileAgent"}
"""The ``agent_name`` a command carries to a UFO device, by the platform it registered with."""

DISCOVERY_SESSION = "saucer-tool-discovery"
"""The ``session_id`` of the ``list_tools`` command the server sends an AIP device after it registers."""


@dataclass
class InfoPush:
    """An AIP device sent its info unasked (``device_info_response`` with no pending request)."""

    info: dict[str, Any]
    type: str = "device_info_response"


@dataclass
class TaskEndNotice:
    """An AIP peer acknowledged (or announced) the end of a task; it needs no answer."""

    session_id: str | None
    status: str
    type: str = "task_end"


AIP_PARAMETERS_ENV = "SAUCER_AIP_PARAMETERS"
"""Environment variable of parameters the server adds to the actions it sends AIP devices (see :func:`aip_parameters`)."""


def aip_parameters(environ: Mapping[str, str] | None = None) -> dict[str, dict[str, str]]:
    """Parameters to add to AIP devices' actions, from ``SAUCER_AIP_PARAMETERS``: ``{"DEVICE or *": {"NAME": "VALUE"}}``.

    UFO's MCP servers may want a credential in every call (``api_key``); it
    belongs to the device, not to a task (a task's secrets are stored as
    ``***``). The server adds each one on the wire only, to actions whose
    tool declares that parameter and does not give it (or gives ``***``);
    the values are registered as secrets, so no log or record shows them.
    Raise ValueError saying what is wrong with the variable.
    """
    raw = (os.environ if environ is None else environ).get(AIP_PARAMETERS_ENV, "").strip()
    if not raw:
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{AIP_PARAMETERS_ENV} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not all(
        isinstance(params, dict) and all(isinstance(v, str) for v in params.values()) for params in data.values()
    ):
        raise ValueError(f'{AIP_PARAMETERS_ENV} must be {{"DEVICE_ID or *": {{"PARAMETER": "string value"}}}}')
    register_secret(*(v for params in data.values() for v in params.values()))
    return {str(device): {str(k): v for k, v in params.items()} for device, params in data.items()}


def speaks_aip(data: bytes | str, max_bytes: int | None) -> bool:
    """True when a connection's first message is AIP (it carries ``status``; saucer's ``register`` does not)."""
    if max_bytes is not None and frame_size(data) > max_bytes:
        return False  # saucer's parser refuses it with the size in its error
    try:
        return is_aip(orjson.loads(data))
    except orjson.JSONDecodeError:
        return False


def agent_name_for(metadata: dict[str, Any]) -> str:
    """The ``agent_name`` for a device's commands: its own ``metadata.saucer.agent_name``, else by platform."""
    extension = metadata.get(SAUCER_METADATA_KEY)
    own = extension.get("agent_name") if isinstance(extension, dict) else None
    if isinstance(own, str) and own:
        return own
    system = metadata.get("system_info")
    platform = metadata.get("platform") or (system.get("platform") if isinstance(system, dict) else None) or "linux"
    return AGENT_NAMES.get(str(platform).lower(), "LinuxAgent")


class AipServerDialect:
    """Translation between one AIP connection and saucer's frames (see the module docs).

    ``session_of(response_id)`` finds the session of a pending batch, for
    results that leave their ``session_id`` out.
    """

    name = "aip"

    def __init__(
        self,
        *,
        heartbeat_interval: float,
        session_of: Callable[[str], str | None],
        parameters: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.heartbeat_interval = heartbeat_interval
        self.agent_name = "LinuxAgent"
        #: Namespaces of the device's tools (from ``list_tools``): ``shell.run`` goes out as ``run``.
        self.namespaces: set[str] = set()
        #: The parameters each tool declares (from ``list_tools``), by its bare name.
        self.tool_parameters: dict[str, set[str]] = {}
        self._session_of = session_of
        self._all_parameters = parameters or {}
        self._parameters: dict[str, str] = {}

    # ------------------------------------------------------------------ in

    def decode(self, data: bytes | str | dict[str, Any], max_bytes: int | None) -> Any:
        """A saucer frame, :class:`InfoPush` or :class:`TaskEndNotice` for one AIP message; :class:`ProtocolError` if refused."""
        message: AipClientMessage = parse_aip(data, "client", max_bytes=max_bytes)
        kind = message.type
        metadata = message.metadata or {}
        found = metadata.get(SAUCER_METADATA_KEY)
        extension: dict[str, Any] = found if isinstance(found, dict) else {}
        try:
            if kind == "register":
                self.agent_name = agent_name_for(metadata)
                self._parameters = {
                    **self._all_parameters.get("*", {}),
                    **self._all_parameters.get(message.client_id or "", {}),
                }
                listed = extension.get("inflight")
                inflight = listed if isinstance(listed, list) else []
                return RegisterFrame(
                    role="device" if message.client_type == "device" else "client",
                    client_id=message.client_id or "",
                    info=metadata,
                    inflight=[str(i) for i in inflight],
                )
            if kind == "heartbeat":
                return HeartbeatFrame()
            if kind == "task":
                spec = extension.get("task")
                task = TaskSpec.model_validate(spec) if isinstance(spec, dict) else TaskSpec(task=message.request or "")
                return TaskFrame(task=task, target_device_id=message.target_id, request_id=message.request_id)
            if kind == "command_results":
                rid = message.prev_response_id or ""
                return CommandResultsFrame(
                    prev_response_id=rid,
                    session_id=message.session_id or self._session_of(rid) or "",
                    results=[result_from_aip(r) for r in message.action_results or []],
                )
            if kind == "device_info_request":
                return DeviceInfoRequestFrame(request_id=message.request_id or new_id(), device_id=message.target_id)
            if kind == "device_info_response":
                asked = message.request_id or message.prev_response_id
                return InfoPush(metadata) if asked is None else DeviceInfoResponseFrame(request_id=asked, info=metadata)
            if kind == "task_end":
                return TaskEndNotice(message.session_id, message.status.value)
            # error
            return ErrorFrame(
                code="device_error",
                message=message.error or "the peer reported an error without a message",
                ref=message.prev_response_id or message.request_id,
            )
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"]) or "<message>"
            raise ProtocolError(
                ErrorCode.INVALID_FRAME, f"invalid AIP {kind!r} message: {where}: {first['msg']}"
            ) from None

    # ----------------------------------------------------------------- out

    def encode(self, frame: BaseModel) -> str:
        """The AIP message for a frame the server sends this connection."""
        return encode_aip(self.message(frame))

    def message(self, frame: BaseModel) -> AipServerMessage:
        """The AIP form of one of saucer's server frames."""
        ok, now = AipStatus.OK, timestamp()
        if isinstance(frame, RegisteredFrame):
            extension = {
                "client_id": frame.client_id,
                "server_instance": frame.server_instance,
                "heartbeat_interval": self.heartbeat_interval,
                "max_frame_bytes": frame.max_frame_bytes,
            }
            return AipServerMessage(
                type="heartbeat",
                status=ok,
                timestamp=now,
                response_id=new_id(),
                result={SAUCER_METADATA_KEY: extension},
            )
        if isinstance(frame, HeartbeatAckFrame):
            return AipServerMessage(type="heartbeat", status=ok, timestamp=now, response_id=new_id())
        if isinstance(frame, TaskAcceptedFrame):
            return AipServerMessage(
                type="heartbeat",
                status=ok,
                session_id=frame.session_id,
                timestamp=now,
                response_id=frame.request_id or new_id(),
                result={SAUCER_METADATA_KEY: {"device_id": frame.device_id}},
            )
        if isinstance(frame, TaskEndFrame):
            error = frame.error if frame.status != "cancelled" else f"cancelled: {frame.error or 'by its owner'}"
            return AipServerMessage(
                type="task_end",
                status=AipStatus.COMPLETED if frame.status == "completed" else AipStatus.FAILED,
                session_id=frame.session_id,
                result=frame.results,
                error=error,
                timestamp=now,
                response_id=new_id(),
            )
        if isinstance(frame, CommandFrame):
            return AipServerMessage(
                type="command",
                status=AipStatus.CONTINUE,
                agent_name=self.agent_name,
                session_id=frame.session_id,
                response_id=frame.response_id,
                actions=[self._with_device_parameters(action_of(c, self.namespaces)) for c in frame.commands],
                timestamp=now,
            )
        if isinstance(frame, CancelFrame):
            return AipServerMessage(
                type="task_end",
                status=AipStatus.FAILED,
                session_id=frame.session_id,
                response_id=frame.response_id,
                error=f"cancelled: {frame.reason}",
                timestamp=now,
            )
        if isinstance(frame, DeviceInfoRequestFrame):
            return AipServerMessage(type="device_info_request", status=ok, response_id=frame.request_id, timestamp=now)
        if isinstance(frame, DeviceInfoResponseFrame):
            return AipServerMessage(
                type="device_info_response", status=ok, response_id=frame.request_id, result=frame.info, timestamp=now
            )
        if isinstance(frame, ErrorFrame):
            return AipServerMessage(
                type="error",
                status=AipStatus.ERROR,
                error=f"{frame.code}: {frame.message}",
                response_id=frame.ref or new_id(),
                timestamp=now,
            )
        raise TypeError(f"no AIP form for a {type(frame).__name__}")

    def _with_device_parameters(self, action: Any) -> Any:
        declared = self.tool_parameters.get(action.tool_name, set())
        missing = {
            k: v
            for k, v in self._parameters.items()
            if k in declared and (action.parameters or {}).get(k) in (None, REDACTED)
        }
        if not missing or action.tool_name == LIST_TOOLS:
            return action
        return action.model_copy(update={"parameters": {**(action.parameters or {}), **missing}})


async def discover_tools(hub: DeviceHub, device_id: str, connection: Connection, timeout: float) -> dict[str, Any]:
    """Ask an AIP device for its tools with a ``list_tools`` action; store them as ``info["tools"]``.

    Returns the tool table ({} when the device does not answer in time or
    answers with a failure: sessions on it then run without a tool list).
    """
    correlator = hub.correlator
    command = Command(tool_name=LIST_TOOLS, tool_type="action", parameters={})
    batch = correlator.open(device_id, DISCOVERY_SESSION, [command], 0.0)
    batch.connection_id = connection.id
    frame = CommandFrame(
        response_id=batch.response_id, session_id=DISCOVERY_SESSION, commands=[command], timeout=timeout
    )
    try:
        await connection.send(frame)
        results = await asyncio.wait_for(asyncio.shield(batch.future), timeout)
    except Exception as exc:  # noqa: BLE001 - a device without list_tools still runs commands
        correlator.discard(batch, "timed out")
        _log.warning(
            "device %s: list_tools got no answer (%s); its sessions see no tool list", device_id, type(exc).__name__
        )
        return {}
    result = results[0]
    if result.status.value != "success":
        _log.warning("device %s: list_tools failed: %s", device_id, result.error)
        return {}
    tools = tools_from_listing(result.result)
    state = hub.get(device_id)
    if state is not None and state.connection is connection:
        state.info = {**state.info, "tools": tools}
        dialect = connection.dialect
        if dialect is not None:
            dialect.namespaces = {str(t["server"]) for t in tools.values()}
            dialect.tool_parameters = {
                str(t["tool"]): set((t.get("input_schema") or {}).get("properties") or {}) for t in tools.values()
            }
    return tools
