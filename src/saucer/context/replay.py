"""Loading a session's committed state from a store.

A session's state at a version is its newest usable snapshot at or before that
version, then the events after it, folded by :func:`~saucer.context.events.apply_ops`
(the same fold live writes use). Opening a Context and computing the base
state of a prune both load state this way.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from saucer.context.events import State, apply_ops, state_from_wire
from saucer.store.base import EventStore
from saucer.store.model import CorruptRecordError

__all__ = ["Replayed", "replay"]


@dataclass(slots=True)
class Replayed:
    """A state loaded by :func:`replay`."""

    #: The state, as the events up to ``version`` left it.
    state: State
    #: The version of the snapshot it started from (0: it started from nothing).
    snapshot_version: int
    #: The last version folded in. Below the version asked for only when the
    #: store skipped a damaged *trailing* record (it warned).
    version: int


def replay(store: EventStore, session_id: str, upto: int) -> Replayed:
    """The session's state at ``upto``: the newest usable snapshot, then the events after it.

    A version that was pruned raises :class:`~saucer.store.VersionPrunedError`,
    never an empty or partial state; events that do not apply raise
    :class:`~saucer.store.CorruptRecordError`. A snapshot that cannot be decoded
    is skipped with a warning: it is a cache, the log is the truth.
    """
    if upto == 0:  # before the first event: nothing to read (a new session opened by its maker)
        return Replayed(State(), 0, 0)
    snap = store.latest_snapshot(session_id, upto)
    state: State | None = None
    if snap is not None:
        try:
            state = state_from_wire(snap.state)
        except Exception as exc:  # a snapshot is a cache: fall back to the log
            warnings.warn(
                f"session {session_id!r}: ignoring unusable snapshot at version {snap.version} ({exc!r})",
                RuntimeWarning,
                stacklevel=3,
            )
            snap = None
    if state is not None and snap is not None:
        for packed in state.packed.values():
            packed.where = (session_id, snap.version)
    if state is None:
        state = State()
    base = snap.version if snap else 0
    seen = base
    events = list(store.read(session_id, base, upto))
    if events and events[0].version != base + 1:
        state = State()  # pruned past the snapshot meanwhile: the log starts with a base event that sets everything
    for event in events:
        try:
            apply_ops(state, event.ops)
        except Exception as exc:
            raise CorruptRecordError(event.session_id, event.version, f"cannot apply its operations: {exc!r}") from None
        seen = event.version
    if seen < upto:
        store.check_readable(session_id, upto)  # pruned meanwhile: VersionPrunedError, never a partial state
    return Replayed(state, base, seen)
