"""Group commit: concurrent appends share one transaction and one fsync.

When many sessions of one process commit at the same time, writing each
event in its own transaction makes throughput bounded by the disk's flush
latency. :class:`GroupCommitter` lets them share: each caller queues its
append and waits; one caller at a time is the *leader*: it takes everything
queued so far (up to ``max_batch`` events), writes it as one batch (one transaction,
one COMMIT/fsync) through the backend's ``write_batch``, wakes the others with
their own result, and hands leadership to whoever queued meanwhile.

Two kinds of callers share one queue:

* **threads** (:meth:`GroupCommitter.append`): a caller alone is its own leader
  and writes its batch of one in its own thread; the others block on a lock
  and are woken one after the other.
* **coroutines** (:meth:`GroupCommitter.append_async`), how the engine runs
  sessions: a coroutine queues its append and awaits a future. A coroutine
  that finds the committer idle leads: it yields to its event loop once, so
  that every other session that was ready to run queues its append too, then
  writes the batch and resolves the others' futures. A hundred sessions of one
  loop then share one transaction. By default the batch is written in the
  loop's thread, with no thread switch at all (the loop is blocked while it
  is written, as by a synchronous commit). Both of saucer's durable backends
  pass ``off_loop=True`` (PostgreSQL waits on a server, SQLite on an fsync):
  the leader hands the batch to the committer's one writer thread and awaits
  it, and the loop runs its other sessions meanwhile; they queue the next batch.

A backend that can write two batches at once (``max_inflight=2``: PostgreSQL,
each batch on its own connection) gets the next batch while the previous one is
at the server: once the leader has taken a batch (of ``split_over`` appends or
more), the next leader is chosen at once, and a long queue found with nothing in
flight is sent as two halves. The
sessions of one half then run on the loop while the other half is written,
instead of the loop, the writer and the server taking turns. Batches written
at once may hold appends of one session (two writers of it): the backend checks
each entry's base version against the stored head, in the statement that
writes it, so one of them wins and the other gets its conflict, whichever
commits first.

Every append is still durable when it returns: a caller is released only after
the COMMIT of the transaction that holds its event. A failing append (a
version conflict, a fenced-off writer) fails only its own caller: the
backend checks each entry on its own and sets ``entry.error``. If a batch as a
whole fails unexpectedly, the transaction was rolled back, and each entry is
retried alone through ``write_one`` so that one bad entry cannot fail the rest.

A caller may append several consecutive events of one session at once (``more``:
the versions after its own). They travel as ONE entry of the queue, are
written in the same transaction as each other (never split between two
batches), and succeed or fail together: the caller gets the first refusal
(a conflict on the first event refuses the others, whose versions follow it).

A thread that runs an event loop never waits for the queue with a blocking
call (the write it waits for could be scheduled on its own, blocked, loop):
its synchronous appends are written directly, in their own transaction.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # asyncio is imported by the coroutines that use it: a command that only reads never loads it
    import asyncio

from saucer.store._codec import encode_payload
from saucer.store._loop import running_loop, this_loop
from saucer.store.model import Event

__all__ = ["Pending", "GroupCommitter", "unrefused"]

_QUEUED, _TAKEN, _LEADER, _DONE, _DROPPED = range(5)


def _resolve(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():  # a cancelled waiter has gone
            future.set_result(None)


class Pending:
    """One queued append: the event, the version it is based on, its lease token, its outcome.

    ``on_written`` (optional) is called in the writing thread as soon as the
    event is durable, before its caller is woken, even if that caller has been
    cancelled meanwhile.
    """

    __slots__ = (
        "event",
        "expected",
        "fence",
        "payload",
        "crc",
        "error",
        "on_written",
        "_state",
        "_wake",
        "_next",
        "_loop",
        "_future",
        "more",
        "lead",
    )

    def __init__(
        self,
        event: Event,
        expected: int,
        fence: int | None,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        on_written: Callable[[], Any] | None = None,
        blocking: bool = True,
    ) -> None:
        self.event = event
        self.expected = expected
        self.fence = fence
        self.payload, self.crc = encode_payload(event)
        self.error: BaseException | None = None
        self.on_written = on_written
        self._next: Pending | None = None
        self._state = _QUEUED
        self._loop = loop
        self._future: asyncio.Future[None] | None = None
        self._wake: threading.Lock | None = None
        #: The entries of the events appended with this one (the versions after it), written with it.
        self.more: list[Pending] = []
        #: For an entry of ``more``: the entry it was appended with. A backend refuses it when that
        #: one was refused (its expected version could match a head it was never meant for).
        self.lead: Pending | None = None
        if loop is not None:
            self._future = loop.create_future()
        elif blocking:
            self._wake = threading.Lock()
            self._wake.acquire()


def _with_more(entry: Pending, more: Sequence[Event]) -> Pending:
    """``entry`` with the entries of ``more``, the events of the versions after its own."""
    if more:
        expected, fence = entry.expected, entry.fence
        entry.more = [Pending(e, expected + 1 + i, fence, blocking=False) for i, e in enumerate(more)]
        for one in entry.more:
            one.lead = entry
    return entry


def unrefused(batch: list[Pending]) -> list[Pending]:
    """The entries of ``batch`` to write: one appended with an entry that was refused is refused with it
    (for a backend writing a batch in several statements; its expected version could match a head it
    was never meant for)."""
    kept = []
    for entry in batch:
        lead = entry.lead
        if lead is not None and lead.error is not None:
            entry.error = lead.error
        else:
            kept.append(entry)
    return kept


def _settle_group(entry: Pending) -> None:
    """After a write: the caller of ``entry`` and its ``more`` gets the first refusal (all or nothing)."""
    if entry.error is None:
        for one in entry.more:
            if one.error is not None:
                entry.error = one.error
                break
    for one in entry.more:
        one.error = None


def _raise_own(entry: Pending) -> None:
    if entry.error is not None:
        error, entry.error = entry.error, None
        raise error


class GroupCommitter:
    """Leader/follower group commit over a backend's ``write_batch`` and ``write_one``.

    ``write_batch(entries)`` writes the entries in ONE transaction, setting
    ``entry.error`` on each one it refuses; raising means nothing was written.
    ``write_one(entry)`` writes one entry in its own transaction, raising its error.
    """

    #: A blocked thread whose write is scheduled on an event loop that has not
    #: run it for this long writes the queue itself (the loop may have stopped).
    steal_after = 1.0
    #: With ``max_inflight`` > 1, the smallest batch that another is written beside, and half
    #: the smallest queue found with nothing in flight that is sent as two batches (see
    #: :meth:`_lead`): a smaller batch would cost the server a transaction (a WAL flush) more
    #: than it saves the loop.
    split_over = 16

    def __init__(
        self,
        write_batch: Callable[[list[Pending]], None],
        write_one: Callable[[Pending], None],
        *,
        max_batch: int = 1000,
        off_loop: bool = False,
        max_inflight: int = 1,
    ) -> None:
        self._write_batch = write_batch
        self._write_one = write_one
        self.max_batch = max_batch
        self.off_loop = off_loop
        self.max_inflight = max(1, max_inflight)
        self._writer: ThreadPoolExecutor | None = None  # made when a coroutine first leads off the loop
        self._mutex = threading.Lock()
        self._written = threading.Condition(self._mutex)  # notified after every batch
        self._queue: deque[Pending] = deque()
        self._busy = False  # a leader is chosen that has not taken its batch yet
        self._inflight = 0  # batches taken and not yet written
        self._owed = False  # a hand-over waits until a batch is written (max_inflight were in flight)
        # The coroutine entry whose loop was asked to lead, until it starts.
        self._scheduled: Pending | None = None
        #: How many batches and entries were written (for tests and benchmarks).
        self.batches = 0
        self.entries = 0
        self.largest_batch = 0

    # ------------------------------------------------------------- threads

    def append(self, event: Event, expected: int, fence: int | None, more: Sequence[Event] = ()) -> None:
        """Write one append (with ``more``, the events of the versions after it) durably, shared with
        concurrent callers; raise its own error."""
        if running_loop() is not None:
            entry = _with_more(Pending(event, expected, fence, blocking=False), more)
            self._count([entry])
            self._write_alone(entry)
            _raise_own(entry)
            return
        with self._mutex:  # alone, one batch in flight at most: lead at once (not busy: nothing is queued)
            alone = not self._busy and self.max_inflight == 1
            self._busy = self._busy or alone
        if alone:  # no queue entry, wake-up lock or batch to take
            entry = _with_more(Pending(event, expected, fence, blocking=False), more)
            try:
                self._write([entry])
            finally:  # those who queued meanwhile are the next batch
                with self._mutex:
                    self._hand_over()
        else:
            entry = _with_more(Pending(event, expected, fence), more)
            with self._mutex:
                self._queue.append(entry)
                leader = not self._busy
                if leader:
                    self._busy = True
                    entry._state = _LEADER
            interrupted = None if leader else self._wait(entry)
            if entry._state == _LEADER:
                self._lead(entry)
            if interrupted is not None:
                raise interrupted
        _raise_own(entry)

    def _wait(self, entry: Pending) -> BaseException | None:
        """Block until the entry is written or its caller is made leader; return a deferred interrupt."""
        assert entry._wake is not None
        interrupted: BaseException | None = None
        while True:
            try:
                if not entry._wake.acquire(timeout=self.steal_after):
                    if self._steal(entry):
                        break
                    continue
                nxt = entry._next
                if nxt is not None:
                    entry._next = None
                    assert nxt._wake is not None
                    nxt._wake.release()
                break
            except BaseException as exc:  # e.g. KeyboardInterrupt in the main thread
                with self._mutex:
                    if entry._state == _QUEUED:
                        self._queue.remove(entry)
                        raise
                interrupted = exc  # already being written: wait for the outcome, then re-raise
        return interrupted

    def _steal(self, entry: Pending) -> bool:
        """Lead instead of a coroutine that was made leader but whose loop has not run it (see ``steal_after``)."""
        with self._mutex:
            scheduled = self._scheduled
            if scheduled is None or entry._state != _QUEUED:
                return False
            scheduled._state = _QUEUED  # its task, when it runs, waits instead of leading
            self._scheduled = None
            entry._state = _LEADER
            return True

    def write_events(self, events: Sequence[Event], expected: int, fence: int | None, *, shared: bool) -> None:
        """Write consecutive ``events`` (the versions after ``expected``) in ONE transaction, raising the
        first refusal: one entry of the queue (``shared``), else alone through ``write_batch``."""
        if not events:
            return
        if shared:
            self.append(events[0], expected, fence, events[1:])
            return
        entry = _with_more(Pending(events[0], expected, fence, blocking=False), events[1:])
        self._write_alone(entry)
        _raise_own(entry)

    async def awrite_events(
        self,
        events: Sequence[Event],
        expected: int,
        fence: int | None,
        on_written: Callable[[], Any] | None,
        *,
        shared: bool,
    ) -> None:
        """:meth:`write_events` from a coroutine (``shared``: with the loop's other appends), calling
        ``on_written()`` once they are durable."""
        if shared and events:
            await self.append_async(events[0], expected, fence, on_written, events[1:])
            return
        self.write_events(events, expected, fence, shared=False)
        if on_written is not None:
            on_written()

    # ---------------------------------------------------------- coroutines

    async def append_async(
        self,
        event: Event,
        expected: int,
        fence: int | None,
        on_written: Callable[[], Any] | None = None,
        more: Sequence[Event] = (),
    ) -> None:
        """Write one append (with ``more``: see :meth:`append`) durably from a coroutine, sharing the
        write with the loop's other appends.

        If the awaiting task is cancelled before its entry is taken for
        writing, nothing is written. Once taken, the write completes, and the
        cancellation reaches the caller only after it has (``on_written`` has
        run by then if the event was written).
        """
        import asyncio

        loop = this_loop()
        entry = _with_more(Pending(event, expected, fence, loop=loop, on_written=on_written), more)
        with self._mutex:
            self._queue.append(entry)
            if not self._busy:
                self._busy = True
                entry._state = _LEADER
                self._scheduled = entry
        try:
            while True:
                if entry._state == _LEADER:
                    # Yield once, so that the other sessions of this loop that
                    # are ready to run commit in the same batch.
                    await asyncio.sleep(0)
                    with self._mutex:
                        lead = entry._state == _LEADER and self._scheduled is entry
                        if lead:
                            self._scheduled = None
                    if lead:
                        if self.off_loop:
                            await self._lead_off_loop(loop, entry)
                        else:
                            self._lead(entry)
                if entry._state == _DONE:
                    break
                future = entry._future
                assert future is not None
                if future.done():  # woken to lead, then a blocked thread took over: wait again
                    with self._mutex:
                        if entry._state in (_DONE, _LEADER):
                            continue
                        future = entry._future = loop.create_future()
                await future
        except asyncio.CancelledError:
            with self._mutex:
                if entry._state in (_QUEUED, _LEADER):
                    self._queue.remove(entry)
                    if self._scheduled is entry:
                        self._scheduled = None
                        self._hand_over()
                    entry._state = _DROPPED
                # Being written by another thread: wait for the outcome (one batch).
                while entry._state == _TAKEN:
                    self._written.wait()
            raise
        _raise_own(entry)

    async def _lead_off_loop(self, loop: asyncio.AbstractEventLoop, own: Pending) -> None:
        """:meth:`_lead` on the writer thread while the loop runs on. The batch is taken at once, and
        once taken its write completes: a cancellation reaches the caller only after it has."""
        import asyncio

        with self._mutex:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(self.max_inflight, thread_name_prefix="saucer-group-commit")
            writer = self._writer
        future = loop.run_in_executor(writer, self._lead, own)
        cancelled = False
        while True:
            try:
                await asyncio.shield(future)
                break
            except asyncio.CancelledError:
                if future.done():  # the write is over: the cancellation was this task's own
                    cancelled = True
                    break
                cancelled = True  # wait for the write, then let the cancellation through
        if cancelled:
            raise asyncio.CancelledError

    def close(self) -> None:
        """Let the writer thread (if any) end once it is idle."""
        with self._mutex:
            writer, self._writer = self._writer, None
        if writer is not None:
            writer.shutdown(wait=False)

    @staticmethod
    def _call(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` in ``loop``: now if that is this thread's loop; RuntimeError if it is closed."""
        if running_loop() is loop:
            fn(*args)
        else:
            loop.call_soon_threadsafe(fn, *args)

    # -------------------------------------------------------------- leading

    def _lead(self, own: Pending) -> None:
        """Write batches from the front of the queue until ``own`` is written.

        Once the batch that holds ``own`` is taken, the next leader is chosen at
        once if fewer than ``max_inflight`` batches are in flight and the batch is
        not small (``split_over``), so that it takes the next batch while this one
        is written (on another connection); otherwise as soon as a batch is written.
        """
        while True:
            with self._mutex:
                queued = len(self._queue)
                size = min(queued, self.max_batch)
                if self._inflight == 0 and self.max_inflight > 1 and queued >= 2 * self.split_over:
                    # Nothing is in flight: send half now and let the next leader send the rest at
                    # once, so that the sessions of one half run while the other half is written.
                    size = min(size, (queued + 1) // 2)
                batch = self._take(size)
                mine = own._state == _TAKEN  # (own is at the front, unless a thread took over leading)
                self._inflight += 1
                if mine:
                    if self._inflight < self.max_inflight and len(batch) >= self.split_over:
                        self._hand_over()
                    else:
                        self._owed = True
            try:
                self._write(batch)
            except BaseException as exc:  # the leader was interrupted: nobody knows what was written
                for entry in batch:
                    if entry.error is None:
                        entry.error = exc
                self._written_batch(batch, own, hand_over=not mine)
                raise
            self._written_batch(batch, own, hand_over=False)
            if mine:
                return

    def _take(self, size: int) -> list[Pending]:
        """Up to ``size`` callers' entries from the front of the queue (under the mutex), whole: an entry's
        ``more`` goes with it, and counts towards ``max_batch`` (events), which only the first may pass."""
        queue, rows = self._queue, 0
        batch: list[Pending] = []
        while queue and len(batch) < size and (rows < self.max_batch or not batch):
            entry = queue.popleft()
            entry._state = _TAKEN
            batch.append(entry)
            rows += 1 + len(entry.more)
        return batch

    def _written_batch(self, batch: list[Pending], own: Pending, *, hand_over: bool) -> None:
        """A batch was written (or failed): wake its callers, and choose the next leader if that is owed."""
        with self._mutex:
            self._release(batch, own)
            self._inflight -= 1
            if self._owed or hand_over:
                self._owed = False
                self._hand_over()

    def _release(self, batch: list[Pending], own: Pending) -> None:
        """Mark the batch written and wake its callers (under the mutex)."""
        threads: list[Pending] = []
        loops: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        self._written.notify_all()
        for entry in batch:
            entry._state = _DONE
            if entry is own:
                continue
            if entry._future is not None:
                loops.setdefault(entry._loop, []).append(entry._future)  # type: ignore[arg-type]  # _loop is set with _future
            elif entry._wake is not None:
                threads.append(entry)
        # Wake the threads one after the other (each wakes the next as it
        # starts) rather than all at once: a hundred threads woken together
        # fight over the GIL and spend more time switching than running.
        for a, b in zip(threads, threads[1:], strict=False):
            a._next = b
        if threads:
            threads[0]._wake.release()  # type: ignore[union-attr]  # only entries with a _wake are in threads
        for loop, futures in loops.items():
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting there any more
                self._call(loop, _resolve, futures)

    def _hand_over(self) -> None:
        """Make the front of the queue the next leader, or go idle (under the mutex)."""
        while self._queue:
            nxt = self._queue[0]
            nxt._state = _LEADER
            if nxt._loop is None:
                assert nxt._wake is not None
                nxt._wake.release()
                return
            try:
                self._call(nxt._loop, _resolve, [nxt._future])  # its task wakes up and leads
            except RuntimeError:  # its loop is closed: nobody can wait for that entry
                self._queue.popleft()
                nxt._state = _DROPPED
                continue
            self._scheduled = nxt
            return
        self._busy = False

    def _count(self, batch: list[Pending]) -> None:
        size = sum(1 + len(entry.more) for entry in batch)
        self.batches += 1
        self.entries += size
        if size > self.largest_batch:
            self.largest_batch = size

    def _write_alone(self, entry: Pending) -> None:
        """Write one caller's entry (and its ``more``) in its own transaction; the errors stay on the entries."""
        if not entry.more:
            try:
                self._write_one(entry)
            except Exception as exc:
                entry.error = exc
            return
        group = [entry, *entry.more]
        try:
            self._write_batch(group)
        except Exception as exc:  # nothing of the group was written
            for one in group:
                one.error = exc
        _settle_group(entry)

    def _write(self, batch: list[Pending]) -> None:
        self._count(batch)
        if len(batch) == 1:
            self._write_alone(batch[0])
        else:
            rows = (
                [one for entry in batch for one in (entry, *entry.more)]
                if any(entry.more for entry in batch)
                else batch
            )
            try:
                self._write_batch(rows)
            except Exception:
                for entry in batch:
                    entry.error = None
                    for one in entry.more:
                        one.error = None
                    self._write_alone(entry)
        for entry in batch:
            if entry.more:
                _settle_group(entry)
        for entry in batch:
            if entry.error is None and entry.on_written is not None:
                try:
                    entry.on_written()
                except Exception as exc:  # the event is written all the same
                    warnings.warn(f"on_written callback failed: {exc!r}", RuntimeWarning, stacklevel=2)
