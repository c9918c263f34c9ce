"""The frames of the wire protocol the WebSocket dispatcher itself sends and reads.

A ``command`` batch goes to a device, a ``cancel`` may follow it, and the
device answers with one ``command_results``; :func:`align_results` makes
"one Result per Command, in order" hold whatever the device sends. These are
the dispatcher's own vocabulary, so they live in :mod:`saucer.dispatch`; the
rest of service mode's protocol (registration, tasks, heartbeats, the frame
parser) is :mod:`saucer.service.protocol`, which names these too.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from saucer.dispatch.messages import Command, Result, ResultStatus

__all__ = [
    "PROTOCOL_VERSION",
    "ErrorCode",
    "ProtocolError",
    "BaseFrame",
    "CommandFrame",
    "CancelFrame",
    "CommandResultsFrame",
    "align_results",
    "failure_results",
]

PROTOCOL_VERSION = 1
"""Version of this wire protocol; a peer speaking another version is refused."""


class ErrorCode:
    """The ``code`` values of ``error`` frames and :class:`ProtocolError`."""

    FRAME_TOO_LARGE = "frame_too_large"
    MALFORMED_JSON = "malformed_json"
    NOT_AN_OBJECT = "not_an_object"
    MISSING_TYPE = "missing_type"
    UNKNOWN_TYPE = "unknown_type"
    INVALID_FRAME = "invalid_frame"
    UNSUPPORTED_VERSION = "unsupported_version"
    UNEXPECTED_FRAME = "unexpected_frame"
    NOT_REGISTERED = "not_registered"
    ALREADY_REGISTERED = "already_registered"
    UNAUTHORIZED = "unauthorized"
    DEVICE_OWNED = "device_owned"
    UNKNOWN_RESPONSE = "unknown_response"
    SESSION_MISMATCH = "session_mismatch"
    RESULTS_MISMATCH = "results_mismatch"
    UNKNOWN_DEVICE = "unknown_device"
    DEVICE_OFFLINE = "device_offline"
    INVALID_TASK = "invalid_task"
    SUPERSEDED = "superseded"
    HEARTBEAT_TIMEOUT = "heartbeat_timeout"
    SHUTTING_DOWN = "shutting_down"
    INTERNAL = "internal_error"


class ProtocolError(Exception):
    """A frame that cannot be accepted; ``code`` is one of :class:`ErrorCode`."""

    def __init__(self, code: str, message: str, ref: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.ref = ref


class BaseFrame(BaseModel):
    """What every frame carries: its protocol version; unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")

    protocol_version: int = PROTOCOL_VERSION


class CommandFrame(BaseFrame):
    """A batch of commands for a device; answered by one ``command_results``."""

    type: Literal["command"] = "command"
    response_id: str = Field(min_length=1)
    session_id: str
    commands: list[Command]
    timeout: float = Field(gt=0)
    #: Call ids of sensitive commands a person approved on the server (the device runs them without asking).
    approved: list[str] | None = None


class CancelFrame(BaseFrame):
    """Stop the ``command`` batch ``response_id``; answered by that batch's ``command_results``."""

    type: Literal["cancel"] = "cancel"
    response_id: str = Field(min_length=1)
    session_id: str
    reason: str = Field(default="cancelled", max_length=500)


class CommandResultsFrame(BaseFrame):
    """One result per command of the ``command`` frame ``prev_response_id``, in order."""

    type: Literal["command_results"] = "command_results"
    prev_response_id: str = Field(min_length=1)
    session_id: str
    results: list[Result]


def align_results(commands: list[Command], results: list[Result], *, source: str) -> tuple[list[Result], list[str]]:
    """Return exactly one result per command, in order, plus a list of problems found.

    Results are matched by ``call_id`` when they carry one, by position
    otherwise; a command left without a result gets a failure naming
    ``source``. This is what makes "one Result per Command" hold even when the
    other side misbehaves.
    """
    problems: list[str] = []
    if len(results) == len(commands) and all(
        r.call_id in (None, c.call_id) for c, r in zip(commands, results, strict=False)
    ):
        aligned = [
            r if r.call_id == c.call_id else r.model_copy(update={"call_id": c.call_id})
            for c, r in zip(commands, results, strict=False)
        ]
        return aligned, problems
    if len(results) != len(commands):
        problems.append(f"{source} returned {len(results)} results for {len(commands)} commands")
    by_id: dict[str, list[Result]] = {}
    anonymous: list[Result] = []
    for result in results:
        if result.call_id is None:
            anonymous.append(result)
        else:
            by_id.setdefault(result.call_id, []).append(result)
    aligned = []
    for command in commands:
        matches = by_id.get(command.call_id)
        if matches:
            aligned.append(matches.pop(0))
        elif anonymous:
            aligned.append(anonymous.pop(0).model_copy(update={"call_id": command.call_id}))
        else:
            problems.append(f"no result for call_id {command.call_id}")
            aligned.append(Result.failure(command, f"{source} returned no result for this command"))
    stray = [cid for cid, left in by_id.items() for _ in left]
    if stray:
        problems.append(f"results for unknown call_ids: {', '.join(stray[:5])}")
    return aligned, problems


def failure_results(commands: list[Command], error: str) -> list[Result]:
    """One failure result per command, all with the same cause."""
    return [Result(status=ResultStatus.FAILURE, error=error, call_id=c.call_id) for c in commands]
