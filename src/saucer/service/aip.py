"""AIP, the Agent Interaction Protocol of Microsoft's UFO, as saucer reads and writes it.

Written from AIP's published definition (UFO's ``aip/messages.py`` and its
documentation), not from its code. An AIP peer sends JSON objects of two
shapes over one WebSocket: a device (or orchestrator) sends *client
messages*, a server sends *server messages*. Both carry ``type`` and
``status`` (``continue``, ``completed``, ``failed``, ``ok`` or ``error``);
every other field is optional and depends on the type::

    device → server   register, heartbeat, task, command_results, task_end,
                      device_info_request, device_info_response, error
    server → device   heartbeat, task, command, task_end,
                      device_info_request, device_info_response, error

A command message carries ``actions`` (``tool_name``, ``tool_type``,
``call_id``, ``parameters``) under a ``response_id``; the device answers with
``command_results`` whose ``prev_response_id`` is that id and whose
``action_results`` hold one result per action (``status``, ``result``,
``error``, ``namespace``, ``call_id``). A result's ``success`` only says the
call returned: :func:`result_from_aip` also reads what it returned.

This module holds the message models, their parser (:func:`parse_aip`,
which raises :class:`~saucer.service.protocol.ProtocolError` with the same
codes as saucer's own protocol) and the conversions that do not depend on a
connection. :mod:`saucer.service.aip_server` speaks it on the server side,
:mod:`saucer.service.aip_device` on the device side.
"""

from __future__ import annotations

import datetime
import uuid
from enum import Enum
from typing import Any, Literal, get_args

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from saucer.dispatch.messages import Command, Result, ResultStatus
from saucer.service.protocol import ErrorCode, ProtocolError, frame_ref, frame_size

__all__ = [
    "AIP_CLIENT_TYPES",
    "AIP_SERVER_TYPES",
    "AipStatus",
    "AipAction",
    "AipResult",
    "AipClientMessage",
    "AipServerMessage",
    "SAUCER_METADATA_KEY",
    "LIST_TOOLS",
    "is_aip",
    "parse_aip",
    "encode_aip",
    "timestamp",
    "inner_failure",
    "result_from_aip",
    "result_to_aip",
    "action_of",
    "command_of",
    "tools_from_listing",
    "tool_listing",
    "new_id",
]

AipClientType = Literal[
    "register",
    "heartbeat",
    "task",
    "command_results",
    "task_end",
    "device_info_request",
    "device_info_response",
    "error",
]
AIP_CLIENT_TYPES: tuple[str, ...] = get_args(AipClientType)
"""Every ``type`` a device or orchestrator sends."""

AipServerType = Literal[
    "heartbeat", "task", "command", "task_end", "device_info_request", "device_info_response", "error"
]
AIP_SERVER_TYPES: tuple[str, ...] = get_args(AipServerType)
"""Every ``type`` a server sends."""

SAUCER_METADATA_KEY = "saucer"
"""Where saucer's extensions live inside an AIP ``metadata`` (client) or ``result`` (server) object."""

LIST_TOOLS = "list_tools"
"""The action an AIP device answers with the list of its tools."""


class AipStatus(str, Enum):
    """The ``status`` every AIP message carries."""

    CONTINUE = "continue"
    COMPLETED = "completed"
    FAILED = "failed"
    OK = "ok"
    ERROR = "error"


class _Message(BaseModel):
    # AIP's models ignore fields they do not know; so does saucer when it reads AIP.
    model_config = ConfigDict(extra="ignore")


class AipAction(_Message):
    """One command of a ``command`` message."""

    tool_name: str = Field(min_length=1)
    parameters: dict[str, Any] | None = None
    tool_type: Literal["data_collection", "action"]
    call_id: str | None = None


class AipResult(_Message):
    """One entry of ``action_results``."""

    status: Literal["success", "failure", "skipped", "none"]
    error: str | None = None
    result: Any = None
    namespace: str | None = None
    call_id: str | None = None


class AipClientMessage(_Message):
    """A message from a device (``client_type`` ``device``) or an orchestrator (``constellation``)."""

    type: AipClientType
    status: AipStatus
    client_type: Literal["device", "constellation"] = "device"
    session_id: str | None = None
    task_name: str | None = None
    client_id: str | None = None
    target_id: str | None = None
    request: str | None = None
    action_results: list[AipResult] | None = None
    timestamp: str | None = None
    request_id: str | None = None
    prev_response_id: str | None = None
    error: str | None = None
    metadata: dict[str, Any] | None = None


class AipServerMessage(_Message):
    """A message from a server."""

    type: AipServerType
    status: AipStatus
    user_request: str | None = None
    agent_name: str | None = None
    process_name: str | None = None
    root_name: str | None = None
    actions: list[AipAction] | None = None
    messages: list[str] | None = None
    error: str | None = None
    session_id: str | None = None
    task_name: str | None = None
    timestamp: str | None = None
    response_id: str | None = None
    result: Any = None


# What each type needs beyond ``type`` and ``status`` (AIP's validator checks the same, and a device or
# server acting on a message without them would have nothing to answer to).
_REQUIRED: dict[tuple[str, str], tuple[str, ...]] = {
    ("client", "register"): ("client_id",),
    ("client", "task"): ("request",),
    ("client", "command_results"): ("prev_response_id", "action_results"),
    ("server", "command"): ("response_id", "actions"),
}


def is_aip(obj: Any) -> bool:
    """True for a decoded frame that is AIP rather than saucer's own protocol (AIP always sends ``status``)."""
    return isinstance(obj, dict) and "status" in obj and "protocol_version" not in obj


def parse_aip(
    data: bytes | str | dict[str, Any], sender: Literal["client", "server"], *, max_bytes: int | None = None
) -> Any:
    """Parse one AIP message sent by ``sender``; raise :class:`ProtocolError` saying what is wrong and where."""
    if isinstance(data, dict):
        obj: Any = data
    else:
        if max_bytes is not None and frame_size(data) > max_bytes:
            raise ProtocolError(
                ErrorCode.FRAME_TOO_LARGE, f"message of {frame_size(data)} bytes exceeds the limit of {max_bytes} bytes"
            )
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise ProtocolError(ErrorCode.MALFORMED_JSON, f"message is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(ErrorCode.NOT_AN_OBJECT, f"an AIP message is a JSON object, got {type(obj).__name__}")
    known = AIP_CLIENT_TYPES if sender == "client" else AIP_SERVER_TYPES
    ref = frame_ref(obj)
    kind = obj.get("type")
    if kind is None:
        raise ProtocolError(ErrorCode.MISSING_TYPE, "AIP message has no 'type' field", ref)
    if not isinstance(kind, str) or kind not in known:
        raise ProtocolError(
            ErrorCode.UNKNOWN_TYPE,
            f"unknown AIP message type {kind!r} from a {sender}; known types: {', '.join(known)}",
            ref,
        )
    model = AipClientMessage if sender == "client" else AipServerMessage
    try:
        message = model.model_validate(obj)
    except ValidationError as exc:
        raise ProtocolError(ErrorCode.INVALID_FRAME, f"invalid AIP {kind!r} message: {_describe(exc)}", ref) from None
    missing = [name for name in _REQUIRED.get((sender, kind), ()) if getattr(message, name) in (None, "")]
    if missing:
        raise ProtocolError(
            ErrorCode.INVALID_FRAME, f"invalid AIP {kind!r} message: {', '.join(missing)}: required for this type", ref
        )
    return message


def encode_aip(message: BaseModel) -> str:
    """JSON text of an AIP message; fields that are None are left out."""
    return message.model_dump_json(exclude_none=True)


def timestamp() -> str:
    """An ISO 8601 UTC timestamp, as AIP messages carry."""
    return datetime.datetime.now(datetime.UTC).isoformat()


# ------------------------------------------------------------------- results


_EXIT_KEYS = ("exit_code", "returncode", "return_code", "exit_status")
_FLAG_KEYS = ("success", "ok")
_ERROR_FLAG_KEYS = ("is_error", "isError")


def inner_failure(payload: Any) -> str | None:
    """Why a call that *returned* still failed, read from what it returned; None when nothing says so.

    A JSON object (or a string holding one) fails when it has a non-zero exit
    code (``exit_code``, ``returncode``...), ``success``/``ok`` false,
    ``is_error``/``isError`` true, or ``status`` ``failure``/``failed``/``error``.
    Anything else (text, lists, numbers) carries no verdict of its own.
    """
    if isinstance(payload, str) and payload[:1] == "{":
        try:
            payload = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return None
    if not isinstance(payload, dict):
        return None
    detail = payload.get("error") or payload.get("stderr") or payload.get("message")
    suffix = f": {str(detail).strip()[:500]}" if detail else ""
    for key in _EXIT_KEYS:
        code = payload.get(key)
        if isinstance(code, int) and not isinstance(code, bool) and code != 0:
            return f"{key} {code}{suffix}"
    for key in _FLAG_KEYS:
        if payload.get(key) is False:
            return f"{key} is false{suffix}"
    for key in _ERROR_FLAG_KEYS:
        if payload.get(key) is True:
            return f"{key} is true{suffix}"
    status = payload.get("status")
    if isinstance(status, str) and status.lower() in ("failure", "failed", "error"):
        return f"status {status!r}{suffix}"
    return None


def result_from_aip(result: AipResult) -> Result:
    """A saucer :class:`Result` for an AIP one: a ``success`` whose payload says it failed is a failure."""
    status = ResultStatus(result.status)
    error = result.error or None
    if status is ResultStatus.SUCCESS:
        why = inner_failure(result.result)
        if why is not None:
            status = ResultStatus.FAILURE
            error = f"the call returned, but its result says it failed ({why})"
    elif status is ResultStatus.FAILURE and error is None:
        error = "the device reported a failure without a cause"
    return Result(status=status, result=result.result, error=error, namespace=result.namespace, call_id=result.call_id)


def result_to_aip(result: Result) -> AipResult:
    """The AIP form of a saucer result."""
    return AipResult(
        status=result.status.value,
        result=result.result,
        error=result.error,
        namespace=result.namespace,
        call_id=result.call_id,
    )


def action_of(command: Command, namespaces: set[str] | frozenset[str] = frozenset()) -> AipAction:
    """The AIP action for a saucer command; ``server.tool`` becomes ``tool`` when ``server`` is one of ``namespaces``."""
    name = command.tool_name
    prefix, dot, bare = name.partition(".")
    if dot and bare and prefix in namespaces:
        name = bare
    return AipAction(
        tool_name=name, tool_type=command.tool_type, call_id=command.call_id, parameters=dict(command.parameters)
    )


def command_of(action: AipAction) -> Command:
    """The saucer command for an AIP action (a missing ``call_id`` gets a fresh one)."""
    return Command(
        tool_name=action.tool_name,
        tool_type=action.tool_type,
        call_id=action.call_id,
        parameters=action.parameters or {},
    )


# --------------------------------------------------------------------- tools


def tools_from_listing(listing: Any) -> dict[str, dict[str, Any]]:
    """saucer's tool table (``namespace.tool`` -> description) from the answer to an AIP ``list_tools`` action.

    The answer is a list of tool descriptions (``tool_name``, ``namespace``,
    ``tool_type``, ``description``, ``input_schema``...), possibly as JSON text.
    Entries that are not descriptions are skipped.
    """
    if isinstance(listing, str):
        try:
            listing = orjson.loads(listing)
        except orjson.JSONDecodeError:
            return {}
    if isinstance(listing, dict) and isinstance(listing.get("tools"), list):
        listing = listing["tools"]
    tools: dict[str, dict[str, Any]] = {}
    for entry in listing if isinstance(listing, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("tool_name"), str) or not entry["tool_name"]:
            continue
        namespace = str(entry.get("namespace") or "device")
        name = f"{namespace}.{entry['tool_name']}"
        tools[name] = {
            "name": name,
            "server": namespace,
            "tool": entry["tool_name"],
            "title": entry.get("title"),
            "description": entry.get("description") or "",
            "input_schema": entry.get("input_schema") or {"type": "object"},
            "annotations": entry.get("annotations"),
            "tool_type": entry.get("tool_type")
            if entry.get("tool_type") in ("action", "data_collection")
            else "action",
            "sensitive": False,
        }
    return tools


def tool_listing(tools: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The AIP ``list_tools`` answer for saucer's tool table (the inverse of :func:`tools_from_listing`)."""
    listing = []
    for name, info in sorted(tools.items()):
        namespace = str(info.get("server") or name.partition(".")[0])
        tool = str(info.get("tool") or name.partition(".")[2] or name)
        tool_type = str(info.get("tool_type") or "action")
        listing.append(
            {
                "tool_key": f"{tool_type}::{tool}",
                "tool_name": tool,
                "title": info.get("title"),
                "namespace": namespace,
                "tool_type": tool_type,
                "description": info.get("description") or "",
                "input_schema": info.get("input_schema"),
                "annotations": info.get("annotations"),
            }
        )
    return listing


def new_id() -> str:
    """A fresh id for ``response_id`` / ``request_id``."""
    return str(uuid.uuid4())


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False)[:5]:
        loc = ".".join(str(p) for p in error["loc"]) or "<message>"
        parts.append(f"{loc}: {error['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
