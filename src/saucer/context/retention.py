"""Pruning a session's old history: where to cut, and the state at the cut.

:func:`prune` decides the cut (``keep_last``, ``older_than``), folds the state
there with the one fold (:func:`~saucer.context.replay.replay`), and lets the
store replace the history below the cut by a *base* event that sets that
state (:meth:`~saucer.store.EventStore.replace_history`, which also gives the
session's forks their own copy first). Every version from the cut on reads as
before; older ones raise :class:`~saucer.store.VersionPrunedError`.
"""

from __future__ import annotations

import time
from typing import Any, cast

from saucer.context.events import state_to_wire
from saucer.context.replay import replay
from saucer.context.types import SetOp
from saucer.store.base import EventStore
from saucer.store.model import SessionInfo, StoreKeyError, check_version

__all__ = ["prune", "base_ops"]


def prune(store: EventStore, session_id: str, keep_last: int | None = None, older_than: float | None = None) -> int:
    """Drop old history of a session; return its new first readable version.

    ``keep_last=N`` keeps the newest N events as they are; ``older_than=S``
    drops events committed more than S seconds ago (with both, an event is
    dropped only when both allow it). The version at the cut and every later
    one stay readable: the event at the cut is replaced by a *base* event
    that sets the whole state then (``meta["pruned"]``), with a snapshot
    beside it, so the remaining log replays on its own. Versions before the
    cut raise :class:`~saucer.store.VersionPrunedError`.

    Forks never lose a version: each fork that still reads this session's
    log first gets its own copy of the events it reads, then stands alone
    (``meta["forked_from"]`` and ``["at"]`` keep its origin). A fork itself
    is cut only above its branch point; then it stands alone too.
    """
    if keep_last is None and older_than is None:
        raise ValueError("prune needs keep_last and/or older_than")
    if keep_last is not None and check_version(keep_last, "keep_last") < 0:
        raise ValueError(f"keep_last must be >= 0, not {keep_last}")
    if older_than is not None and not older_than >= 0:
        raise ValueError(f"older_than must be >= 0 seconds, not {older_than}")
    info = store.session_info(session_id)
    cut = _cut(store, info, keep_last, older_than)
    if cut is None:
        return store.first_version(session_id)
    state = replay(store, session_id, cut).state
    if state.opaque:
        raise StoreKeyError(
            f"session {session_id!r}: cannot prune without the store key ({', '.join(sorted(state.opaque))} "
            "are encrypted at rest); set SAUCER_STORE_KEY or store.key_file"
        )
    wire = state_to_wire(state)
    # The store takes the operations as JSON objects: what each SetOp is.
    return store.replace_history(session_id, cut, cast("list[dict[str, Any]]", base_ops(wire)), wire)


def base_ops(wire: dict[str, Any]) -> list[SetOp]:
    """The operations of a base event: sets only, so that it replays on its own, from an empty state."""
    names: list[SetOp] = [{"op": "set", "name": k, "value": v} for k, v in wire["names"].items()]
    variables: list[SetOp] = [{"op": "set", "var": k, "value": v} for k, v in wire["vars"].items()]
    # A retired name's value stays in history: the fold keeps it aside again.
    retired: list[SetOp] = [{"op": "set", "name": k, "value": v} for k, v in wire.get("retired", {}).items()]
    return names + variables + retired


def _cut(store: EventStore, info: SessionInfo, keep_last: int | None, older_than: float | None) -> int | None:
    """Where a prune of ``info``'s session cuts, or None when there is nothing to drop."""
    start = store.first_version(info.session_id)
    if info.parent_id is not None and info.parent_version is not None:
        start = max(start, info.parent_version)  # a fork is cut only within its own log
    cut = info.version
    if keep_last is not None:
        cut = min(cut, info.version - keep_last)
    if older_than is not None:
        threshold = time.time() - older_than
        old = start
        for event in store.read(info.session_id, start, cut):
            if event.timestamp >= threshold:
                break
            old = event.version
        cut = min(cut, old)
    return cut if cut > start else None
