"""Deferred commits: events a Context keeps, to write with its next commit in ONE transaction.

The engine ends a round with three commits in a row (the round's end, its
evaluation, the session's end) and starts one with two (the session's start,
the round's start): each is its own event, but nothing runs between them that
another process could observe or that a crash could leave half done. A commit
made with ``defer=True`` (:meth:`~saucer.context.commit.Committer.acommit_step`)
closes its event — its operations, author, round, step, meta, summary and
time — without writing it; the next commit writes every deferred event and its
own as consecutive versions in one transaction
(:meth:`~saucer.store.EventStore.append_many`): all of them or none, one fsync.

Until then the deferred events are pending changes like any other (a crash
loses them, as it loses an uncommitted step): a rollback keeps them (they were
committed as far as the Context's user is concerned), a reload drops them. A
re-base that leaves operations out (a serialised commit meeting a concurrent
writer) moves each event's end accordingly; the ``serialised`` record goes on
the first event, the one based on the version the others wrote after.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from saucer.context.types import EventMeta
from saucer.store.model import EventDraft
from saucer.store.summary import SummaryDelta

__all__ = ["Deferred", "drafts", "after_written", "after_dropped"]


@dataclass(slots=True)
class Deferred:
    """One deferred event: the pending operations before ``end`` (after the previous one's) and what it records."""

    end: int
    author: str
    round: int | None
    step: int | None
    meta: EventMeta | None
    summary: SummaryDelta | None
    timestamp: float


def drafts(
    deferred: Sequence[Deferred],
    ops: list[Any],
    first_meta: EventMeta | None,
    last: Deferred | None,
) -> list[EventDraft]:
    """The events to append: each deferred one (the first with ``first_meta``, which may carry the
    ``serialised`` record), then ``last`` with the operations after them (left out when it has
    neither operations nor meta nor summary: a commit that only writes what was deferred)."""
    out: list[EventDraft] = []
    start = 0
    for i, d in enumerate(deferred):
        meta = first_meta if i == 0 else d.meta
        out.append(EventDraft(ops[start : d.end], d.author, d.round, d.step, meta, d.summary, d.timestamp))
        start = d.end
    if last is not None:
        rest = ops[start:]
        if rest or last.meta or last.summary is not None:
            meta = first_meta if not deferred else last.meta
            out.append(EventDraft(rest, last.author, last.round, last.step, meta, last.summary))
    return out


def after_written(deferred: list[Deferred], count: int) -> list[Deferred]:
    """The deferred events still to write once the first ``count`` pending operations are written."""
    return [
        Deferred(d.end - count, d.author, d.round, d.step, d.meta, d.summary, d.timestamp)
        for d in deferred
        if d.end > count
    ]


def after_dropped(deferred: list[Deferred], dropped: Sequence[int]) -> None:
    """Move the events' ends after a re-base left out the pending operations at the indices ``dropped``."""
    if dropped:
        for d in deferred:
            d.end -= sum(1 for i in dropped if i < d.end)
