"""The per-session summaries a store keeps, and listing sessions from them.

:class:`SummaryKeeper` is a collaborator of :class:`~saucer.store.EventStore`,
built on a :class:`~saucer.store.recorder.Recorder` and the session's
:class:`~saucer.store.lineage.Lineage`. saucer's backends keep each session's
counters (:mod:`saucer.store.summary`) beside its head, folded by every
commit from the :class:`~saucer.store.summary.SummaryDelta` its writer gave,
and answer :meth:`~saucer.store.recorder.Recorder.list_rows` and
:meth:`~saucer.store.recorder.Recorder.heads` with one query each, so a page
listing 10^4 sessions does not read 10^4 times. A backend that keeps none is
listed by folding each session's log here (slow but right).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

from saucer.store.lineage import Lineage
from saucer.store.model import SessionHead, SessionInfo
from saucer.store.recorder import Recorder
from saucer.store.summary import (
    Counters,
    ListQuery,
    SessionSummary,
    brief_of,
    fold_events,
    fork_counters,
    initial_counters,
    listed_status,
    make_summary,
    select,
)

__all__ = ["SummaryKeeper", "summary_row"]


class SummaryKeeper:
    """The counters of new sessions, and listings (one query on backends that keep summaries)."""

    def __init__(self, recorder: Recorder, lineage: Lineage) -> None:
        self.recorder = recorder
        self.lineage = lineage

    def listing(self, query: ListQuery) -> list[SessionSummary]:
        """The rows of ``query``: the backend's kept summaries, else folded from every log."""
        kept = self.recorder.list_rows(query)
        return self._rows(query, kept=True) if kept is None else kept

    def folded(self, query: ListQuery) -> list[SessionSummary]:
        """The rows of ``query`` folded from every session's log, whatever the backend keeps: what
        its kept summaries must equal (the contract suite compares them)."""
        return self._rows(query, kept=False)

    def _rows(self, query: ListQuery, *, kept: bool) -> list[SessionSummary]:
        rows = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a damaged trailing record is left uncounted
            for info in self._infos(query.ids):
                counters = self.recorder.kept_counters(info.session_id) if kept else None
                if counters is None:
                    counters = self.counters_at(info, info.version)
                head = SessionHead(info, None, self.recorder.lease_of(info.session_id))
                rows.append(summary_row(head, counters, query.now))
        return select(rows, query)

    def heads(self, session_ids: Iterable[str] | None) -> list[SessionHead]:
        """Sessions with their newest event and lease (one query where the backend can)."""
        found = self.recorder.heads(session_ids)
        if found is not None:
            return found
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a damaged newest record: the listing shows no last event
            return [
                SessionHead(info, self.lineage.last_event(info), self.recorder.lease_of(info.session_id))
                for info in self._infos(session_ids)
            ]

    def _infos(self, session_ids: Iterable[str] | None) -> list[SessionInfo]:
        infos = self.recorder.sessions()
        if session_ids is None:
            return infos
        wanted = set(session_ids)
        return [info for info in infos if info.session_id in wanted]

    def new_counters(self, info: SessionInfo) -> Counters:
        """The counters of the new session ``info``: a fork's are its parent's at its branch point."""
        if info.parent_id is None or info.parent_version is None:
            return initial_counters(info.meta)
        parent = self.recorder.row(info.parent_id)
        if parent is None:
            return Counters()  # create_row refuses the fork
        if parent.version == info.parent_version:
            stored = self.recorder.kept_counters(parent.session_id)
            if stored is not None:
                return fork_counters(stored, info.meta)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fork_counters(self.counters_at(parent, info.parent_version), info.meta)

    def counters_at(self, info: SessionInfo, upto: int) -> Counters:
        """The counters of ``info``'s session at version ``upto``, folded from its lineage
        (a fork starts from its parent's at its branch point)."""
        after = 0
        if info.parent_id is not None and info.parent_version is not None:
            parent = self.recorder.row(info.parent_id)
            base = (
                Counters()
                if parent is None
                else fork_counters(self.counters_at(parent, min(upto, info.parent_version)), info.meta)
            )
            after = info.parent_version
        else:
            base = initial_counters(info.meta)
        if upto <= after:
            return base
        return fold_events(base, self.recorder.read_own(info.session_id, after, upto))


def summary_row(head: SessionHead, counters: Counters, now: float) -> SessionSummary:
    """The listed row of a session from its row, lease (its last event is not read) and counters
    (the status derived at ``now``)."""
    info, lease = head.info, head.lease
    listed, runner = listed_status(
        counters.status, lease.owner if lease else None, lease.expires_at if lease else None, now
    )
    task, mode, request, forked_from, at, _ = brief_of(info.meta)
    return make_summary(
        (
            info.session_id,
            info.version,
            info.created_at,
            info.updated_at,
            info.parent_id,
            info.parent_version,
            listed,
            counters.rounds,
            counters.steps,
            None if counters.cost_unknown else counters.cost,
            counters.reason,
            task,
            mode,
            request,
            forked_from,
            at,
            runner,
        )
    )
