"""What a listing of sessions reads: each session with its newest event and lease, and its forks.

:class:`SessionListing` is a base of :class:`~saucer.store.EventStore`. Its
defaults read session by session through the store's own methods; the durable
backends override :meth:`SessionListing.session_heads` with one query, so a
page listing 10^4 sessions does not read 10^4 times.
"""

from __future__ import annotations

import warnings
from typing import Iterable

from saucer.store.model import Event, SessionHead, SessionInfo, StoreError

__all__ = ["SessionListing"]


class SessionListing:
    """``session_heads``, ``last_event`` and ``forks`` of an event store (built on its
    ``sessions``, ``read``, ``lease_of`` and ``_forks``)."""

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
        return sorted(self._forks(session_id),  # type: ignore[attr-defined]
                      key=lambda info: info.session_id)

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
