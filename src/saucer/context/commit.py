"""Committing a Context's pending changes: one event per commit, retried on conflict.

:meth:`Durable.commit` (threads) and :meth:`Durable.acommit` (coroutines)
write the pending operations as ONE event based on the version the Context
has seen. Both run the same retry core, :meth:`Durable._attempts`, which
decides everything: a conflict whose batch holds only atomic operations
(``incr``, ``append``, compare-and-set) is re-based onto the newest version
and tried again, with a random back-off once writers keep colliding; any
other conflict raises :class:`~saucer.store.ConflictError` naming the keys the
*other* writers changed, and any other store error is raised; either way the
changes are kept pending. The two differ only in how they append and how they wait.

After a commit whose outcome is unknown (the connection broke in flight), the
next commit first checks whether the store has its event, and adopts it
rather than writing it twice.

A Context opened with ``serialise=True`` (the engine's, whose steps already
ran their commands) never fails on a conflict: its whole batch is re-based
onto the newest version, ordered after the concurrent writers in the log
(AG2's loose rule: anyone in the session may write at any time), and its
event's ``meta["serialised"]`` says which version it was based on, which
concurrent versions it was ordered after and the keys they changed (see
:func:`serialised_meta`). Plain sets and deletes are applied after theirs
(the later write wins), atomic operations keep every update, and a
compare-and-set that no longer holds is left out and named under ``"dropped"``.

A session that declares participants (:attr:`saucer.store.SessionInfo.participants`,
and those added since, :data:`~saucer.context.core.PARTICIPANTS_VAR`) refuses a
commit by any other author with :class:`~saucer.store.NotParticipantError`
before anything is sent. The check is made against the committed state the
commit is based on, so the store's version check makes it hold under races on
every backend: a commit based on a version that a later change of the
participants follows is a conflict, and is checked again once re-based. A
commit carrying the session's lease token (its runner: the engine's own
agents) is always allowed; a session that declares none is open to every writer.
"""

from __future__ import annotations

import random
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Self

import orjson

from saucer.context.core import PARTICIPANTS_VAR, check_text
from saucer.context.events import ATOMIC_OPS, Event, State, ValueNotStorableError, apply_ops, copy_json, op_key, to_wire
from saucer.context.names import lookup
from saucer.context.snapshots import Snapshots
from saucer.store.base import EventStore, SummaryDelta
from saucer.store.model import (
    ConflictError,
    FencedError,
    NotParticipantError,
    OutcomeUnknownError,
    SessionExistsError,
    StoreError,
    check_version,
)

__all__ = ["Durable", "serialised_meta"]

#: How many times a commit re-bases an atomic-only batch before giving up.
_MAX_REBASES = 200


# Not frozen: a frozen dataclass costs about 0.1 µs more per field to make, on every commit.
@dataclass(slots=True)
class _Append:
    """Retry core -> driver: append ``ops`` as one event based on ``version``, with ``meta``."""

    ops: list[dict[str, Any]]
    version: int
    meta: dict[str, Any] | None


@dataclass(slots=True)
class _Wait:
    """Retry core -> driver: back off for ``seconds`` before the next attempt."""

    seconds: float


@dataclass(slots=True)
class _Commit:
    """What one commit writes besides its operations, and where."""

    store: EventStore
    session_id: str
    author: str
    round: int | None
    step: int | None
    meta: dict[str, Any] | None
    summary: SummaryDelta | None = None


def serialised_meta(
    meta: dict[str, Any] | None, based_on: int, head: int, changed: list[str], dropped: list[str]
) -> dict[str, Any]:
    """``meta`` with what a serialised commit records under ``"serialised"``: ``based_on``
    (the version its changes were made on), ``ordered_after`` (the concurrent versions
    written since, which it follows in the log), ``changed`` (the keys they changed)
    and, if any, ``dropped`` (its compare-and-sets that no longer held, and
    operations that no longer applied)."""
    record: dict[str, Any] = {
        "based_on": based_on,
        "ordered_after": list(range(based_on + 1, head + 1)),
        "changed": changed,
    }
    if dropped:
        record["dropped"] = list(dropped)
    return {**(meta or {}), "serialised": record}


def _check_commit_args(author: str, round: Any, step: Any, meta: dict[str, Any] | None) -> None:
    """Refuse, before anything is sent, what a store could not write for a commit."""
    check_text(author, "author")
    for what, value in (("round", round), ("step", step)):
        if value is not None:
            check_version(value, what)
            to_wire(value, what)  # a 64-bit integer
    if meta:
        try:
            orjson.dumps(meta)  # how the stores encode it
        except orjson.JSONEncodeError as exc:
            raise ValueNotStorableError("meta", "", str(exc)) from None


def _keep_pending(exc: StoreError, count: int) -> None:
    """Say, in the store's error, what happened to the pending changes (they are kept)."""
    if isinstance(exc, OutcomeUnknownError):
        note = (
            f"this Context keeps its {count} changes pending, and its next commit() writes them only if they were not"
        )
    else:
        note = f"this Context keeps its {count} changes pending: commit() again, or rollback() to drop them"
    exc.args = (f"{exc}; {note}",) + exc.args[1:]


class Durable(Snapshots):
    """Commits, steps and rollback: how pending changes become durable events."""

    # ============================================================== commits

    def commit(
        self,
        *,
        author: str | None = None,
        round: int | None = None,
        step: int | None = None,
        meta: dict[str, Any] | None = None,
        summary: SummaryDelta | None = None,
    ) -> int:
        """Write the pending changes as ONE event; return the new version.

        ``summary`` says what the event changes in the session's kept summary
        (:class:`~saucer.store.summary.SummaryDelta`, given by the engine; None: nothing but the step).

        If another writer committed first, a batch of only atomic operations is
        re-based onto the newest version and retried; any other batch raises
        :class:`~saucer.store.ConflictError` naming the keys the other writers
        changed (call :meth:`reload`), unless this Context serialises its commits
        (``Context.open(..., serialise=True)``): then the whole batch is ordered
        after theirs and ``meta["serialised"]`` records it (see :func:`serialised_meta`).
        Any other store failure leaves the changes pending (the error says so):
        the Context stays usable, and its next commit tries again; after a
        commit whose outcome is unknown it first checks whether they were written.
        """
        with self._lock:
            job = self._begin(author, round, step, meta, summary)
            if job is None:
                return self._version
            attempts = self._attempts(job)
            try:
                action = next(attempts)
                while True:
                    if isinstance(action, _Wait):
                        time.sleep(action.seconds)
                        action = next(attempts)
                        continue
                    try:
                        event = job.store.append(
                            job.session_id,
                            action.version,
                            action.ops,
                            author=job.author,
                            round=job.round,
                            step=job.step,
                            meta=action.meta,
                            fence=self._fence,
                            summary=job.summary,
                        )
                    except StoreError as exc:
                        action = attempts.throw(exc)
                    else:
                        self._written(event)
                        action = next(attempts)
            except StopIteration:
                pass
            self._maybe_snapshot()
            return self._version

    async def acommit(
        self,
        *,
        author: str | None = None,
        round: int | None = None,
        step: int | None = None,
        meta: dict[str, Any] | None = None,
        summary: SummaryDelta | None = None,
    ) -> int:
        """:meth:`commit` for coroutines: the same event, durable when it returns.

        The commits of the sessions of one event loop that are made at the same
        time share one transaction and fsync (see ``saucer.store``), without a
        thread per session; the engine commits its steps this way. The Context
        refuses changes while the commit is in flight. If the awaiting task is
        cancelled, the changes are either still pending (nothing was written)
        or committed, as the Context's version then says.
        """
        with self._lock:
            job = self._begin(author, round, step, meta, summary)
            if job is None:
                return self._version
            self._committing = True
        try:
            attempts = self._attempts(job)
            try:
                action = next(attempts)
                while True:
                    if isinstance(action, _Wait):
                        import asyncio  # only a coroutine waits; a reading command never loads asyncio

                        await asyncio.sleep(action.seconds)
                        action = next(attempts)
                        continue
                    try:
                        # The store calls _written as soon as the event is durable,
                        # even if this task is cancelled while it waits.
                        await job.store.aappend(
                            job.session_id,
                            action.version,
                            action.ops,
                            author=job.author,
                            round=job.round,
                            step=job.step,
                            meta=action.meta,
                            fence=self._fence,
                            on_written=self._written,
                            summary=job.summary,
                        )
                    except StoreError as exc:
                        action = attempts.throw(exc)
                    else:
                        action = next(attempts)
            except StopIteration:
                pass
        finally:
            self._committing = False
        if self._snapshot_due():
            import asyncio

            await asyncio.to_thread(self._snapshot_locked)  # it writes the whole state: never on the loop
        return self._version

    def _snapshot_locked(self) -> None:
        with self._lock:
            self._maybe_snapshot()

    def _begin(
        self,
        author: str | None,
        round: int | None,
        step: int | None,
        meta: dict[str, Any] | None,
        summary: SummaryDelta | None = None,
    ) -> _Commit | None:
        """Under the lock: what a commit writes, or None when there is nothing to write."""
        if self._store is None:
            return None
        self._check_writable()
        if not (self._pending or meta or summary is not None):
            return None
        store, sid = self._require_store()
        author = author or self._author
        round = self._round_id() if round is None else round
        _check_commit_args(author, round, step, meta)
        if not self._settle_unknown(meta):
            return None
        if self._creation is not None and self._creation.get("dropped"):
            try:  # this Context's first commit was refused and its empty session removed: make it again
                store.create_session(sid, meta=self._creation["meta"], participants=self._creation["participants"])
            except SessionExistsError:
                pass
            self._creation["dropped"] = False
        return _Commit(store, sid, author, round, step, meta, summary)

    def _attempts(self, job: _Commit) -> Generator[_Append | _Wait, None, None]:
        """The retry core of :meth:`commit` and :meth:`acommit`: what to do next.

        Each :class:`_Append` asks the caller to append the pending operations
        (with the meta it carries); the caller resumes the core with ``next()``
        once the event is written (and reported to :meth:`_written`), or throws
        the store's error into it. Each :class:`_Wait` asks it to back off
        first. The core returns when the changes are written and raises what
        cannot be retried.
        """
        try:
            yield from self._attempts_of(job)
        except (NotParticipantError, FencedError):  # refused, nothing written (an unknown outcome is not)
            self._drop_if_empty()
            raise

    def _attempts_of(self, job: _Commit) -> Generator[_Append | _Wait, None, None]:
        # The version the pending changes were made on (older than this Context's version
        # after a catch_up, which re-based them already), and what the re-bases left out.
        base = self._version if self._pending_base is None else self._pending_base
        dropped = list(self._caught_dropped)
        meta = job.meta
        if self._serialise and base < self._version:
            meta = serialised_meta(job.meta, base, self._version, self._keys_since(base, self._version), dropped)
        for attempt in range(_MAX_REBASES):
            ops = self._pending
            self._check_participant(job)
            try:
                yield _Append(ops, self._version, meta)
                return
            except FencedError:
                raise  # another runner holds the session: retrying cannot help
            except ConflictError as exc:
                delay = self._before_retry(exc, ops, attempt)
            except StoreError as exc:
                self._commit_failed(exc)
                raise
            if delay:
                yield _Wait(delay)
            with self._lock:
                if self._serialise:
                    dropped += self._rebase_all(ops)
                    meta = serialised_meta(
                        job.meta, base, self._version, self._keys_since(base, self._version), dropped
                    )
                else:
                    self._rebase(ops)
        raise ConflictError(job.session_id, self._version, None, ["(too many concurrent writers)"])

    def _check_participant(self, job: _Commit) -> None:
        """Refuse a commit by a non-participant of a session that declares its participants
        (:class:`NotParticipantError`), judged on the committed state the commit is based on."""
        if self._fence is not None:
            return  # the session's runner (its lease token is checked by the store)
        if not self._declared_read:  # fixed when the session was made: read once
            info, _ = job.store.session_info_without_plan(job.session_id)
            self._declared, self._declared_read = info.participants, True
        declared = self._declared
        if declared is None or job.author in declared:
            return
        added = self._added
        if isinstance(added, list) and job.author in added:
            return
        raise NotParticipantError(job.session_id, job.author)

    def _track_participants(self, ops: list[dict[str, Any]]) -> None:
        """Keep the committed list of added participants up to date with ``ops`` (just committed)."""
        mine = [op for op in ops if op.get("var") == PARTICIPANTS_VAR]
        if mine:
            state = State(vars={} if self._added is None else {PARTICIPANTS_VAR: copy_json(self._added)})
            self._added = apply_ops(state, mine).vars.get(PARTICIPANTS_VAR)

    def _drop_if_empty(self) -> None:
        """After a refused commit (not a participant, fenced off): remove the session this Context
        made if it is still empty (nothing else wrote to it), so a refused first write leaves
        nothing behind."""
        creation = self._creation
        if creation is None or self._version != 0 or creation.get("dropped"):
            return
        store, sid = self._require_store()
        try:
            if store.head(sid) == 0:
                store.delete_session(sid)
                creation["dropped"] = True
        except StoreError:
            pass  # it stays, empty: harmless

    def _keys_since(self, version: int, upto: int | None = None) -> list[str]:
        """The keys the events after ``version`` (up to ``upto``) changed, in log order (each once)."""
        store, sid = self._require_store()
        keys: dict[str, None] = {}
        for event in store.read(sid, version, upto):
            keys.update(dict.fromkeys(event.keys()))
        return list(keys)

    def _before_retry(self, exc: ConflictError, ops: list[dict[str, Any]], attempt: int) -> float:
        """After a conflict: raise unless the batch can be re-based; return how long to back off.

        The error raised names the keys the other writers changed since this
        Context's version (what a :meth:`reload` would bring in), not its own.
        """
        if not self._serialise and any(op["op"] not in ATOMIC_OPS and op["op"] != "cas" for op in ops):
            try:
                theirs = self._keys_since(self._version)
            except StoreError:
                theirs = []
            raise ConflictError(exc.session_id, self._version, exc.actual, theirs) from None
        # Several writers hammer the same session: back off a little, at
        # random, so that one of them gets through.
        return random.uniform(0, 0.0005 * min(attempt, 20)) if attempt >= 2 else 0.0

    def _rebase_all(self, ops: list[dict[str, Any]]) -> list[str]:
        """Re-hydrate at the newest version and re-apply every operation of ``ops`` on top, in order
        (a serialised commit); return the keys of those left out.

        A set or delete is applied after the concurrent writers' (the later
        write wins); an atomic operation keeps their updates; a compare-and-set
        that no longer holds, or an operation that no longer applies (another
        writer changed the value's type), is left out.
        """
        mark, pending_base, caught = self._step_mark, self._pending_base, self._caught_dropped
        self._hydrate()
        self._pending_base, self._caught_dropped = pending_base, caught
        kept: list[dict[str, Any]] = []
        dropped: list[str] = []
        for i, op in enumerate(ops):
            if op["op"] == "cas" and not self._cas_holds(op):
                dropped.append(op_key(op))
                mark -= i < mark
                continue
            try:
                apply_ops(self._state, [op])
            except Exception:
                # What failed may have half-changed the value: build the state again without it.
                self._hydrate()
                apply_ops(self._state, kept)
                dropped.append(op_key(op))
                mark -= i < mark
                continue
            kept.append(op)
        self._pending = kept
        self._step_mark = max(0, mark)
        if not kept:
            self._pending_base = None
        return dropped

    def _cas_holds(self, op: dict[str, Any]) -> bool:
        """Whether a compare-and-set's expected value is still the current one."""
        target = {k: op[k] for k in ("name", "var", "path") if k in op}
        name = op.get("name")
        depth = 0 if name is None or "path" in op else lookup(name).int_key_depth
        return self._current_wire(target, op_key(op), depth) == op["expected"]

    def _rebase(self, ops: list[dict[str, Any]]) -> None:
        """Re-hydrate at the newest version and re-apply ``ops`` (atomic/cas only) on top.

        Each compare-and-set is checked again, in order, against the state the
        operations before it produce; if one no longer holds, or an operation no
        longer applies (another writer changed the value's type), the batch is
        dropped and :class:`ConflictError` names the key.
        """
        base = self._version
        self._hydrate()
        sid = self._session_id or ""
        for op in ops:
            key = op_key(op)
            if op["op"] == "cas" and not self._cas_holds(op):
                self._hydrate()
                raise ConflictError(sid, base, self._version, [key])
            try:
                apply_ops(self._state, [op])
            except Exception:
                self._hydrate()
                raise ConflictError(sid, base, self._version, [key]) from None
        self._pending = ops

    def _written(self, event: Event, count: int | None = None) -> None:
        """The pending changes (the first ``count`` of them) are durable as ``event``
        (called by the store as soon as they are)."""
        with self._lock:
            count = len(self._pending) if count is None else count
            self._track_participants(self._pending[:count])
            self._tail_ops += count
            self._version = event.version
            if self._creation is not None:
                self._creation = None  # the session holds a write: it is not removed any more
            self._pending = self._pending[count:]
            self._step_mark = max(0, self._step_mark - count)
            if not self._pending:
                self._pending_base, self._caught_dropped = None, []

    def _commit_failed(self, exc: StoreError) -> None:
        """A commit failed with ``exc`` (not a conflict): keep the changes pending and say so."""
        if isinstance(exc, OutcomeUnknownError) and exc.event is not None:
            self._unknown = replace(exc.event, ops=copy_json(exc.event.ops))
        _keep_pending(exc, len(self._pending))

    def _settle_unknown(self, meta: dict[str, Any] | None) -> bool:
        """After a commit whose outcome was unknown: adopt its event if the store has it.

        Returns whether there is still something to commit.
        """
        unknown = self._unknown
        if unknown is None:
            return True
        store, sid = self._require_store()
        written = next(iter(store.read(sid, unknown.version - 1, unknown.version)), None)  # may raise: try again later
        self._unknown = None
        count = len(unknown.ops)
        if (
            written is not None
            and (written.timestamp, written.author, written.ops) == (unknown.timestamp, unknown.author, unknown.ops)
            and self._pending[:count] == unknown.ops
        ):
            self._written(written, count)
        return bool(self._pending or meta)

    def catch_up(self) -> int:
        """Bring in what other writers committed since this Context's version; return how many versions.

        For a Context that serialises its commits (the engine's): its pending changes
        stay on top, re-based as a serialised commit re-bases them, so that what it
        decides next (a transition of the graph) sees an out-of-turn write made while
        its step ran. Their commit then records the version they were made on and the
        versions they follow (``meta["serialised"]``). A no-op (0) for any other Context,
        and while a commit of unknown outcome is unsettled.
        """
        if self._store is None or self._read_only or not self._serialise or self._unknown is not None:
            return 0
        with self._lock:
            self._check_writable()
            store, sid = self._require_store()
            before = self._version
            if store.head(sid) <= before:
                return 0
            if not self._pending:
                self._hydrate()
                return self._version - before
            base = before if self._pending_base is None else self._pending_base
            self._pending_base = base
            self._caught_dropped = self._caught_dropped + self._rebase_all(self._pending)
            return self._version - before

    # ================================================================ steps

    def commit_step(
        self,
        *,
        author: str | None = None,
        round: int | None = None,
        step: int | None = None,
        meta: dict[str, Any] | None = None,
        summary: SummaryDelta | None = None,
    ) -> int:
        """Commit at a step boundary unless durability is ``exit`` (then changes wait for close)."""
        if self._step_waits_for_close():
            return self._version
        return self.commit(author=author, round=round, step=step, meta=meta, summary=summary)

    async def acommit_step(
        self,
        *,
        author: str | None = None,
        round: int | None = None,
        step: int | None = None,
        meta: dict[str, Any] | None = None,
        summary: SummaryDelta | None = None,
    ) -> int:
        """:meth:`commit_step` for coroutines (see :meth:`acommit`)."""
        if self._step_waits_for_close():
            return self._version
        return await self.acommit(author=author, round=round, step=step, meta=meta, summary=summary)

    def _step_waits_for_close(self) -> bool:
        """With durability ``exit``, a finished step stays pending until close: mark where it ends."""
        if self._durability == "exit" and self._store is not None:
            self._step_mark = len(self._pending)
            return True
        return False

    @contextmanager
    def step(
        self,
        *,
        author: str | None = None,
        round: int | None = None,
        step: int | None = None,
        meta: dict[str, Any] | None = None,
        summary: SummaryDelta | None = None,
    ) -> Iterator[Self]:
        """Group changes into one atomic step: committed together on success, discarded on error.

        With durability ``exit`` a successful step stays pending until close;
        ``strict`` commits each change as it is made, so there is nothing left
        to discard when the step fails.
        """
        if self._store is None:
            saved = self._copy_state()
            try:
                yield self
            except BaseException:
                self._state = saved
                raise
            return
        if self._pending and self._durability != "exit":
            raise RuntimeError("uncommitted changes before the step; commit() them first")
        mark = len(self._pending)
        try:
            yield self
        except BaseException:
            self._discard_after(mark)
            raise
        self.commit_step(author=author, round=round, step=step, meta=meta, summary=summary)

    def _discard_after(self, mark: int) -> None:
        """Drop the pending operations after ``mark``: back to the committed state plus the rest."""
        with self._lock:
            kept = self._pending[:mark]
            self._hydrate(self._version)
            if kept:
                apply_ops(self._state, kept)
                self._pending = kept
                self._step_mark = len(kept)

    def rollback(self) -> None:
        """Discard uncommitted changes and return to the last committed state."""
        with self._lock:
            if self._store is None:
                raise RuntimeError("a detached Context has no committed state to roll back to")
            self._hydrate(self._version if self._read_only else None)

    def reload(self) -> None:
        """Discard uncommitted changes and load the newest committed version."""
        with self._lock:
            self._hydrate(self._version if self._read_only else None)
