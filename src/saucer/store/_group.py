"""Group commit: many threads' appends share one transaction and one fsync.

When many sessions of one process commit at the same time, writing each
event in its own transaction makes throughput bounded by the disk's flush
latency. :class:`GroupCommitter` lets them share: each caller queues its
append and waits; the caller at the front of the queue becomes the *leader*,
takes everything queued so far (up to ``max_batch``), writes it as one batch
(one transaction, one COMMIT/fsync) through the backend's ``write_batch``,
wakes the others with their own result, and hands leadership to whoever
queued meanwhile. A caller alone pays nothing extra: it is its own leader and
writes its batch of one in its own thread.

Every append is still durable when it returns: a caller is released only after
the COMMIT of the transaction that holds its event. A failing append (a
version conflict, a fenced-off writer) fails only its own caller: the
backend checks each entry on its own and sets ``entry.error``. If a batch as a
whole fails unexpectedly, the transaction was rolled back, and each entry is
retried alone through ``write_one`` so that one bad entry cannot fail the rest.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable

from saucer.context.events import Event
from saucer.store._codec import encode_payload

__all__ = ["Pending", "GroupCommitter"]

_QUEUED, _TAKEN, _LEADER, _DONE = range(4)


class Pending:
    """One queued append: the event, the version it is based on, its lease token, its outcome."""

    __slots__ = ("event", "expected", "fence", "payload", "crc", "error", "_state", "_wake", "_next")

    def __init__(self, event: Event, expected: int, fence: int | None) -> None:
        self.event = event
        self.expected = expected
        self.fence = fence
        self.payload, self.crc = encode_payload(event)
        self.error: BaseException | None = None
        self._next: Pending | None = None
        self._state = _QUEUED
        self._wake = threading.Lock()
        self._wake.acquire()


class GroupCommitter:
    """Leader/follower group commit over a backend's ``write_batch`` and ``write_one``.

    ``write_batch(entries)`` writes the entries in ONE transaction, setting
    ``entry.error`` on each one it refuses; raising means nothing was written.
    ``write_one(entry)`` writes one entry in its own transaction, raising its error.
    """

    def __init__(
        self,
        write_batch: Callable[[list[Pending]], None],
        write_one: Callable[[Pending], None],
        *,
        max_batch: int = 1000,
    ) -> None:
        self._write_batch = write_batch
        self._write_one = write_one
        self.max_batch = max_batch
        self._mutex = threading.Lock()
        self._queue: deque[Pending] = deque()
        self._busy = False
        #: How many batches and entries were written (for tests and benchmarks).
        self.batches = 0
        self.entries = 0
        self.largest_batch = 0

    def append(self, event: Event, expected: int, fence: int | None) -> None:
        """Write one append durably (shared with concurrent callers); raise its own error."""
        entry = Pending(event, expected, fence)
        with self._mutex:
            self._queue.append(entry)
            leader = not self._busy
            if leader:
                self._busy = True
                entry._state = _LEADER
        interrupted = None if leader else self._wait(entry)
        if entry._state == _LEADER:
            self._lead()
        if interrupted is not None:
            raise interrupted
        if entry.error is not None:
            error, entry.error = entry.error, None
            raise error

    def _wait(self, entry: Pending) -> BaseException | None:
        """Block until the entry is written or its caller is made leader; return a deferred interrupt."""
        interrupted: BaseException | None = None
        while True:
            try:
                entry._wake.acquire()
                nxt = entry._next
                if nxt is not None:
                    entry._next = None
                    nxt._wake.release()
                break
            except BaseException as exc:  # e.g. KeyboardInterrupt in the main thread
                with self._mutex:
                    if entry._state == _QUEUED:
                        self._queue.remove(entry)
                        raise
                interrupted = exc  # already being written: wait for the outcome, then re-raise
        return interrupted

    def _lead(self) -> None:
        """Write everything queued (this caller's entry first), release those callers, hand over."""
        with self._mutex:
            batch = [self._queue.popleft() for _ in range(min(len(self._queue), self.max_batch))]
            for entry in batch:
                entry._state = _TAKEN
        try:
            self._write(batch)
        except BaseException as exc:  # the leader was interrupted: nobody knows what was written
            for entry in batch:
                if entry.error is None:
                    entry.error = exc
            raise
        finally:
            with self._mutex:
                for entry in batch:
                    entry._state = _DONE
                # Wake the callers one after the other (each wakes the next as it
                # starts) rather than all at once: a hundred threads woken together
                # fight over the GIL and spend more time switching than running.
                followers = batch[1:]
                for a, b in zip(followers, followers[1:]):
                    a._next = b
                if followers:
                    followers[0]._wake.release()
                if self._queue:
                    nxt = self._queue[0]
                    nxt._state = _LEADER
                    nxt._wake.release()
                else:
                    self._busy = False

    def _write(self, batch: list[Pending]) -> None:
        self.batches += 1
        self.entries += len(batch)
        if len(batch) > self.largest_batch:
            self.largest_batch = len(batch)
        if len(batch) == 1:
            try:
                self._write_one(batch[0])
            except Exception as exc:
                batch[0].error = exc
            return
        try:
            self._write_batch(batch)
        except Exception:
            for entry in batch:
                entry.error = None
                try:
                    self._write_one(entry)
                except Exception as exc:
                    entry.error = exc
