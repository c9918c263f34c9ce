"""Wire protocol of service mode: JSON frames over one WebSocket.

Every frame is a JSON object with a ``type`` discriminator and a
``protocol_version``. Frames are pydantic models; :func:`parse_frame` turns raw
text or bytes into exactly one of them or raises :class:`ProtocolError` with a
machine-readable ``code`` and a message that says what was wrong and where.
:func:`encode_frame` never sends null fields.

Conversation (``→`` client/device to server, ``←`` server to client/device)::

    → register             ← registered            (or ← error, then close)
    → heartbeat            ← heartbeat_ack
    → task                 ← task_accepted (session_id), later ← task_end
    ← command              → command_results      (prev_response_id = response_id)
    ← cancel               → command_results      (the cancelled batch's answer; its acknowledgement)
    ← device_info_request  → device_info_response
    ↔ error                (code, message, ref)

A malformed, unknown or misplaced frame is answered with an ``error`` frame
and the connection stays up. Unlike UFO's AIP, a heartbeat is never an
acknowledgement of anything else, and every ``command`` gets exactly one
``command_results`` with one result per command, in order. A ``cancel``
names a ``command`` batch still running: the device stops it (the local tool
call is cancelled, which ends a shell command's whole process group) and
answers that batch at once, each of its commands a failure saying so.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal, get_args

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

# The frames the dispatcher itself sends and reads live with it; they are part of this protocol too.
from saucer.dispatch.wire import (
    PROTOCOL_VERSION,
    BaseFrame,
    CancelFrame,
    CommandFrame,
    CommandResultsFrame,
    ErrorCode,
    ProtocolError,
    align_results,
    failure_results,
)

__all__ = [
    "PROTOCOL_VERSION",
    "DEFAULT_MAX_FRAME_BYTES",
    "ErrorCode",
    "ProtocolError",
    "PlanCommand",
    "PlanStep",
    "TaskSpec",
    "BaseFrame",
    "RegisterFrame",
    "RegisteredFrame",
    "HeartbeatFrame",
    "HeartbeatAckFrame",
    "TaskFrame",
    "TaskAcceptedFrame",
    "CommandFrame",
    "CancelFrame",
    "CommandResultsFrame",
    "TaskEndFrame",
    "DeviceInfoRequestFrame",
    "DeviceInfoResponseFrame",
    "ErrorFrame",
    "Frame",
    "FRAME_TYPES",
    "frame_size",
    "frame_ref",
    "parse_frame",
    "encode_frame",
    "align_results",
    "failure_results",
    "now",
]

DEFAULT_MAX_FRAME_BYTES = 1024 * 1024
"""Default largest frame (in UTF-8 bytes) a peer accepts."""


# --------------------------------------------------------------------------- tasks


class PlanCommand(BaseModel):
    """One command of a plan step; the runner assigns its ``call_id``."""

    model_config = ConfigDict(extra="forbid")

    tool_name: str = Field(min_length=1)
    parameters: dict[str, Any] = Field(default_factory=dict)
    tool_type: Literal["action", "data_collection"] = "action"


class PlanStep(BaseModel):
    """One step of a plan: a subtask and the commands that carry it out."""

    model_config = ConfigDict(extra="forbid")

    subtask: str = ""
    commands: list[PlanCommand] = Field(default_factory=list)
    timeout: float | None = Field(default=None, gt=0, description="seconds for this step's batch")


class TaskSpec(BaseModel):
    """A task submitted to a device: a request and, for the plan runner, its steps."""

    model_config = ConfigDict(extra="forbid")

    task: str = Field(min_length=1)
    steps: list[PlanStep] = Field(default_factory=list)
    timeout: float | None = Field(default=None, gt=0, description="default seconds per step batch")
    vars: dict[str, Any] = Field(default_factory=dict, description="context variables the session starts with")
    participants: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list,
        description="who else may write to the session while it runs (the submitting principal always may); none: anyone",
    )

    def submitted_by(self, owner: str) -> TaskSpec:
        """This task as ``owner`` submits it: ``owner`` is one of its participants when it names any."""
        if not self.participants or owner in self.participants:
            return self
        return self.model_copy(update={"participants": [*self.participants, owner]})


# -------------------------------------------------------------------------- frames


class RegisterFrame(BaseFrame):
    """First frame of a connection: who is speaking and in which role.

    ``inflight`` lists the ``response_id`` s a reconnecting device is still
    working on or holds results for; the server fails every other command it
    had sent to that device, at once, instead of waiting for a reply that will
    never come.
    """

    type: Literal["register"] = "register"
    role: Literal["device", "client"] = "device"
    client_id: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:@-]+$")
    info: dict[str, Any] = Field(default_factory=dict)
    inflight: list[str] = Field(default_factory=list, max_length=10_000)


class RegisteredFrame(BaseFrame):
    """The server accepted a registration."""

    type: Literal["registered"] = "registered"
    client_id: str
    role: Literal["device", "client"]
    server_instance: str
    heartbeat_interval: float
    max_frame_bytes: int


class HeartbeatFrame(BaseFrame):
    """Liveness signal from a device or client; answered by ``heartbeat_ack``."""

    type: Literal["heartbeat"] = "heartbeat"
    sent_at: float | None = None


class HeartbeatAckFrame(BaseFrame):
    """Answer to a heartbeat; acknowledges nothing else."""

    type: Literal["heartbeat_ack"] = "heartbeat_ack"
    sent_at: float | None = None


class TaskFrame(BaseFrame):
    """Ask the server to run ``task`` on ``target_device_id`` (a device: itself by default)."""

    type: Literal["task"] = "task"
    task: TaskSpec
    target_device_id: str | None = None
    request_id: str | None = Field(default=None, max_length=200)


class TaskAcceptedFrame(BaseFrame):
    """A task became session ``session_id``, owned by the submitter."""

    type: Literal["task_accepted"] = "task_accepted"
    session_id: str
    device_id: str
    request_id: str | None = None


class TaskEndFrame(BaseFrame):
    """A session ended; sent to the connection that submitted it, if still there."""

    type: Literal["task_end"] = "task_end"
    session_id: str
    status: Literal["completed", "failed", "cancelled"]
    results: list[Any] = Field(default_factory=list)
    error: str | None = None


class DeviceInfoRequestFrame(BaseFrame):
    """Ask for a device's description (server → device, or client → server)."""

    type: Literal["device_info_request"] = "device_info_request"
    request_id: str = Field(min_length=1, max_length=200)
    device_id: str | None = None


class DeviceInfoResponseFrame(BaseFrame):
    """A device's description, answering ``device_info_request`` ``request_id``."""

    type: Literal["device_info_response"] = "device_info_response"
    request_id: str = Field(min_length=1, max_length=200)
    device_id: str | None = None
    info: dict[str, Any] = Field(default_factory=dict)


class ErrorFrame(BaseFrame):
    """Something the peer sent was refused; ``ref`` names the id it refers to."""

    type: Literal["error"] = "error"
    code: str
    message: str
    ref: str | None = None


Frame = Annotated[
    RegisterFrame
    | RegisteredFrame
    | HeartbeatFrame
    | HeartbeatAckFrame
    | TaskFrame
    | TaskAcceptedFrame
    | CommandFrame
    | CancelFrame
    | CommandResultsFrame
    | TaskEndFrame
    | DeviceInfoRequestFrame
    | DeviceInfoResponseFrame
    | ErrorFrame,
    Field(discriminator="type"),
]
"""Any frame of the protocol, discriminated by ``type``."""

_FRAME_MODELS: tuple[type[BaseFrame], ...] = get_args(get_args(Frame)[0])

_FRAME_ADAPTER: TypeAdapter[Any] = TypeAdapter(Frame)
FRAME_TYPES: frozenset[str] = frozenset(model.model_fields["type"].default for model in _FRAME_MODELS)
"""Every ``type`` value this version of the protocol knows."""


def frame_size(data: bytes | str) -> int:
    """Size of a raw frame in bytes as it travels (UTF-8 for text)."""
    return len(data) if isinstance(data, (bytes, bytearray)) else len(data.encode("utf-8"))


def parse_frame(data: bytes | str, *, max_bytes: int | None = DEFAULT_MAX_FRAME_BYTES) -> Any:
    """Parse one raw frame into its model; raise :class:`ProtocolError` if it is not acceptable.

    The checks go from cheap to expensive: size, JSON, object shape, ``type``,
    ``protocol_version``, then the fields of that frame type (the error names
    the field path, e.g. ``commands.0.tool_name``).
    """
    if max_bytes is not None:
        size = frame_size(data)
        if size > max_bytes:
            raise ProtocolError(
                ErrorCode.FRAME_TOO_LARGE, f"frame of {size} bytes exceeds the limit of {max_bytes} bytes"
            )
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(ErrorCode.MALFORMED_JSON, f"frame is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(ErrorCode.NOT_AN_OBJECT, f"frame must be a JSON object, got {type(obj).__name__}")
    ref = frame_ref(obj)
    kind = obj.get("type")
    if kind is None:
        raise ProtocolError(ErrorCode.MISSING_TYPE, "frame has no 'type' field", ref)
    if not isinstance(kind, str) or kind not in FRAME_TYPES:
        raise ProtocolError(
            ErrorCode.UNKNOWN_TYPE, f"unknown frame type {kind!r}; known types: {', '.join(sorted(FRAME_TYPES))}", ref
        )
    version = obj.get("protocol_version", PROTOCOL_VERSION)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"protocol_version {version!r} is not supported; this peer speaks {PROTOCOL_VERSION}",
            ref,
        )
    try:
        return _FRAME_ADAPTER.validate_python(obj)
    except ValidationError as exc:
        raise ProtocolError(ErrorCode.INVALID_FRAME, f"invalid {kind!r} frame: {_describe(exc)}", ref) from None


def encode_frame(frame: BaseModel) -> str:
    """Serialise a frame to JSON text; fields that are None are left out."""
    return frame.model_dump_json(exclude_none=True)


def now() -> float:
    """Wall-clock time in seconds, the unit of every timestamp on the wire and on disk."""
    return time.time()


def frame_ref(obj: dict[str, Any]) -> str | None:
    """The id an error about a message names, so the sender can correlate it (saucer's frames and AIP's)."""
    for key in ("response_id", "prev_response_id", "request_id", "session_id"):
        value = obj.get(key)
        if isinstance(value, str) and value:
            return value[:200]
    return None


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False)[:5]:
        # The first element of a union location is the discriminator tag; skip it.
        loc = [str(p) for p in error["loc"]][1:]
        parts.append(f"{'.'.join(loc) or '<frame>'}: {error['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
