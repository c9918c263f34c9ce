"""Questions about a session's past, answered from its log: history, state at a
version, diff between versions, fork, and watching for new events.

Each one reads the store (the whole lineage of a fork); none changes this
Context. A version that was pruned raises
:class:`~saucer.store.VersionPrunedError`, never an empty or partial answer.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Self

from saucer.context.events import Event, op_key
from saucer.context.names import DERIVED_LEDGERS, ContextNames, typed_name
from saucer.context.snapshots import Snapshots
from saucer.store.model import check_version

__all__ = ["HistoryQueries"]


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

        Context variables appear as ``vars.NAME``; a missing value is None.
        Both versions must be readable (see :meth:`state_at`).
        """
        a = self.state_at(v1)._plain()
        b = self.state_at(v2)._plain()
        return {
            k: {"before": a.get(k), "after": b.get(k)}
            for k in sorted(a.keys() | b.keys())
            if a.get(k) != b.get(k)
        }

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
            store, new_session_id, author=author or self._author, durability=self._durability,
            snapshot_every=self._snapshot_every, keep_snapshots=self._keep_snapshots,
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
