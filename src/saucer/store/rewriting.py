"""Rewriting a store's own records in place, in the current format (:attr:`Feature.REWRITE`).

:class:`RecordRewriting` is a base of :class:`~saucer.store.EventStore` (built
on its ``session_info`` and ``_require``): ``saucer store migrate --rewrite``
and ``saucer store rekey`` report the formats of a session's records and
store upcast or re-sealed events again through it; a backend implements
``_formats`` and ``_rewrite`` when it declares the feature.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from saucer.store.model import Event, Feature, NotSupportedError, Snapshot

__all__ = ["RecordRewriting"]


class RecordRewriting:
    """``record_formats`` and ``rewrite_events`` of an event store."""

    def record_formats(self, session_id: str) -> tuple[dict[int, int], dict[int, int]]:
        """``({version: format}, {snapshot version: format})`` of this session's *own*
        stored records (damaged ones left out); needs :attr:`Feature.REWRITE`."""
        self._require(Feature.REWRITE, "report record formats")  # type: ignore[attr-defined]
        self.session_info(session_id)  # type: ignore[attr-defined]
        return self._formats(session_id)

    def rewrite_events(
        self,
        session_id: str,
        events: Sequence[Event],
        snapshots: Sequence[Snapshot] = (),
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Store ``events`` again (current format) in place of this session's own events at the same versions,
        with ``snapshots`` and its stored ``meta`` if given, in ONE transaction (all or none after a crash; needs
        :attr:`Feature.REWRITE`); the caller promises the same meaning (upcast, or sealed with another key)."""
        self._require(Feature.REWRITE, "rewrite events")  # type: ignore[attr-defined]
        info = self.session_info(session_id)  # type: ignore[attr-defined]
        low = info.parent_version or 0
        if bad := [e.version for e in events if not low < e.version <= info.version]:
            raise ValueError(f"session {session_id!r} has no own events at versions {bad} to rewrite")
        if events or snapshots or meta is not None:
            self._rewrite(session_id, list(events), list(snapshots), meta)

    def _formats(self, session_id: str) -> tuple[dict[int, int], dict[int, int]]:
        raise NotSupportedError(f"{type(self).__name__} does not declare {Feature.REWRITE} yet lacks _formats")

    def _rewrite(
        self, session_id: str, events: list[Event], snapshots: Sequence[Snapshot], meta: dict[str, Any] | None
    ) -> None:
        raise NotSupportedError(f"{type(self).__name__} does not declare {Feature.REWRITE} yet lacks _rewrite")
