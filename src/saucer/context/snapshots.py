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

from saucer.context.events import state_to_wire
from saucer.context.replay import Replayed
from saucer.context.working import WorkingCopy
from saucer.store.model import Lease, Snapshot, StoreKeyError

__all__ = ["Snapshotter", "KEEP_SNAPSHOTS"]

#: Snapshots kept per session: the newest, and one to fall back on if it is damaged.
KEEP_SNAPSHOTS = 2
#: Snapshots up to this size are taken every ``snapshot_every`` events, whatever the tail.
_SMALL_SNAPSHOT = 64 * 1024
#: Rough stored size of one operation, to weigh a tail against a snapshot.
_OP_BYTES = 64


class Snapshotter:
    """Taking a Context's snapshots: on demand, and every ``every`` events after a commit."""

    def __init__(self, work: WorkingCopy) -> None:
        self._work = work
        #: A snapshot is due every this many events (see :meth:`due`).
        self.every = 100
        #: Snapshots kept per session.
        self.keep = KEEP_SNAPSHOTS
        #: The version of the newest snapshot this Context read or wrote.
        self.version = 0
        #: Roughly what the next snapshot writes (the size of the last one).
        self.bytes = 0
        # Whether the newest snapshot this Context wrote has packed values with tails
        # (close() then writes one whole, see snapshot()).
        self.tails = False
        #: Operations committed since the last snapshot.
        self.tail_ops = 0

    def loaded(self, loaded: Replayed, head: int) -> None:
        """The working copy was loaded at ``head`` from ``loaded``."""
        self.version = loaded.snapshot_version
        # Known without decoding anything for a snapshot with packed values: roughly what the
        # next snapshot writes again, which the spacing weighs the tail against.
        self.bytes = sum(len(p.data) + sum(map(len, p.tails)) for p in loaded.state.packed.values())
        self.tail_ops = head - loaded.snapshot_version

    def snapshot(self, *, whole: bool = False, release: Lease | None = None) -> int:
        """Store a snapshot of the committed state now; return its version.

        ``whole`` writes each packed value whole, without the operations since
        its base (see :func:`~saucer.context.events.state_to_wire`): what
        closing a Context stores, so that reading a finished session decodes its
        values and folds no tails.

        Older snapshots of the session beyond the newest ``keep_snapshots`` are
        dropped: hydrate only ever needs the newest (the one before it is kept
        in case the newest is damaged). Opening ``at=`` an old version replays
        from the newest snapshot before it, or from the start. ``release``: a lease
        given back with it (:meth:`~saucer.store.EventStore.save_snapshot_released`).
        """
        work = self._work
        with work.lock:
            store, sid = work.require_store()
            if work.pending:
                raise RuntimeError("commit() pending changes before taking a snapshot")
            if work.state.opaque:
                raise StoreKeyError(
                    f"session {sid!r}: no snapshot without the store key: "
                    f"{', '.join(sorted(work.state.opaque))} read as <encrypted>"
                )
            wire = state_to_wire(work.state, pack=True, whole=whole)
            # What a snapshot writes: the next one, spaced by it, writes about as much again (a
            # packed value that changed only by appends is written as its base and new tail).
            self.bytes = len(orjson.dumps(wire))
            self.tails = any("tails" in entry for entry in wire.get("packed", {}).values())
            self.tail_ops = 0
            # Prune first, so the file never holds more than ``keep_snapshots``
            # copies of a large state at once; a crash in between only means a
            # longer replay on the next open, never a wrong state.
            # (a snapshot at this version already, which this one replaces, counts as the new one)
            replacing = self.version == work.version > 0
            snap, keep = Snapshot(sid, work.version, time.time(), wire), self.keep - (0 if replacing else 1)
            if release is None:
                store.save_snapshot_pruned(snap, keep)
            else:
                store.save_snapshot_released(snap, keep, release)
            self.version = work.version
            return work.version

    def maybe(self) -> None:
        """Take a snapshot if one is due (after a commit)."""
        if self.due() and not self._work.state.opaque:
            self.auto()

    def maybe_locked(self) -> None:
        """:meth:`maybe` under the Context's lock (from a worker thread after an asynchronous commit)."""
        with self._work.lock:
            self.maybe()

    def due(self) -> bool:
        """Every ``every`` events, and, for a large state, not before the tail
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
        if self._work.version - self.version < self.every:
            return False
        if self.bytes <= _SMALL_SNAPSHOT:
            return True
        return self.tail_ops * _OP_BYTES * 2 >= self.bytes

    def needed_on_close(self) -> bool:
        """Whether closing should write a last snapshot: new history since the last, or one with tails."""
        return self._work.version > self.version or self.tails

    def auto(self, *, whole: bool = False, release: Lease | None = None) -> bool:
        """Take a snapshot after a commit: a failure is a warning (the event is committed already).
        True when it was written (and ``release`` given back with it)."""
        work = self._work
        if work.state.opaque:
            return False  # read without the store key: its placeholders are not data to store
        # The event is committed already: a snapshot that cannot be written
        # costs a longer replay later, it must not make the commit look failed.
        try:
            self.snapshot(whole=whole, release=release)
        except Exception as exc:
            warnings.warn(
                f"session {work.session_id!r}: snapshot at version {work.version} failed ({exc!r})",
                RuntimeWarning,
                stacklevel=3,
            )
            return False
        return True
