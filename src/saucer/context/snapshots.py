"""When a Context stores a snapshot of its session, and how.

A snapshot is the whole committed state at a version (its wire form). Opening
a session reads the newest snapshot plus the events after it, so snapshots
keep open time bounded; they are a cache of the fold, never the truth, so a
snapshot that cannot be written is a warning, never a failed commit.
"""

from __future__ import annotations

import time
import warnings

import orjson

from saucer.context.core import ContextCore
from saucer.context.events import state_to_wire
from saucer.store.model import Snapshot, StoreKeyError

__all__ = ["Snapshots"]

#: Snapshots up to this size are taken every ``snapshot_every`` events, whatever the tail.
_SMALL_SNAPSHOT = 64 * 1024
#: Rough stored size of one operation, to weigh a tail against a snapshot.
_OP_BYTES = 64


class Snapshots(ContextCore):
    """Taking snapshots: on demand, and every ``snapshot_every`` events after a commit."""

    def snapshot(self, *, whole: bool = False) -> int:
        """Store a snapshot of the committed state now; return its version.

        ``whole`` writes each packed value whole, without the operations since
        its base (see :func:`~saucer.context.events.state_to_wire`): what
        :meth:`close` stores, so that reading a finished session decodes its
        values and folds no tails.

        Older snapshots of the session beyond the newest ``keep_snapshots`` are
        dropped: hydrate only ever needs the newest (the one before it is kept
        in case the newest is damaged). Opening ``at=`` an old version replays
        from the newest snapshot before it, or from the start.
        """
        with self._lock:
            store, sid = self._require_store()
            if self._pending:
                raise RuntimeError("commit() pending changes before taking a snapshot")
            if self._state.opaque:
                raise StoreKeyError(
                    f"session {self._session_id!r}: no snapshot without the store key: "
                    f"{', '.join(sorted(self._state.opaque))} read as <encrypted>"
                )
            wire = state_to_wire(self._state, pack=True, whole=whole)
            # What a snapshot writes: the next one, spaced by it, writes about as much again (a
            # packed value that changed only by appends is written as its base and new tail).
            self._snapshot_bytes = len(orjson.dumps(wire))
            self._snapshot_tails = any("tails" in entry for entry in wire.get("packed", {}).values())
            self._tail_ops = 0
            # Prune first, so the file never holds more than ``keep_snapshots``
            # copies of a large state at once; a crash in between only means a
            # longer replay on the next open, never a wrong state.
            # (a snapshot at this version already, which this one replaces, counts as the new one)
            replacing = self._snapshot_version == self._version > 0
            store.prune_snapshots(sid, self._keep_snapshots - (0 if replacing else 1))
            store.save_snapshot(Snapshot(sid, self._version, time.time(), wire))
            self._snapshot_version = self._version
            return self._version

    def _maybe_snapshot(self) -> None:
        if self._snapshot_due() and not self._state.opaque:
            self._auto_snapshot()

    def _snapshot_due(self) -> bool:
        """Every ``snapshot_every`` events, and, for a large state, not before the tail
        written since the last snapshot is worth half of it.

        A snapshot costs what it writes: taken every K events of a state that
        grows with the session, snapshots alone would make a long session
        quadratic. Spacing them by the tail's size keeps their total cost
        linear, while a hydrate still reads one snapshot plus a tail no bigger
        than about half a snapshot (so open time follows the state's size, not
        the history's length). A large value that grew only by appends is
        written as its packed base and the operations since
        (:class:`~saucer.context.events.Packed`), so what a snapshot writes,
        and so the tail after a crash, follows its compressed size.
        """
        if self._version - self._snapshot_version < self._snapshot_every:
            return False
        if self._snapshot_bytes <= _SMALL_SNAPSHOT:
            return True
        return self._tail_ops * _OP_BYTES * 2 >= self._snapshot_bytes

    def _auto_snapshot(self, *, whole: bool = False) -> None:
        if self._state.opaque:
            return  # read without the store key: its placeholders are not data to store
        # The event is committed already: a snapshot that cannot be written
        # costs a longer replay later, it must not make the commit look failed.
        try:
            self.snapshot(whole=whole)
        except Exception as exc:
            warnings.warn(
                f"session {self._session_id!r}: snapshot at version {self._version} failed ({exc!r})",
                RuntimeWarning,
                stacklevel=3,
            )
