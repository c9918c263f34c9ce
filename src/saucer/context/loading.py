"""Loading a Context's committed state into all that keeps track of it.

The working copy takes the state (:meth:`~saucer.context.working.WorkingCopy.load`);
the snapshotter learns where the newest snapshot is and how long the tail after it;
the participants gate learns who was added. Every reload (opening, a re-base,
a rollback) goes through :class:`Loader`, so none of them is forgotten.
"""

from __future__ import annotations

from saucer.context.participants import ParticipantGate
from saucer.context.snapshots import Snapshotter
from saucer.context.working import WorkingCopy

__all__ = ["Loader"]


class Loader:
    """Loads the committed state at ``upto`` (the head when None), dropping what is pending (a :class:`Reloader`)."""

    def __init__(self, work: WorkingCopy, snapshots: Snapshotter, gate: ParticipantGate) -> None:
        self._work = work
        self._snapshots = snapshots
        self._gate = gate

    def __call__(self, upto: int | None = None) -> None:
        """Load the committed state at ``upto`` (the head when None)."""
        loaded = self._work.load(upto)
        self._snapshots.loaded(loaded, self._work.version)
        self._gate.loaded(loaded.state)
