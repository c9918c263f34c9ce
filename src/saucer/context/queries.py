"""Questions about a session's past, answered from its log: history, state at a
version, diff between versions, fork, and watching for new events.

Each one reads the store (the whole lineage of a fork); none changes this
Context. A version that was pruned raises
:class:`~saucer.store.VersionPrunedError`, never an empty or partial answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from enum import Enum

from saucer.context.events import Event, State, apply_ops, op_key, state_from_wire, state_to_wire
from saucer.context.names import DERIVED_LEDGERS, ContextNames, typed_name
from saucer.context.replay import replay
from saucer.context.types import Change, Json
from saucer.context.working import WorkingCopy, flat_wire
from saucer.store.base import EventStore
from saucer.store.model import check_version

__all__ = ["HistoryQueries", "change_of", "changes", "diff_of", "history_key"]


class HistoryQueries:
    """``history``, ``change_at`` and ``watch`` of the session a working copy is bound to."""

    def __init__(self, work: WorkingCopy) -> None:
        self._work = work

    def history(self, key: ContextNames | str | None = None) -> list[Event]:
        """Committed events (of the whole lineage), or those touching ``key`` (see ``Context.history``)."""
        store, sid = self._work.require_store()
        events = store.read(sid, 0, self._work.version)
        if key is None:
            return list(events)
        wanted = history_key(key)
        return [e for e in events if any(op_key(op) == wanted for op in e.ops)]

    def change_at(self, version: int) -> dict[str, Change]:
        """What the event at ``version`` changed: the diff of ``version - 1`` and ``version``,
        from one hydrate (the state before, and that event's operations put through the one fold)."""
        store, sid = self._work.require_store()
        return change_of(store, sid, check_version(version))[0]

    async def watch(self, *, interval: float = 0.2) -> AsyncIterator[Event]:
        """Yield events committed to this session after this Context's version (by anyone)."""
        store, sid = self._work.require_store()
        async for event in store.watch(sid, self._work.version, interval=interval):
            yield event


def history_key(key: ContextNames | str) -> str:
    """The key events use for ``key``: a name (a derived name's ledger) or ``vars.NAME``."""
    if isinstance(key, str) and key.startswith("vars."):
        return key
    member = typed_name(key)  # the one rule of what a key addresses
    if member is None:
        return f"vars.{key}"
    return DERIVED_LEDGERS.get(member.value, member.value)


def _flat(state: State) -> dict[str, Json]:
    return flat_wire(state_to_wire(state))


def change_of(
    store: EventStore, session_id: str, version: int, before: State | None = None
) -> tuple[dict[str, Change], State]:
    """What the event at ``version`` changed (``{key: {"before", "after"}}`` as ``Context.diff``),
    and the state after it: pass that as ``before`` for ``version + 1`` and the next change costs
    one event, not a hydrate (a viewer stepping through a session). ``before`` must be the state
    at ``version - 1``; without it the session is hydrated there (snapshot + tail)."""
    if before is None:
        before = replay(store, session_id, version - 1).state
    event = next(iter(store.read(session_id, version - 1, version)), None)
    a = _flat(before)
    after = state_from_wire(state_to_wire(before, whole=True))  # a copy: ``before`` stays as it was
    if event is not None:
        apply_ops(after, event.ops)
    return changes(a, _flat(after)), after


def diff_of(store: EventStore, session_id: str, v1: int, v2: int) -> dict[str, Change]:
    """``Context.diff`` of ``v1 <= v2`` from one hydrate: the state at ``v1``, then the events up
    to ``v2`` put through the one fold (two hydrates cost twice as much far from a snapshot)."""
    if v2 < v1:
        swapped = diff_of(store, session_id, v2, v1)
        return {k: {"before": c["after"], "after": c["before"]} for k, c in swapped.items()}
    before = replay(store, session_id, v1).state
    a = _flat(before)
    after = state_from_wire(state_to_wire(before, whole=True))
    for event in store.read(session_id, v1, v2):
        apply_ops(after, event.ops)
    store.check_readable(session_id, v2)
    return changes(a, _flat(after))


def changes(a: dict[str, Json], b: dict[str, Json]) -> dict[str, Change]:
    """The one rule of a diff between two flat states: the keys whose values differ, each with its
    value before and after, a name not written yet shown with its default (as ``state`` shows it)."""
    return {
        k: {"before": _or_default(a, k), "after": _or_default(b, k)}
        for k in sorted(a.keys() | b.keys())
        if a.get(k) != b.get(k)
    }


def _or_default(plain: dict[str, Json], key: str) -> Json:
    """``plain[key]``, else the JSON form of the default of the name ``key`` (None for a variable)."""
    if key in plain:
        return plain[key]
    try:
        default = ContextNames[key].default_value
    except KeyError:
        return None
    return default.value if isinstance(default, Enum) else default
