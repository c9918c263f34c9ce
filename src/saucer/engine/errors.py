"""Errors raised by the engine. Each message is one sentence saying what was wrong and where."""

from __future__ import annotations

from saucer.store.base import LeaseHeldError

__all__ = [
    "EngineError",
    "PlanError",
    "ModeError",
    "PlatformNotSupportedError",
    "LLMUnavailableError",
    "ServiceModeError",
    "DispatcherUnavailableError",
    "GraphError",
    "UnknownConditionError",
    "ExpressionError",
    "UnknownStateError",
    "LeaseLostError",
    "LeaseHeldError",
]


class EngineError(Exception):
    """Base class of the engine's errors."""


class PlanError(EngineError, ValueError):
    """A plan file is missing or malformed; the message names the file and the field."""


class ModeError(EngineError, ValueError):
    """An unknown session mode, or a mode used without what it needs."""


class PlatformNotSupportedError(EngineError):
    """The requested platform cannot run on this machine."""


class LLMUnavailableError(EngineError):
    """A request (a text step, or normal mode) needs an LLM agent and none is available or configured."""


class ServiceModeError(EngineError):
    """Service mode needs a remote dispatcher, which ``saucer serve`` provides."""


class DispatcherUnavailableError(EngineError):
    """A command had to run but no command dispatcher is attached to the Context."""


class GraphError(EngineError, ValueError):
    """A transition graph is malformed or failed while routing."""


class UnknownConditionError(GraphError):
    """A serialised graph names a condition or target type nobody registered."""


class ExpressionError(GraphError):
    """An ``Expression`` condition does not parse, or failed when evaluated."""


class UnknownStateError(EngineError, KeyError):
    """An agent class has no state registered under that name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class LeaseLostError(EngineError):
    """The runner lost its lease on the session (another runner took it over)."""
