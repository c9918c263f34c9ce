"""Commands sent to tools and the results they return.

A dispatcher always answers a batch of commands with exactly one
:class:`Result` per :class:`Command`, in order, matched by ``call_id``.
"""

from __future__ import annotations

import uuid
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


def new_call_id() -> str:
    """Return a fresh, unique call id."""
    return uuid.uuid4().hex


class ResultStatus(str, Enum):
    """Outcome of one command."""

    SUCCESS = "success"
    FAILURE = "failure"
    SKIPPED = "skipped"
    NONE = "none"


class Command(BaseModel):
    """One tool invocation: ``server.tool`` (or a bare unique ``tool``) with parameters."""

    model_config = ConfigDict(extra="forbid")

    tool_name: str = Field(min_length=1)
    parameters: dict[str, Any] = Field({})
    tool_type: Literal["action", "data_collection"] = "action"
    call_id: str = Field(default_factory=new_call_id)

    def __init__(self, **data: Any) -> None:
        # An explicit ``call_id=None`` means "generate one", never "no id".
        if data.get("call_id") is None:
            data.pop("call_id", None)
        super().__init__(**data)


class Result(BaseModel):
    """The outcome of one command; ``error`` carries the cause of a failure."""

    model_config = ConfigDict(extra="forbid")

    status: ResultStatus
    result: Any = None
    error: str | None = None
    namespace: str | None = None
    call_id: str | None = None

    @classmethod
    def failure(cls, command: Command, error: str, namespace: str | None = None) -> Result:
        """A failure result for ``command`` with ``error`` as its cause."""
        return cls(status=ResultStatus.FAILURE, error=error, namespace=namespace, call_id=command.call_id)

    @classmethod
    def skipped(cls, command: Command, reason: str) -> Result:
        """A result for a command that was not run because of ``reason``."""
        return cls(status=ResultStatus.SKIPPED, error=reason, call_id=command.call_id)
