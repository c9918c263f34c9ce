"""Re-basing a Context's pending changes onto what concurrent writers committed.

A conflict whose batch holds only atomic operations (``incr``, ``append``,
compare-and-set) is re-based onto the newest version (:meth:`Rebaser.rebase`):
every update is kept, and a compare-and-set that no longer holds makes it a
:class:`~saucer.store.ConflictError`. A Context opened with ``serialise=True``
(the engine's, whose steps already ran their commands) re-bases its whole batch
(:meth:`Rebaser.rebase_all`), ordered after the concurrent writers in the log
(AG2's loose rule: anyone in the session may write at any time); its event's
``meta["serialised"]`` says which version it was based on, which concurrent
versions it was ordered after and the keys they changed (see :func:`serialised_meta`).
Plain sets and deletes are applied after theirs (the later write wins), atomic
operations keep every update, and a compare-and-set that no longer holds is left
out and named under ``"dropped"``.
"""

from __future__ import annotations

import random

from saucer.context.events import ATOMIC_OPS, apply_ops, op_key
from saucer.context.names import lookup
from saucer.context.staging import after_dropped
from saucer.context.types import SERIALISED, CasOp, EventMeta, Op, Reloader, SerialisedRecord, Target
from saucer.context.working import WorkingCopy
from saucer.store.model import ConflictError, StoreError

__all__ = ["Rebaser", "serialised_meta", "MAX_REBASES"]

#: How many times a commit re-bases an atomic-only batch before giving up.
MAX_REBASES = 200


def serialised_meta(
    meta: EventMeta | None, based_on: int, head: int, changed: list[str], dropped: list[str]
) -> EventMeta:
    """``meta`` with what a serialised commit records under ``"serialised"`` (a :class:`SerialisedRecord`):
    ``based_on`` (the version its changes were made on), ``ordered_after`` (the concurrent versions
    written since, which it follows in the log), ``changed`` (the keys they changed)
    and, if any, ``dropped`` (its compare-and-sets that no longer held, and
    operations that no longer applied)."""
    record: SerialisedRecord = {
        "based_on": based_on,
        "ordered_after": list(range(based_on + 1, head + 1)),
        "changed": changed,
    }
    if dropped:
        record["dropped"] = list(dropped)
    return {**(meta or {}), SERIALISED: record}


class Rebaser:
    """Puts a Context's pending operations on top of the newest committed version."""

    def __init__(self, work: WorkingCopy, reload: Reloader) -> None:
        self._work = work
        self._reload = reload

    def keys_since(self, version: int, upto: int | None = None) -> list[str]:
        """The keys the events after ``version`` (up to ``upto``) changed, in log order (each once)."""
        store, sid = self._work.require_store()
        keys: dict[str, None] = {}
        for event in store.read(sid, version, upto):
            keys.update(dict.fromkeys(event.keys()))
        return list(keys)

    def before_retry(self, exc: ConflictError, ops: list[Op], attempt: int, serialise: bool) -> float:
        """After a conflict: raise unless the batch can be re-based; return how long to back off.

        The error raised names the keys the other writers changed since this
        Context's version (what a reload would bring in), not its own.
        """
        if not serialise and any(op["op"] not in ATOMIC_OPS and op["op"] != "cas" for op in ops):
            try:
                theirs = self.keys_since(self._work.version)
            except StoreError:
                theirs = []
            raise ConflictError(exc.session_id, self._work.version, exc.actual, theirs) from None
        # Several writers hammer the same session: back off a little, at
        # random, so that one of them gets through.
        return random.uniform(0, 0.0005 * min(attempt, 20)) if attempt >= 2 else 0.0

    def rebase_all(self, ops: list[Op]) -> list[str]:
        """Re-load at the newest version and re-apply every operation of ``ops`` on top, in order
        (a serialised commit); return the keys of those left out.

        A set or delete is applied after the concurrent writers' (the later
        write wins); an atomic operation keeps their updates; a compare-and-set
        that no longer holds, or an operation that no longer applies (another
        writer changed the value's type), is left out.
        """
        work = self._work
        mark, pending_base, caught, deferred = work.step_mark, work.pending_base, work.caught_dropped, work.deferred
        self._reload()
        work.pending_base, work.caught_dropped = pending_base, caught
        kept: list[Op] = []
        dropped: list[str] = []
        left_out: list[int] = []
        for i, op in enumerate(ops):
            if op["op"] == "cas" and not self.cas_holds(op):
                dropped.append(op_key(op))
                left_out.append(i)
                mark -= i < mark
                continue
            try:
                apply_ops(work.state, [op])
            except Exception:
                # What failed may have half-changed the value: build the state again without it.
                self._reload()
                apply_ops(work.state, kept)
                dropped.append(op_key(op))
                left_out.append(i)
                mark -= i < mark
                continue
            kept.append(op)
        after_dropped(deferred, left_out)
        work.pending, work.deferred = kept, deferred
        work.step_mark = max(0, mark)
        if not kept:
            work.pending_base = None
        return dropped

    def cas_holds(self, op: CasOp) -> bool:
        """Whether a compare-and-set's expected value is still the current one."""
        target: Target = {}
        if "name" in op:
            target["name"] = op["name"]
        if "var" in op:
            target["var"] = op["var"]
        if "path" in op:
            target["path"] = op["path"]
        name = op.get("name")
        depth = 0 if name is None or "path" in op else lookup(name).int_key_depth
        holds: bool = self._work.current_wire(target, op_key(op), depth) == op["expected"]
        return holds

    def rebase(self, ops: list[Op]) -> None:
        """Re-load at the newest version and re-apply ``ops`` (atomic/cas only) on top.

        Each compare-and-set is checked again, in order, against the state the
        operations before it produce; if one no longer holds, or an operation no
        longer applies (another writer changed the value's type), the batch is
        dropped and :class:`ConflictError` names the key.
        """
        work = self._work
        base, deferred = work.version, work.deferred
        self._reload()
        sid = work.session_id or ""
        for op in ops:
            key = op_key(op)
            if op["op"] == "cas" and not self.cas_holds(op):
                self._reload()
                raise ConflictError(sid, base, work.version, [key])
            try:
                apply_ops(work.state, [op])
            except Exception:
                self._reload()
                raise ConflictError(sid, base, work.version, [key]) from None
        work.pending, work.deferred = ops, deferred
