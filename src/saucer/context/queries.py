"""Questions about a session's past, answered from its log: history, state at a
version, diff between versions, fork, and watching for new events.

Each one reads the store (the whole lineage of a fork); none changes this
Context. A version that was pruned raises
:class:`~saucer.store.VersionPrunedError`, never an empty or partial answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Self

from saucer.context.events import Event, State, apply_ops, op_key, state_from_wire, state_to_wire
from saucer.context.names import DERIVED_LEDGERS, ContextNames, typed_name
from saucer.context.replay import replay
from saucer.context.snapshots import Snapshots
from saucer.store.model import check_version

if TYPE_CHECKING:
    from saucer.store import EventStore

__all__ = ["HistoryQueries", "change_of", "diff_of"]


class HistoryQueries(Snapshots):
    """``history``, ``state_at``, ``diff``, ``fork`` and ``watch``."""

    def history(self, key: ContextNames | str | None = None) -> list[Event]:
        """Committed events (of the whole lineage), or those touching ``key``.

        ``key`` is a :class:`ContextNames` member or name, ``vars.NAME`` or a
        context variable's name. Each event names its author, round and step.
        A pruned session's history starts at its first readable version, with
        the *base* event that sets the whole state then (author ``system``,
        ``meta["pruned"]``).
        """
        store, sid = self._require_store()
        events = store.read(sid, 0, self._version)
        if key is None:
            return list(events)
        wanted = self.history_key(key)
        return [e for e in events if any(op_key(op) == wanted for op in e.ops)]

    @staticmethod
    def history_key(key: ContextNames | str) -> str:
        """The key events use for ``key``: a name (a derived name's ledger) or ``vars.NAME``."""
        if isinstance(key, str) and key.startswith("vars."):
            return key
        member = typed_name(key)  # the one rule of what a key addresses
        if member is None:
            return f"vars.{key}"
        return DERIVED_LEDGERS.get(member.value, member.value)

    def state_at(self, version: int) -> Self:
        """A read-only Context of this session as it was at ``version`` (an int).

        :class:`~saucer.store.VersionPrunedError` when that version was pruned
        (it names the first readable one), never an empty or partial state.
        """
        store, sid = self._require_store()
        return self.open(store, sid, at=version)

    def diff(self, v1: int, v2: int) -> dict[str, dict[str, Any]]:
        """Keys whose values differ between two versions: ``{key: {"before": a, "after": b}}``.

        Context variables appear as ``vars.NAME``; a missing variable is None, and
        a name not written yet has its default, as ``state`` shows it at that version.
        Both versions must be readable (see :meth:`state_at`).
        """
        return _changes(self.state_at(v1)._plain(), self.state_at(v2)._plain())

    def change_at(self, version: int) -> dict[str, dict[str, Any]]:
        """What the event at ``version`` changed: :meth:`diff` of ``version - 1`` and ``version``,
        from one hydrate (the state before, and that event's operations put through the one fold)."""
        store, sid = self._require_store()
        return change_of(store, sid, check_version(version))[0]

    def fork(self, new_session_id: str, at: int | None = None, *, author: str | None = None) -> Self:
        """A writable Context for a new session starting from this one's state at ``at``.

        The new session references this session's log up to ``at``; nothing is
        copied (until this session is pruned: then the fork gets its own copy
        first). A version that was pruned cannot be forked
        (:class:`~saucer.store.VersionPrunedError`).
        """
        store, sid = self._require_store()
        at = self._version if at is None else check_version(at, "at")
        store.create_session(new_session_id, parent_id=sid, parent_version=at, meta={"forked_from": sid, "at": at})
        child = self.open(
            store,
            new_session_id,
            author=author or self._author,
            durability=self._durability,
            snapshot_every=self._snapshot_every,
            keep_snapshots=self._keep_snapshots,
        )
        if self._handle is not None:
            # The store was opened from a URL for this Context: the child shares
            # it, and it is closed when the last of them closes.
            child._handle = self._handle.retain()
        if at > 0 and child._snapshot_version < at:
            # The child's own snapshot of the fork point (state, not log): its
            # opens stay bounded even after the parent's snapshots are pruned.
            child._auto_snapshot()
        return child

    async def watch(self, *, interval: float = 0.2) -> AsyncIterator[Event]:
        """Yield events committed to this session after this Context's version (by anyone)."""
        store, sid = self._require_store()
        async for event in store.watch(sid, self._version, interval=interval):
            yield event


def _flat(state: State) -> dict[str, Any]:
    wire = state_to_wire(state)
    out = dict(wire["names"])
    out.update({f"vars.{k}": v for k, v in wire["vars"].items()})
    out.update({f"retired.{k}": v for k, v in wire.get("retired", {}).items()})
    return out


def change_of(
    store: EventStore, session_id: str, version: int, before: State | None = None
) -> tuple[dict[str, dict[str, Any]], State]:
    """What the event at ``version`` changed (``{key: {"before", "after"}}`` as :meth:`Queries.diff`),
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
    return _changes(a, _flat(after)), after


def diff_of(store: EventStore, session_id: str, v1: int, v2: int) -> dict[str, dict[str, Any]]:
    """:meth:`Queries.diff` of ``v1 <= v2`` from one hydrate: the state at ``v1``, then the events up
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
    return _changes(a, _flat(after))


def _changes(a: dict[str, Any], b: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The one rule of a diff between two flat states: the keys whose values differ, each with its
    value before and after, a name not written yet shown with its default (as ``state`` shows it)."""
    return {
        k: {"before": _or_default(a, k), "after": _or_default(b, k)}
        for k in sorted(a.keys() | b.keys())
        if a.get(k) != b.get(k)
    }


def _or_default(plain: dict[str, Any], key: str) -> Any:
    """``plain[key]``, else the JSON form of the default of the name ``key`` (None for a variable)."""
    if key in plain:
        return plain[key]
    try:
        default = ContextNames[key].default_value
    except KeyError:
        return None
    return getattr(default, "value", default) if key == "WEAVING_MODE" else default
