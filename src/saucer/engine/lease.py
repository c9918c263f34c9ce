"""A runner's lease on its session: taken at start, renewed in the background and before each step.

The store's lease (``acquire_lease``) names its holder (``host:pid:uuid``)
and carries a token that fences every commit: a second runner gets
:class:`~saucer.store.LeaseHeldError` naming the holder, and a runner whose
lease was taken over cannot commit any more (its next step raises
:class:`~saucer.engine.errors.LeaseLostError`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from saucer.engine.errors import LeaseLostError
from saucer.store import EventStore, LeaseHeldError, StoreError
from saucer.store.base import Lease

__all__ = ["LeaseKeeper", "lease_owner"]

_log = logging.getLogger("saucer.engine")


def lease_owner() -> str:
    """``host:pid:uuid`` naming this runner in lease errors."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeaseKeeper:
    """Holds one session's lease for one runner; ``on_token(token)`` hears of a new fencing token."""

    def __init__(
        self, store: EventStore, session_id: str, owner: str, ttl: float, on_token: Callable[[int], None]
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.owner = owner
        self.ttl = ttl
        self.lease: Lease | None = None
        self._on_token = on_token
        self._renewed = 0.0
        self._lost: BaseException | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._renewing = False
        # A renewal runs in a thread, which a cancellation does not stop: release() waits for it
        # under this lock, and a renewal that starts after stop() is not made.
        self._store_lock = threading.Lock()
        self._stopped = False
        self._held: Lease | None = None  # the newest lease a renewal got (release() gives that one back)

    async def acquire(self, wait: float = 0.0) -> Lease:
        """Take the lease, waiting up to ``wait`` seconds for another holder's lease to expire."""
        deadline = time.monotonic() + wait
        while True:
            try:  # in a thread: the store may wait on a server, the loop's other sessions must not
                self.lease = await asyncio.to_thread(self.store.acquire_lease, self.session_id, self.owner, self.ttl)
                self._renewed = time.monotonic()
                return self.lease
            except LeaseHeldError as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                await asyncio.sleep(min(left, max(0.02, exc.expires_at - time.time() + 0.02)))

    def adopt(self, lease: Lease) -> None:
        """Hold ``lease``, taken by the caller (with the session's creation, :meth:`~saucer.store.EventStore.create_session_leased`)."""
        self.lease = lease
        self._renewed = time.monotonic()

    def start_renewing(self) -> None:
        """Renew every third of the lease's time to live, from a background task."""
        self._stopped = False
        self._renewer = asyncio.create_task(self._renew_loop(), name=f"saucer-lease-{self.session_id}")

    def check(self) -> None:
        """Before each step: :class:`LeaseLostError` if the lease was lost; renew it if it is due."""
        if self._lost is None and not self._renewing and time.monotonic() - self._renewed > self.ttl / 3.0:
            self._renew()
        if self._lost is not None:
            raise LeaseLostError(f"session {self.session_id!r}: this runner lost its lease ({self._lost})")

    def stop(self) -> None:
        """Stop renewing (the task is cancelled, not awaited: awaiting would swallow a cancellation of the caller)."""
        self._stopped = True
        if self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None

    def release(self) -> None:
        """Give the lease back (a warning, never an error, when the store refuses)."""
        try:
            lease = self.to_give_back()
            if lease is not None:
                self.store.release_lease(lease)
        except Exception as exc:  # noqa: BLE001
            _log.warning("session %s: releasing the lease failed: %s", self.session_id, exc)

    def to_give_back(self) -> Lease | None:
        """The lease to give back once renewals have stopped (:meth:`stop`): the newest one held, after a
        renewal still in flight (None: none is held). The session's last snapshot may carry it back
        (``Context.close(release=...)``); then :meth:`given_back`, else :meth:`release`."""
        if self.lease is None:
            return None
        with self._store_lock:  # after a renewal still in flight (it would take the lease again)
            held = self._held
            return held if held is not None and held.token >= self.lease.token else self.lease

    def given_back(self) -> None:
        """The lease was given back with the session's last snapshot: :meth:`release` has nothing left to do."""
        self.lease = self._held = None

    def _renew(self) -> None:
        try:
            lease = self.store.acquire_lease(self.session_id, self.owner, self.ttl)
        except (LeaseHeldError, StoreError) as exc:
            self._renewal_failed(exc)
            return
        self._renewed_as(lease)

    def _renewal_failed(self, exc: BaseException) -> None:
        if isinstance(exc, LeaseHeldError):
            self._lost = exc
        else:  # transient: the next renewal tries again
            _log.warning("session %s: lease renewal failed: %s", self.session_id, exc)

    def _renewed_as(self, lease: Lease) -> None:
        self._renewed = time.monotonic()
        if self.lease is None or lease.token != self.lease.token:
            self._on_token(lease.token)
        self.lease = lease

    def _renew_unless_stopped(self) -> Lease | None:
        with self._store_lock:
            if self._stopped:
                return None
            lease = self._held = self.store.acquire_lease(self.session_id, self.owner, self.ttl)
            return lease

    async def _renew_loop(self) -> None:
        interval = self.ttl / 3.0
        while True:
            await asyncio.sleep(interval)
            self._renewing = True  # check() leaves it to this renewal meanwhile
            try:  # in a thread (see acquire); what it returns is applied here, on the loop
                lease = await asyncio.to_thread(self._renew_unless_stopped)
            except (LeaseHeldError, StoreError) as exc:
                self._renewal_failed(exc)
                continue
            finally:
                self._renewing = False
            if lease is not None:
                self._renewed_as(lease)
