"""Committing a Context's pending changes: one event per commit, retried on conflict.

:meth:`Committer.commit` (threads) and :meth:`Committer.acommit` (coroutines)
write the pending operations as ONE event based on the version the Context
has seen. Both run the same retry core, :meth:`Committer._attempts`, which
decides everything: a conflict whose batch holds only atomic operations
(``incr``, ``append``, compare-and-set) is re-based onto the newest version
and tried again, with a random back-off once writers keep colliding; any
other conflict raises :class:`~saucer.store.ConflictError` naming the keys the
*other* writers changed, and any other store error is raised; either way the
changes are kept pending. The two differ only in how they append and how they wait.
How a batch is re-based, and what a serialised commit (``serialise=True``, the
engine's) records, is :mod:`saucer.context.rebase`.

After a commit whose outcome is unknown (the connection broke in flight), the
next commit first checks whether the store has its event, and adopts it
rather than writing it twice.

A session that declares participants refuses a commit by any other author
before anything is sent (see :mod:`saucer.context.participants`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from saucer.context.events import Event, apply_ops, to_wire
from saucer.context.participants import ParticipantGate
from saucer.context.rebase import MAX_REBASES, Rebaser, serialised_meta
from saucer.context.snapshots import Snapshotter
from saucer.context.staging import Deferred, after_written, drafts
from saucer.context.types import EventMeta, Op, Reloader
from saucer.context.unknown import UnknownOutcome
from saucer.context.working import WorkingCopy, check_text
from saucer.store.base import EventDraft, EventStore, SummaryDelta
from saucer.store.model import (
    ConflictError,
    FencedError,
    Lease,
    NotParticipantError,
    OutcomeUnknownError,
    SessionExistsError,
    StoreError,
    check_version,
)

__all__ = ["Committer", "SessionCreation"]


# Not frozen: a frozen dataclass costs about 0.1 µs more per field to make, on every commit.
@dataclass(slots=True)
class _Append:
    """Retry core -> driver: append ``ops`` as one event based on ``version``, with ``meta``."""

    ops: list[Any]  # the pending Ops: the store takes them as the JSON objects each Op is
    version: int
    meta: EventMeta | None


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
    meta: EventMeta | None
    summary: SummaryDelta | None = None


@dataclass(slots=True)
class SessionCreation:
    """How a Context made its session, so that a first commit that is refused leaves no empty
    session behind (it is removed, ``dropped``, and made anew by the next commit)."""

    #: The session's meta it was made with (not an event's).
    meta: dict[str, Any] | None
    participants: list[str] | None
    dropped: bool = False


def _check_commit_args(round: object, step: object) -> None:
    """Refuse, before anything is sent, a round or step a store could not write (64-bit ints).

    The author is checked when it changes (:meth:`Committer._begin`); the meta is checked by the
    store, which encodes it once where it becomes durable (:class:`ValueNotStorableError`)."""
    for what, value in (("round", round), ("step", step)):
        if value is not None and not (value.__class__ is int and _I64_MIN <= value <= _I64_MAX):
            check_version(value, what)
            to_wire(value, what)  # a 64-bit integer


_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


def _thrown(attempts: Generator[_Append | _Wait, None, None], exc: StoreError) -> _Append | _Wait | None:
    """What the retry core does after ``exc`` (None: it is done); raises what cannot be retried."""
    try:
        return attempts.throw(exc)
    except StopIteration:
        return None


async def _version_now(version: int) -> int:
    return version


def _keep_pending(exc: StoreError, count: int) -> None:
    """Say, in the store's error, what happened to the pending changes (they are kept)."""
    if isinstance(exc, OutcomeUnknownError):
        then = ", and its next commit() writes them only if they were not"
    else:
        then = ": commit() again, or rollback() to drop them"
    exc.args = (f"{exc}; this Context keeps its {count} changes pending{then}",) + exc.args[1:]


class Committer:
    """How a Context's pending changes become durable events: recording, commits and their retry core, steps."""

    def __init__(self, work: WorkingCopy, snapshots: Snapshotter, gate: ParticipantGate, reload: Reloader) -> None:
        self._work = work
        self._snapshots = snapshots
        self._gate = gate
        self._reload = reload
        self._rebaser = Rebaser(work, reload)
        #: The default author recorded on commits.
        self.author = "system"
        #: The lease token every commit carries (None when not leased).
        self.fence: int | None = None
        #: Whether a commit that meets a concurrent writer is ordered after it instead of failing.
        self.serialise = False
        #: Set when this Context made its session (see :class:`SessionCreation`).
        self.creation: SessionCreation | None = None
        # A commit whose outcome is unknown (the connection broke): the next commit
        # adopts its event if the store has it, instead of writing it twice.
        self._unknown = UnknownOutcome()
        # The author the last commit checked (a str every store can hold).
        self._author_checked: str | None = None
        # How many events and pending operations the last batch (deferred events and a commit's) wrote.
        self._batch_span = (0, 0)

    def forget_unknown(self) -> None:
        """The pending changes were dropped: a commit of unknown outcome is no longer theirs to settle."""
        self._unknown.forget()

    def hydrate(self, upto: int | None = None) -> None:
        """Load the committed state at ``upto`` (the head when None); drop what is pending."""
        self._reload(upto)
        self.forget_unknown()

    def record(self, ops: list[Op]) -> None:
        """Apply ``ops`` now and keep them pending (committed at once with ``strict``)."""
        work = self._work
        with work.lock:
            work.check_writable()
            apply_ops(work.state, ops)
            if work.store is not None:
                work.pending.extend(ops)
                if work.durability == "strict":
                    self.commit()

    # ============================================================== commits

    def commit(
        self,
        *,
        author: str | None = None,
        round: int | None = None,
        step: int | None = None,
        meta: EventMeta | None = None,
        summary: SummaryDelta | None = None,
    ) -> int:
        """Write the pending changes as ONE event; return the new version (see ``Context.commit``).

        ``summary`` says what the event changes in the session's kept summary
        (:class:`~saucer.store.summary.SummaryDelta`, given by the engine; None: nothing but the step).
        """
        work = self._work
        with work.lock:
            job = self._begin(author, round, step, meta, summary)
            if job is None:
                return work.version
            attempts = self._attempts(job)
            append, written = job.store.append, self._written
            action = next(attempts, None)  # None: the core is done
            while action is not None:
                if isinstance(action, _Wait):
                    time.sleep(action.seconds)
                    action = next(attempts, None)
                    continue
                try:
                    if work.deferred:
                        many = self._drafts(action, job)
                        event = job.store.append_many(job.session_id, action.version, many, fence=self.fence)[-1]
                    else:
                        event = append(
                            job.session_id,
                            action.version,
                            action.ops,
                            author=job.author,
                            round=job.round,
                            step=job.step,
                            meta=action.meta,
                            fence=self.fence,
                            summary=job.summary,
                        )
                except StoreError as exc:
                    action = _thrown(attempts, exc)
                else:
                    written(event)
                    action = next(attempts, None)
            self._snapshots.maybe()
            return work.version

    async def acommit(
        self,
        *,
        author: str | None = None,
        round: int | None = None,
        step: int | None = None,
        meta: EventMeta | None = None,
        summary: SummaryDelta | None = None,
    ) -> int:
        """:meth:`commit` for coroutines: the same event, durable when it returns (see ``Context.acommit``)."""
        work = self._work
        with work.lock:
            job = self._begin(author, round, step, meta, summary)
            if job is None:
                return work.version
            work.committing = True
        try:
            attempts = self._attempts(job)
            action = next(attempts, None)  # None: the core is done
            while action is not None:
                if isinstance(action, _Wait):
                    import asyncio  # only a coroutine waits; a reading command never loads asyncio

                    await asyncio.sleep(action.seconds)
                    action = next(attempts, None)
                    continue
                try:
                    # The store calls _written as soon as the event is durable,
                    # even if this task is cancelled while it waits.
                    if work.deferred:
                        await job.store.aappend_many(
                            job.session_id,
                            action.version,
                            self._drafts(action, job),
                            fence=self.fence,
                            on_written=lambda events: self._written(events[-1]),
                        )
                    else:
                        await job.store.aappend_write(
                            job.session_id,
                            action.version,
                            action.ops,
                            author=job.author,
                            round=job.round,
                            step=job.step,
                            meta=action.meta,
                            fence=self.fence,
                            on_written=self._written,
                            summary=job.summary,
                        )
                except StoreError as exc:
                    action = _thrown(attempts, exc)
                else:
                    action = next(attempts, None)
        finally:
            work.committing = False
        if self._snapshots.due():
            import asyncio

            await asyncio.to_thread(self._snapshots.maybe_locked)  # it writes the whole state: never on the loop
        return work.version

    def _begin(
        self,
        author: str | None,
        round: int | None,
        step: int | None,
        meta: EventMeta | None,
        summary: SummaryDelta | None = None,
    ) -> _Commit | None:
        """Under the lock: what a commit writes, or None when there is nothing to write."""
        work = self._work
        store = work.store
        if store is None:
            return None
        if work.read_only or work.closed or work.committing:
            work.check_writable()  # raises, saying why
        if not (work.pending or meta or summary is not None or work.deferred):
            return None
        sid = work.session_id
        if sid is None:
            store, sid = work.require_store()  # raises
        author = author or self.author
        if author is not self._author_checked:  # an engine commits as the same few authors, step after step
            check_text(author, "author")
            self._author_checked = author
        round = work.round_id() if round is None else round
        if not (
            (round.__class__ is int and _I64_MIN <= round <= _I64_MAX)
            and (step is None or (step.__class__ is int and _I64_MIN <= step <= _I64_MAX))
        ):
            _check_commit_args(round, step)  # what is not a 64-bit int: refused, saying why
        if self._unknown.event is not None and not self._settle_unknown(meta):
            return None
        creation = self.creation
        if creation is not None and creation.dropped:
            # This Context's first commit was refused and its empty session removed: make it again.
            with contextlib.suppress(SessionExistsError):
                store.create_session(sid, meta=creation.meta, participants=creation.participants)
            creation.dropped = False
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
        work, rebaser = self._work, self._rebaser
        try:
            # The version the pending changes were made on (older than this Context's version
            # after a catch_up, which re-based them already), and what the re-bases left out.
            base = work.version if work.pending_base is None else work.pending_base
            dropped = list(work.caught_dropped)
            # (with deferred events, what the core records is the first one's: based on this version)
            first = work.deferred[0].meta if work.deferred else job.meta
            meta = first
            if self.serialise and base < work.version:
                meta = serialised_meta(first, base, work.version, rebaser.keys_since(base, work.version), dropped)
            for attempt in range(MAX_REBASES):
                ops = work.pending
                if self.fence is None:  # (a commit with the lease token is the runner's: always allowed)
                    self._gate.check(job.store, job.session_id, job.author, self.fence)
                try:
                    yield _Append(ops, work.version, meta)
                    return
                except FencedError:
                    raise  # another runner holds the session: retrying cannot help
                except ConflictError as exc:
                    delay = rebaser.before_retry(exc, ops, attempt, self.serialise)
                except StoreError as exc:
                    self._commit_failed(exc)
                    raise
                if delay:
                    yield _Wait(delay)
                with work.lock:
                    if self.serialise:
                        dropped += rebaser.rebase_all(ops)
                        meta = serialised_meta(
                            first, base, work.version, rebaser.keys_since(base, work.version), dropped
                        )
                    else:
                        rebaser.rebase(ops)
            raise ConflictError(job.session_id, work.version, None, ["(too many concurrent writers)"])
        except (NotParticipantError, FencedError):  # refused, nothing written (an unknown outcome is not)
            self._drop_if_empty()
            raise

    def _drop_if_empty(self) -> None:
        """After a refused commit (not a participant, fenced off): remove the session this Context
        made if it is still empty (nothing else wrote to it), so a refused first write leaves
        nothing behind."""
        creation = self.creation
        if creation is None or self._work.version != 0 or creation.dropped:
            return
        store, sid = self._work.require_store()
        try:
            if store.head(sid) == 0:
                store.delete_session(sid)
                creation.dropped = True
        except StoreError:
            pass  # it stays, empty: harmless

    def _written(self, event: Event, count: int | None = None) -> None:
        """The pending changes (the first ``count`` of them) are durable as ``event``
        (called by the store as soon as they are)."""
        work = self._work
        with work.lock:
            pending = work.pending
            whole = count is None or count >= len(pending)  # (as a commit is: no slices to make)
            count = len(pending) if whole or count is None else count
            self._gate.track(pending if whole else pending[:count])
            self._snapshots.tail_ops += count
            work.version = event.version
            if self.creation is not None:
                self.creation = None  # the session holds a write: it is not removed any more
            work.pending = [] if whole else pending[count:]
            if work.deferred:
                work.deferred = [] if whole else after_written(work.deferred, count)
            work.step_mark = max(0, work.step_mark - count)
            if not work.pending:
                work.pending_base, work.caught_dropped = None, []

    def _drafts(self, action: _Append, job: _Commit) -> list[EventDraft]:
        """The events of a commit that writes deferred ones too (see :mod:`saucer.context.staging`)."""
        last = Deferred(len(action.ops), job.author, job.round, job.step, job.meta, job.summary, 0.0)
        many = drafts(self._work.deferred, action.ops, action.meta, last)
        self._batch_span = (len(many), len(action.ops))
        return many

    def _commit_failed(self, exc: StoreError) -> None:
        """A commit failed with ``exc`` (not a conflict): keep the changes pending and say so."""
        if isinstance(exc, OutcomeUnknownError):
            self._unknown.remember(exc, self._work.version, self._batch_span if self._work.deferred else None)
        _keep_pending(exc, len(self._work.pending))

    def _settle_unknown(self, meta: EventMeta | None) -> bool:
        """After a commit whose outcome was unknown: adopt its event if the store has it.

        Returns whether there is still something to commit.
        """
        work = self._work
        adopted = self._unknown.settled(work)
        if adopted is not None:
            self._written(*adopted)
        return bool(work.pending or meta or work.deferred)

    def catch_up(self) -> int:
        """Bring in what other writers committed since this Context's version; return how many versions
        (see ``Context.catch_up``)."""
        work = self._work
        if work.store is None or work.read_only or not self.serialise or self._unknown.event is not None:
            return 0
        with work.lock:
            work.check_writable()
            store, sid = work.require_store()
            before = work.version
            if store.head(sid) <= before:
                return 0
            if not work.pending and not work.deferred:
                self._reload()
                return work.version - before
            base = before if work.pending_base is None else work.pending_base
            work.pending_base = base
            work.caught_dropped = work.caught_dropped + self._rebaser.rebase_all(work.pending)
            return work.version - before

    # ================================================================ steps

    def commit_step(
        self,
        *,
        author: str | None = None,
        round: int | None = None,
        step: int | None = None,
        meta: EventMeta | None = None,
        summary: SummaryDelta | None = None,
    ) -> int:
        """Commit at a step boundary unless durability is ``exit`` (then changes wait for close)."""
        if self._step_waits_for_close():
            return self._work.version
        return self.commit(author=author, round=round, step=step, meta=meta, summary=summary)

    def acommit_step(
        self,
        *,
        author: str | None = None,
        round: int | None = None,
        step: int | None = None,
        meta: EventMeta | None = None,
        summary: SummaryDelta | None = None,
        defer: bool = False,
    ) -> Awaitable[int]:
        """:meth:`commit_step` for coroutines (see :meth:`acommit`): to await.

        With ``defer``, the event is closed now and written with the next commit, in the same
        transaction (:mod:`saucer.context.staging`); the version it will have is returned.
        Not a coroutine of its own: it gives :meth:`acommit`'s (one frame less per step)."""
        if self._step_waits_for_close():
            return _version_now(self._work.version)
        if defer:
            return _version_now(self.defer(author, round, step, meta, summary))
        return self.acommit(author=author, round=round, step=step, meta=meta, summary=summary)

    def defer(
        self,
        author: str | None,
        round: int | None,
        step: int | None,
        meta: EventMeta | None,
        summary: SummaryDelta | None,
    ) -> int:
        """Close the pending changes as an event the next commit writes (see :mod:`saucer.context.staging`);
        return the version it will have."""
        work = self._work
        with work.lock:
            job = self._begin(author, round, step, meta, summary)
            if job is None:
                return work.version + len(work.deferred)
            # A rollback or an aborted step keeps it: it is committed as far as the caller knows.
            work.step_mark = len(work.pending)
            work.deferred.append(
                Deferred(work.step_mark, job.author, job.round, job.step, job.meta, job.summary, time.time())
            )
            return work.version + len(work.deferred)

    def _step_waits_for_close(self) -> bool:
        """With durability ``exit``, a finished step stays pending until close: mark where it ends."""
        work = self._work
        if work.durability == "exit" and work.store is not None:
            work.step_mark = len(work.pending)
            return True
        return False

    @contextmanager
    def step(
        self,
        *,
        author: str | None = None,
        round: int | None = None,
        step: int | None = None,
        meta: EventMeta | None = None,
        summary: SummaryDelta | None = None,
    ) -> Iterator[None]:
        """One atomic step (see ``Context.step``): committed on success, discarded on error."""
        work = self._work
        if work.store is None:
            saved = work.copy_state()
            try:
                yield
            except BaseException:
                work.state = saved
                raise
            return
        if work.pending and work.durability != "exit":
            raise RuntimeError("uncommitted changes before the step; commit() them first")
        mark = len(work.pending)
        try:
            yield
        except BaseException:
            self.discard_after(mark)
            raise
        self.commit_step(author=author, round=round, step=step, meta=meta, summary=summary)

    def finish(self, release: Lease | None = None) -> bool:
        """Closing: commit what is pending, then snapshot if there is new history (every packed value whole),
        giving ``release`` back with it; whether it was."""
        self.commit()
        # A closed session is read more often than it is extended: its last
        # snapshot holds each packed value whole, so reading it folds no tails.
        if self._snapshots.needed_on_close():
            return self._snapshots.auto(whole=True, release=release) and release is not None
        return False

    def abandon_step(self) -> None:
        """Discard the unfinished step (what is pending after the last step boundary)."""
        try:
            self.discard_after(self._work.step_mark)
        except Exception:
            # The committed state could not be reloaded: write nothing
            # (neither the half step nor a snapshot of it).
            self._work.pending = []
            self._snapshots.version = self._work.version

    def rollback(self) -> None:
        """Back to the last committed state, deferred events included (:meth:`Context.rollback`)."""
        work = self._work
        with work.lock:
            if work.store is None:
                raise RuntimeError("a detached Context has no committed state to roll back to")
            if work.deferred and not work.read_only and self._unknown.event is None:
                self.discard_after(work.deferred[-1].end)
            else:
                self.hydrate(work.version if work.read_only else None)

    def discard_after(self, mark: int) -> None:
        """Drop the pending operations after ``mark``: back to the committed state plus the rest."""
        work = self._work
        with work.lock:
            kept = work.pending[:mark]
            deferred = [d for d in work.deferred if d.end <= mark]
            self._reload(work.version)
            self._unknown.forget()
            work.deferred = deferred
            if kept:
                apply_ops(work.state, kept)
                work.pending = kept
                work.step_mark = len(kept)
