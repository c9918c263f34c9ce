"""The typed, event-sourced Context shared by every agent of a session.

``Context`` and ``ContextNames`` are UFO's API; ``prune`` drops a session's
old history (see :mod:`saucer.context.retention`); export and import of a
whole session are in :mod:`saucer.context.transfer`.
"""

from saucer.context.context import Context, Durability
from saucer.context.events import Event, ValueNotStorableError
from saucer.context.names import ContextNames, WeavingMode
from saucer.context.retention import prune

__all__ = ["Context", "ContextNames", "Durability", "Event", "ValueNotStorableError", "WeavingMode", "prune"]
