"""The typed, event-sourced Context shared by every agent of a session."""

from saucer.context.context import Context, Durability
from saucer.context.events import Event, ValueNotStorableError
from saucer.context.names import ContextNames, WeavingMode

__all__ = ["Context", "ContextNames", "Durability", "Event", "ValueNotStorableError", "WeavingMode"]
