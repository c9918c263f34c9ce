"""Counting the summaries of sessions that were stored before stores kept them
(a schema upgrade): the same :func:`~saucer.store.summary.fold`, over each
session's lineage as its rows are read back."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from saucer.store._codec import decode_rows
from saucer.store.model import CorruptRecordError, Event
from saucer.store.summary import Counters, fold_events, initial_counters

__all__ = ["count_sessions"]

#: ``(session_id, after, upto) -> own rows (version, ts, author, round, step, payload, crc)`` in version order.
RowReader = Callable[[str, int, int], Sequence[tuple[Any, ...]]]


def count_sessions(
    sessions: Mapping[str, tuple[int, str | None, int | None, Mapping[str, Any]]], own_rows: RowReader
) -> dict[str, Counters]:
    """The counters of every session of ``sessions`` (``id -> (head, parent_id, parent_version, meta)``).

    A fork starts from its parent's counters at its branch point. Damaged
    records are left uncounted (those after a damaged one too): a summary is
    a listing's, and must not stop an upgrade.
    """
    at_head: dict[str, Counters] = {}

    def at(sid: str, upto: int, depth: int = 0) -> Counters:
        head, parent, parent_version, meta = sessions[sid]
        if upto >= head and sid in at_head:
            return at_head[sid]
        after = 0
        if parent is not None and parent_version is not None:
            base = (
                at(parent, min(upto, parent_version), depth + 1) if parent in sessions and depth < 1000 else Counters()
            )
            after = parent_version
        else:
            base = initial_counters(meta)
        counters = base if upto <= after else fold_events(base, _readable(sid, own_rows(sid, after, upto), head))
        if upto >= head:
            at_head[sid] = counters
        return counters

    return {sid: at(sid, sessions[sid][0]) for sid in sessions}


def _readable(sid: str, rows: Sequence[tuple[Any, ...]], head: int) -> Iterator[Event]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a damaged trailing record
        try:
            yield from decode_rows(sid, rows, head=head)
        except CorruptRecordError:
            return
