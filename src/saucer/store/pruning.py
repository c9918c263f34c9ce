"""Cutting a session's history (prune) and creating a session from a checked log (import).

:class:`Pruner` is a collaborator of :class:`~saucer.store.EventStore`, built on a
:class:`~saucer.store.recorder.Recorder`, the :class:`~saucer.store.lineage.Lineage`
reads and the :class:`~saucer.store.listing.SummaryKeeper`: it gives every fork
that reads a session's log its own copy first (forks never lose a version),
then has the backend cut the log in one transaction
(:meth:`~saucer.store.recorder.Recorder.prune_rows`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from saucer.store.lineage import Lineage
from saucer.store.listing import SummaryKeeper
from saucer.store.model import (
    Event,
    Feature,
    SessionInfo,
    SessionNotFoundError,
    Snapshot,
    StoreError,
    VersionNotFoundError,
    check_session_id,
    check_version,
)
from saucer.store.recorder import Recorder
from saucer.store.rewriting import require
from saucer.store.summary import fold_events

__all__ = ["Pruner"]


class Pruner:
    """``replace_history`` and ``import_log`` of an event store."""

    def __init__(self, recorder: Recorder, lineage: Lineage, summaries: SummaryKeeper) -> None:
        self.recorder = recorder
        self.lineage = lineage
        self.summaries = summaries

    def replace_history(self, session_id: str, cut: int, base_ops: list[dict[str, Any]], state: dict[str, Any]) -> int:
        """See :meth:`saucer.store.EventStore.replace_history`."""
        require(self.recorder, Feature.REPLACE_HISTORY, "replace history (prune)")
        cut = check_version(cut, "cut")
        for _ in range(5):
            info = self.recorder.row(session_id)
            if info is None:
                raise SessionNotFoundError(session_id)
            first = self.lineage.first(info)
            if cut <= first:
                return first
            if cut > info.version:
                raise VersionNotFoundError(session_id, cut, first, info.version)
            if info.parent_id is not None and info.parent_version is not None and cut <= info.parent_version:
                raise ValueError(
                    f"session {session_id!r} is a fork of {info.parent_id!r} at version {info.parent_version}: "
                    f"it is cut only above that version, not at {cut}"
                )
            for fork in self.recorder.forks_of(session_id):
                self._materialise_fork(fork)
            snapshot = Snapshot(session_id, cut, time.time(), state)
            if self.recorder.prune_rows(session_id, cut, self._base_event(info, cut, base_ops), snapshot):
                return self.lineage.first(self.lineage.log_info(session_id))
        raise StoreError(f"session {session_id!r}: new forks kept appearing while it was pruned; try again")

    def _base_event(self, info: SessionInfo, cut: int, ops: list[dict[str, Any]]) -> Event:
        """The base event that replaces the session's own event at ``cut`` (its time, round and step stay)."""
        original = next(iter(self.recorder.read_own(info.session_id, cut - 1, cut)), None)
        if original is None:
            raise StoreError(f"session {info.session_id!r}: cannot prune at version {cut}: its event is missing")
        return Event(
            session_id=info.session_id,
            version=cut,
            timestamp=original.timestamp,
            author="system",
            round=original.round,
            step=original.step,
            ops=ops,
            meta={"pruned": {"upto": cut, "author": original.author}},
        )

    def _materialise_fork(self, fork: SessionInfo) -> None:
        """Give a fork its own copy of the parent's lineage it reads, so it stands alone."""
        if fork.parent_id is None or fork.parent_version is None:
            return
        first = self.lineage.first(fork)
        after = max(first - 1, 0)
        # The copies keep their own session ids: they stay attributed to where they were made.
        events = list(self.lineage.read(fork.parent_id, after, fork.parent_version))
        if len(events) != fork.parent_version - after:
            raise StoreError(
                f"session {fork.session_id!r}: cannot copy versions {after + 1}..{fork.parent_version} "
                f"of its parent {fork.parent_id!r} (some are missing); nothing was pruned"
            )
        snap = self.lineage.latest_snapshot(fork.parent_id, fork.parent_version)
        own = None if snap is None or snap.version < first else replace(snap, session_id=fork.session_id)
        meta: dict[str, Any] = {"forked_from": fork.parent_id, "at": fork.parent_version}
        if first:
            meta["pruned_to"] = first
        self.recorder.materialise_rows(fork, events, own, meta)

    def import_log(self, info: SessionInfo, events: list[Event], snapshots: Sequence[Snapshot]) -> None:
        """See :meth:`saucer.store.EventStore.import_log`."""
        require(self.recorder, Feature.IMPORT, "import a session")
        check_session_id(info.session_id)
        first = int(info.meta.get("pruned_to", 0))
        start = first or 1
        if info.parent_id is not None or info.parent_version is not None:
            raise ValueError("an imported session stands alone: it has no parent")
        if [e.version for e in events] != list(range(start, info.version + 1)) or any(
            e.session_id != info.session_id for e in events
        ):
            raise ValueError(
                f"the events of {info.session_id!r} must be versions {start}..{info.version} of that session"
            )
        counters = fold_events(self.summaries.new_counters(info), events)
        self.recorder.import_rows(info, list(events), list(snapshots), counters)
