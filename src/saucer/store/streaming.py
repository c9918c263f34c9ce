"""Reading a session's events as a stream: in version ranges, never the whole log at once.

:class:`EventStreaming` is a base of :class:`~saucer.store.EventStore`. Its
:meth:`~EventStreaming.iter_events` reads ``batch`` versions at a time through
the backend's ranged ``_read`` (an indexed range on every durable backend), so
a reader of a 10^5-event session holds one batch in memory, not the log.
"""

from __future__ import annotations

from collections.abc import Iterator

from saucer.store.model import Event, StoreError, check_version

__all__ = ["EventStreaming", "DEFAULT_BATCH"]

#: Versions read per query by :meth:`EventStreaming.iter_events`.
DEFAULT_BATCH = 1000


class EventStreaming:
    """``iter_events`` of an event store (built on its ``session_info``, ``_first`` and ``_lineage``)."""

    def iter_events(
        self, session_id: str, after: int = 0, upto: int | None = None, *, batch: int = DEFAULT_BATCH
    ) -> Iterator[Event]:
        """The events of the session's whole lineage with ``after < version <= upto``, read
        ``batch`` versions at a time (the same events, in the same order, as :meth:`read`).

        ``upto`` defaults to the session's head when the iteration starts:
        events committed meanwhile are not included. A pruned session's
        stream starts at its first readable version. Each batch is its own
        read: if the log changes under the stream (a prune, a deleted
        session), it raises :class:`StoreError` (or the backend's
        :class:`SessionNotFoundError`) rather than skip or repeat a version.
        """
        after = check_version(after, "after")
        upto = None if upto is None else check_version(upto, "upto")
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise ValueError(f"batch must be a positive integer, got {batch!r}")
        info = self.session_info(session_id)  # type: ignore[attr-defined]
        end = info.version if upto is None else min(upto, info.version)
        expected = max(after + 1, self._first(info))  # type: ignore[attr-defined]
        while expected <= end:
            stop = min(end, expected - 1 + batch)
            for event in self._lineage(info, expected - 1, stop):  # type: ignore[attr-defined]
                if event.version != expected:
                    raise StoreError(
                        f"session {session_id!r}: its log changed while being read (v{event.version} came where "
                        f"v{expected} was due; a prune?); try again"
                    )
                yield event
                expected += 1
            if expected <= stop:
                if expected == end and self._info(session_id) is not None:  # type: ignore[attr-defined]
                    return  # the damaged trailing record, skipped with a warning (as read does)
                raise StoreError(
                    f"session {session_id!r}: versions {expected}..{stop} could not be read (its log changed "
                    "while being read; a prune?); try again"
                )
