"""Rewriting a store's own records in place, in the current format (:attr:`Feature.REWRITE`).

:class:`Rewriter` is a collaborator of :class:`~saucer.store.EventStore`, built on a
:class:`~saucer.store.recorder.Recorder`: ``saucer store migrate --rewrite`` and
``saucer store rekey`` report the formats of a session's records and store upcast
or re-sealed events again through it; a backend implements
:meth:`~saucer.store.recorder.Recorder.own_formats` and
:meth:`~saucer.store.recorder.Recorder.rewrite_rows` when it declares the feature.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from saucer.store.model import Event, Feature, NotSupportedError, SessionNotFoundError, Snapshot
from saucer.store.recorder import Recorder

__all__ = ["Rewriter", "require"]


def require(recorder: Recorder, feature: Feature, what: str) -> None:
    """:class:`NotSupportedError` unless ``recorder`` declares ``feature``."""
    if feature not in recorder.features:
        raise NotSupportedError(
            f"{type(recorder).__name__} cannot {what}: it does not have the feature {feature.value!r}"
        )


class Rewriter:
    """``record_formats`` and ``rewrite_events`` of an event store."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def record_formats(self, session_id: str) -> tuple[dict[int, int], dict[int, int]]:
        """See :meth:`saucer.store.EventStore.record_formats`."""
        require(self.recorder, Feature.REWRITE, "report record formats")
        if self.recorder.row(session_id) is None:
            raise SessionNotFoundError(session_id)
        return self.recorder.own_formats(session_id)

    def rewrite_events(
        self, session_id: str, events: Sequence[Event], snapshots: Sequence[Snapshot], meta: dict[str, Any] | None
    ) -> None:
        """See :meth:`saucer.store.EventStore.rewrite_events`."""
        require(self.recorder, Feature.REWRITE, "rewrite events")
        info = self.recorder.row(session_id)
        if info is None:
            raise SessionNotFoundError(session_id)
        low = info.parent_version or 0
        if bad := [e.version for e in events if not low < e.version <= info.version]:
            raise ValueError(f"session {session_id!r} has no own events at versions {bad} to rewrite")
        if events or snapshots or meta is not None:
            self.recorder.rewrite_rows(session_id, list(events), list(snapshots), meta)
