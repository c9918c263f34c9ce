"""What a listing of sessions reads: each session's summary (:meth:`SessionListing.list_sessions`),
or its row with its newest event and lease, and its forks.

:class:`SessionListing` is a base of :class:`~saucer.store.EventStore`. Its
defaults read session by session through the store's own methods; saucer's
backends keep a summary per session up to date with every commit
(:mod:`saucer.store.summary`) and override :meth:`SessionListing._list` and
:meth:`SessionListing.session_heads` with one query each, so a page listing
10^4 sessions does not read 10^4 times.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from saucer.store.model import Event, SessionHead, SessionInfo, SessionNotFoundError, StoreError
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

__all__ = ["KeepsSummaries", "SessionListing"]


class SessionListing:
    """``list_sessions``, ``session_heads``, ``last_event`` and ``forks`` of an event store
    (built on its ``sessions``, ``read``, ``lease_of`` and ``_forks``)."""

    def list_sessions(
        self,
        *,
        limit: int | None = None,
        status: str | Iterable[str] | None = None,
        task: str | None = None,
        since: float | None = None,
        sort: str = "updated",
        descending: bool | None = None,
        ids: Iterable[str] | None = None,
    ) -> list[SessionSummary]:
        """The sessions' summaries (what ``saucer sessions`` shows), from ONE query on saucer's backends.

        - ``limit``: at most this many rows (None: all);
        - ``status``: only sessions listed with this status, or one of these
          (``running``, ``interrupted``, ``finished``, ``failed``, ``error``,
          ``stopped``, ``-`` for a session the engine did not make);
        - ``task``: only sessions whose task contains this text (ASCII letters
          compared without case);
        - ``since``: only sessions updated at or after this time (epoch seconds);
        - ``sort``: one of :data:`~saucer.store.summary.SORT_KEYS`
          (``updated``, ``created``, ``id``, ``task``, ``status``, ``rounds``,
          ``steps``, ``cost``, ``version``); ``descending`` defaults to True
          except for ``id`` and ``task``; None values sort last, ties by id;
        - ``ids``: only these sessions (those that exist).

        Each :class:`~saucer.store.summary.SessionSummary` is kept up to date by
        the commits themselves (see :mod:`saucer.store.summary` for what each
        field counts); ``status`` is derived at the time of the query (a
        session not ended whose runner's lease expired is ``interrupted``).
        ValueError or TypeError name a bad argument.
        """
        return self._list(ListQuery.of(limit, status, task, since, sort, descending, ids))

    def _list(self, query: ListQuery) -> list[SessionSummary]:
        """The rows of ``query``. This default folds every session's log (slow but
        right); a backend keeping summaries answers in one query."""
        rows = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a damaged trailing record is left uncounted
            for head in self.session_heads(query.ids):
                info, lease = head.info, head.lease
                counters = self._counters_at(info, info.version)
                listed, runner = listed_status(
                    counters.status, lease.owner if lease else None, lease.expires_at if lease else None, query.now
                )
                task, mode, request, forked_from, at, _ = brief_of(info.meta)
                rows.append(
                    make_summary(
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
                )
        return select(rows, query)

    def _create_with(self, info: SessionInfo, counters: Counters) -> None:
        """Primitive of ``create_session``: ``_create(info)``; a backend that keeps summaries
        overrides it to store ``counters`` (the new session's) in the same transaction."""
        self._create(info)  # type: ignore[attr-defined]

    def _stored_counters(self, session_id: str) -> Counters | None:
        """The counters a backend keeps for the session (None: it keeps none, or no such session)."""
        return None

    def _new_counters(self, info: SessionInfo) -> Counters:
        """The counters of the new session ``info``: a fork's are its parent's at its branch point."""
        if info.parent_id is None or info.parent_version is None:
            return initial_counters(info.meta)
        parent = self._info(info.parent_id)  # type: ignore[attr-defined]
        if parent is None:
            return Counters()  # _create refuses the fork
        if parent.version == info.parent_version:
            stored = self._stored_counters(parent.session_id)
            if stored is not None:
                return fork_counters(stored, info.meta)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fork_counters(self._counters_at(parent, info.parent_version), info.meta)

    def _counters_at(self, info: SessionInfo, upto: int) -> Counters:
        """The summary counters of ``info``'s session at version ``upto``, folded from its lineage
        (a fork starts from its parent's at its branch point)."""
        after = 0
        if info.parent_id is not None and info.parent_version is not None:
            parent = self._info(info.parent_id)  # type: ignore[attr-defined]
            base = (
                Counters()
                if parent is None
                else fork_counters(self._counters_at(parent, min(upto, info.parent_version)), info.meta)
            )
            after = info.parent_version
        else:
            base = initial_counters(info.meta)
        if upto <= after:
            return base
        return fold_events(base, self._read(info.session_id, after, upto))  # type: ignore[attr-defined]

    def session_heads(self, session_ids: Iterable[str] | None = None) -> list[SessionHead]:
        """Sessions with their newest event and their lease, in the order of :meth:`sessions`:
        every session, or those of ``session_ids`` that exist.

        The durable backends answer in one query whatever the number of
        sessions (a listing page must not read once per session); this default
        reads each session. A damaged newest record gives ``last=None``.
        """
        infos = self.sessions()  # type: ignore[attr-defined]
        if session_ids is not None:
            wanted = set(session_ids)
            infos = [info for info in infos if info.session_id in wanted]
        return [SessionHead(info, self.last_event(info), self.lease_of(info.session_id)) for info in infos]  # type: ignore[attr-defined]

    def forks(self, session_id: str) -> list[SessionInfo]:
        """The sessions forked from this one that still read its log (a fork that stands alone
        after a prune keeps its origin in ``meta["forked_from"]`` instead)."""
        return sorted(
            self._forks(session_id),  # type: ignore[attr-defined]
            key=lambda info: info.session_id,
        )

    def session_info_without_plan(self, session_id: str) -> tuple[SessionInfo, bool]:
        """The session's row with its meta's ``plan`` left out, and whether the meta has one.

        What a resume reads first: a stored plan of 10^4 steps is megabytes of JSON,
        read (:meth:`session_plan`) only when a step of it runs. SQLite leaves it
        unparsed. :class:`SessionNotFoundError` if unknown.
        """
        found = self._info_without_plan(session_id)
        if found is None:
            raise SessionNotFoundError(session_id)
        return found

    def session_plan(self, session_id: str) -> Any:
        """The ``plan`` of the session's meta (None if it has none); :class:`SessionNotFoundError` if unknown."""
        return self.session_info(session_id).meta.get("plan")  # type: ignore[attr-defined]

    def _info_without_plan(self, session_id: str) -> tuple[SessionInfo, bool] | None:
        info = self._info(session_id)  # type: ignore[attr-defined]
        if info is None or "plan" not in info.meta:
            return None if info is None else (info, False)
        return replace(info, meta={k: v for k, v in info.meta.items() if k != "plan"}), True

    def last_event(self, info: SessionInfo) -> Event | None:
        """The event at ``info.version`` (of its lineage), or None: no events, a damaged
        newest record, or the session deleted meanwhile."""
        if not info.version:
            return None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a damaged trailing record: the listing shows no last event
                return next(iter(self.read(info.session_id, info.version - 1, info.version)), None)  # type: ignore[attr-defined]
        except StoreError:
            return None


class KeepsSummaries:
    """Mixed into a backend that keeps each session's summary (it overrides
    ``_create_with``, ``_stored_counters`` and ``_list``): its ``_create`` stores the
    new session's counters too."""

    def _create(self, info: SessionInfo) -> None:
        self._create_with(info, self._new_counters(info))  # type: ignore[attr-defined]
