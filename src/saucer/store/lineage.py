"""Reading a session's log across its lineage: a fork reads its parent's log up to its branch
point (copy-on-write: nothing is copied), a pruned session from its first readable version.

:class:`Lineage` is a collaborator of :class:`~saucer.store.EventStore`, built on a
:class:`~saucer.store.recorder.Recorder` alone: the same for every backend.
:meth:`Lineage.iter_events` reads ``batch`` versions at a time through the
backend's ranged :meth:`~saucer.store.recorder.Recorder.read_own` (an indexed
range on every durable backend), so a reader of a 10^5-event session holds one
batch in memory, not the log.
"""

from __future__ import annotations

from collections.abc import Iterator

from saucer.store.model import (
    Event,
    SessionInfo,
    SessionNotFoundError,
    Snapshot,
    StoreError,
    VersionNotFoundError,
    VersionPrunedError,
    check_version,
)
from saucer.store.recorder import Recorder

__all__ = ["DEFAULT_BATCH", "Lineage"]

#: Versions read per query by :meth:`Lineage.iter_events`.
DEFAULT_BATCH = 1000


class Lineage:
    """Reads of a session's whole lineage, on ``recorder``."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def log_info(self, session_id: str) -> SessionInfo:
        """The session's row as reading its log needs it; :class:`SessionNotFoundError` if unknown."""
        info = self.recorder.log_row(session_id)
        if info is None:
            raise SessionNotFoundError(session_id)
        return info

    def read(self, session_id: str, after: int, upto: int | None) -> Iterator[Event]:
        """Events of the session's whole lineage with ``after < version <= upto``, consecutive
        (a read that raced with a prune is done again)."""
        after = check_version(after, "after")
        upto = None if upto is None else check_version(upto, "upto")
        for _ in range(3):
            info = self.log_info(session_id)
            start = max(after + 1, self.first(info))
            events = list(self.lineage(info, after, upto))
            if all(event.version == start + i for i, event in enumerate(events)):
                return iter(events)
        raise StoreError(f"session {session_id!r}: its log kept changing while being read (a prune?); try again")

    def lineage(self, info: SessionInfo, after: int, upto: int | None) -> Iterator[Event]:
        """Own events of ``info``'s session and, below its branch point, its parent's lineage."""
        if info.parent_id is not None and info.parent_version is not None and after < info.parent_version:
            limit = info.parent_version if upto is None else min(upto, info.parent_version)
            yield from self.lineage(self.log_info(info.parent_id), after, limit)
            after = info.parent_version
        if upto is not None and upto <= after:
            return
        yield from self.recorder.read_own(info.session_id, after, upto)

    def latest_snapshot(self, session_id: str, upto: int | None) -> Snapshot | None:
        """The newest snapshot usable for the session at or before ``upto`` (own, else its parent's)."""
        info = self.log_info(session_id)
        own = self.recorder.own_snapshot(session_id, upto)
        if own is not None:
            return own
        if info.parent_id is not None and info.parent_version is not None:
            limit = info.parent_version if upto is None else min(upto, info.parent_version)
            return self.latest_snapshot(info.parent_id, limit)
        return None

    def first(self, info: SessionInfo) -> int:
        """The oldest readable version of ``info``'s session (0 unless pruned); a fork that still
        reads its parent's log reads it from the parent's first version."""
        own = int(info.meta.get("pruned_to", 0))
        if info.parent_id is None or info.parent_version is None or own > info.parent_version:
            return own
        parent = self.recorder.log_row(info.parent_id)
        return own if parent is None else max(own, self.first(parent))

    def check_readable(self, info: SessionInfo, version: int) -> int:
        """``version`` if the session can be read at it, else VersionPrunedError or VersionNotFoundError."""
        first = self.first(info)
        if 0 <= version < first:
            raise VersionPrunedError(info.session_id, version, first, info.version)
        if not first <= version <= info.version:
            raise VersionNotFoundError(info.session_id, version, first, info.version)
        return version

    def last_event(self, info: SessionInfo) -> Event | None:
        """The event at ``info.version`` (of its lineage), or None: no events, a damaged newest
        record, or the session deleted meanwhile (warnings of a damaged record are the caller's)."""
        if not info.version:
            return None
        try:
            return next(iter(self.read(info.session_id, info.version - 1, info.version)), None)
        except StoreError:
            return None

    def iter_events(self, session_id: str, after: int, upto: int | None, batch: int) -> Iterator[Event]:
        """The events of the session's whole lineage with ``after < version <= upto``, read ``batch``
        versions at a time (see :meth:`saucer.store.EventStore.iter_events`)."""
        after = check_version(after, "after")
        upto = None if upto is None else check_version(upto, "upto")
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise ValueError(f"batch must be a positive integer, got {batch!r}")
        info = self.recorder.row(session_id)
        if info is None:
            raise SessionNotFoundError(session_id)
        end = info.version if upto is None else min(upto, info.version)
        expected = max(after + 1, self.first(info))
        while expected <= end:
            stop = min(end, expected - 1 + batch)
            for event in self.lineage(info, expected - 1, stop):
                if event.version != expected:
                    raise StoreError(
                        f"session {session_id!r}: its log changed while being read (v{event.version} came where "
                        f"v{expected} was due; a prune?); try again"
                    )
                yield event
                expected += 1
            if expected <= stop:
                if expected == end and self.recorder.row(session_id) is not None:
                    return  # the damaged trailing record, skipped with a warning (as read does)
                raise StoreError(
                    f"session {session_id!r}: versions {expected}..{stop} could not be read (its log changed "
                    "while being read; a prune?); try again"
                )
