"""Run commands on a remote device over its WebSocket connection.

:class:`WebSocketCommandDispatcher` has the same ``execute_commands`` interface
as the local dispatcher. It sends one ``command`` frame per batch to the
device's current connection and waits for the ``command_results`` frame whose
``prev_response_id`` matches, under three guarantees UFO's dispatcher lacked:

- **bounded**: every batch has a timeout; when it passes, the batch fails with
  results that name the timeout (no 100-minute waits);
- **prompt on loss**: when the device disconnects or misses its heartbeats,
  its pending batches fail at once, or, with ``reconnect_grace > 0``, wait that
  long for the device to reconnect and answer (a device that reconnects
  without the batch in its ``inflight`` list lost it, so it fails then);
- **total**: always exactly one Result per Command, in order, keeping call_ids,
  whatever the device sends;
- **cancel reaches the device**: when the session's owner cancels it
  (:attr:`WebSocketCommandDispatcher.cancel_reason` set, then the waiting task
  cancelled), the batch in flight is not just forgotten: a ``cancel`` frame
  goes to the device, and the task unwinds only once the device has answered
  the batch (its acknowledgement), has gone, or ``cancel_timeout`` has passed.

Correlation lives in :class:`CommandCorrelator`, shared by the server (which
feeds it the frames it receives) and the dispatchers (which open batches and
wait on them). The server side of a device connection is a :class:`DeviceLink`.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from saucer.dispatch.messages import Command, Result
from saucer.dispatch.wire import (
    CancelFrame,
    CommandFrame,
    ErrorCode,
    ProtocolError,
    align_results,
    failure_results,
)

DEFAULT_RECONNECT_GRACE = 0.0
"""Seconds pending commands wait for a lost device to come back; 0 fails them at once."""

DEFAULT_BATCH_TIMEOUT = 300.0
"""Seconds a batch may take when the caller passes ``timeout=None``: a remote wait is never unbounded."""

DEFAULT_CANCEL_TIMEOUT = 10.0
"""Seconds a cancelled batch waits for the device to acknowledge the cancel."""


class DeviceUnavailable(Exception):
    """The device is not connected, or its connection went away before a frame could be sent."""


class DeviceLink(Protocol):
    """What a dispatcher needs from the server's registry of device connections."""

    correlator: CommandCorrelator

    async def wait_online(self, device_id: str, timeout: float) -> int | None:
        """The id of the device's live connection, waiting up to ``timeout`` s; None if it stays offline."""
        ...

    async def send_frame(self, device_id: str, connection_id: int, frame: CommandFrame | CancelFrame) -> None:
        """Send ``frame`` on that connection; raise :class:`DeviceUnavailable` if it is no longer live."""
        ...


@dataclass(eq=False)
class PendingBatch:
    """A command batch sent to a device and not yet answered."""

    response_id: str
    device_id: str
    session_id: str
    commands: list[Command]
    reconnect_grace: float
    future: asyncio.Future[list[Result]]
    connection_id: int | None = None
    grace_timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class CommandCorrelator:
    """Pending batches by ``response_id``; matches replies and fails batches whose device is gone.

    All methods are synchronous and run on the event loop, so no lock is
    needed: the table cannot change between a check and the update after it.
    """

    def __init__(self, remember: int = 4096) -> None:
        self._pending: dict[str, PendingBatch] = {}
        # Recently closed ids and why, so a late or replayed reply gets a precise refusal.
        self._closed: OrderedDict[str, str] = OrderedDict()
        self._remember = remember

    def __len__(self) -> int:
        return len(self._pending)

    def open(self, device_id: str, session_id: str, commands: list[Command], reconnect_grace: float) -> PendingBatch:
        """Register a new batch for ``device_id`` and return it."""
        batch = PendingBatch(
            response_id=uuid.uuid4().hex,
            device_id=device_id,
            session_id=session_id,
            commands=list(commands),
            reconnect_grace=reconnect_grace,
            future=asyncio.get_running_loop().create_future(),
        )
        self._pending[batch.response_id] = batch
        return batch

    def session_of(self, response_id: str) -> str | None:
        """The session of the pending batch ``response_id``, if there is one."""
        batch = self._pending.get(response_id)
        return None if batch is None else batch.session_id

    def pending_for(self, device_id: str) -> list[PendingBatch]:
        """The device's unanswered batches."""
        return [b for b in self._pending.values() if b.device_id == device_id]

    def resolve(self, device_id: str, session_id: str, response_id: str, results: list[Result]) -> list[str]:
        """Accept a device's results for one of its batches; return alignment problems (may be empty).

        Raise :class:`ProtocolError` when the reply is not acceptable: an id that
        was never issued to this device (forged), one already answered or timed
        out (replayed or late), or a different session id than the batch's.
        """
        batch = self._pending.get(response_id)
        if batch is None or batch.device_id != device_id:
            # Another device's batch is reported exactly like an unknown id: no oracle for ids.
            why = self._closed.get(response_id) if batch is None else None
            detail = f"was already {why}" if why else "was not issued to this device"
            raise ProtocolError(ErrorCode.UNKNOWN_RESPONSE, f"response_id {response_id!r} {detail}", response_id)
        if batch.session_id != session_id:
            raise ProtocolError(
                ErrorCode.SESSION_MISMATCH,
                f"response_id {response_id!r} belongs to another session than {session_id!r}",
                response_id,
            )
        aligned, problems = align_results(batch.commands, results, source=f"device {device_id!r}")
        self._finish(batch, aligned, "answered")
        return problems

    def fail(self, batch: PendingBatch, error: str, reason: str = "failed") -> None:
        """Fail every command of ``batch`` with ``error`` (no-op if it is already closed)."""
        if self._pending.get(batch.response_id) is batch:
            self._finish(batch, failure_results(batch.commands, error), reason)

    def closed_reason(self, response_id: str) -> str | None:
        """How a recently closed batch ended (``answered``, ``failed``, ``timed out``...), if remembered."""
        return self._closed.get(response_id)

    def discard(self, batch: PendingBatch, reason: str) -> None:
        """Forget ``batch`` without resolving it (its waiter gave up, e.g. on timeout)."""
        if self._pending.get(batch.response_id) is batch:
            self._finish(batch, None, reason)

    def connection_lost(self, device_id: str, connection_id: int, error: str) -> None:
        """The device's connection ``connection_id`` is gone: fail its batches now or after their grace."""
        for batch in self.pending_for(device_id):
            if batch.connection_id != connection_id:
                continue
            if batch.reconnect_grace <= 0:
                self.fail(batch, error)
            elif batch.grace_timer is None:
                message = f"{error}; it did not reconnect within {batch.reconnect_grace:g} s"
                batch.grace_timer = asyncio.get_running_loop().call_later(
                    batch.reconnect_grace, self.fail, batch, message
                )

    def device_registered(self, device_id: str, connection_id: int, inflight: set[str]) -> None:
        """The device (re)registered on ``connection_id``; keep the batches it still has, fail the rest."""
        for batch in self.pending_for(device_id):
            if batch.connection_id is None or batch.connection_id == connection_id:
                continue
            if batch.response_id in inflight:
                batch.connection_id = connection_id
                if batch.grace_timer is not None:
                    batch.grace_timer.cancel()
                    batch.grace_timer = None
            else:
                self.fail(
                    batch,
                    f"device {device_id!r} reconnected without command batch {batch.response_id}: "
                    "the device lost it (restarted?)",
                )

    def _finish(self, batch: PendingBatch, results: list[Result] | None, reason: str) -> None:
        del self._pending[batch.response_id]
        if batch.grace_timer is not None:
            batch.grace_timer.cancel()
            batch.grace_timer = None
        if results is not None and not batch.future.done():
            batch.future.set_result(results)
        self._closed[batch.response_id] = reason
        while len(self._closed) > self._remember:
            self._closed.popitem(last=False)


class WebSocketCommandDispatcher:
    """Runs command batches on one remote device, on behalf of one session.

    ``reconnect_grace`` (seconds) is how long a batch whose device went away
    waits for it to come back, and how long a batch waits for an offline device
    to connect before it is sent; 0 fails such batches at once. The whole of
    ``execute_commands`` (waiting included) is bounded by its ``timeout``, or by
    ``default_timeout`` when that is None. It satisfies
    :class:`saucer.dispatch.base.BasicCommandDispatcher`.
    """

    def __init__(
        self,
        link: DeviceLink,
        device_id: str,
        session_id: str,
        *,
        reconnect_grace: float = DEFAULT_RECONNECT_GRACE,
        default_timeout: float = DEFAULT_BATCH_TIMEOUT,
        cancel_timeout: float = DEFAULT_CANCEL_TIMEOUT,
    ) -> None:
        if reconnect_grace < 0:
            raise ValueError(f"reconnect_grace must be >= 0, got {reconnect_grace}")
        if default_timeout <= 0:
            raise ValueError(f"default_timeout must be > 0, got {default_timeout}")
        self.link = link
        self.device_id = device_id
        self.session_id = session_id
        self.reconnect_grace = reconnect_grace
        self.default_timeout = default_timeout
        self.cancel_timeout = cancel_timeout
        #: Set (to why) before cancelling the task that waits on a batch: the device is then told to stop it.
        self.cancel_reason: str | None = None
        #: After such a cancel: None when the device acknowledged it (or nothing was running), else what happened.
        self.cancel_outcome: str | None = None

    async def execute_commands(
        self, commands: Sequence[Command], timeout: float | None = None, *, approved: Collection[str] = ()
    ) -> list[Result]:
        """Send ``commands`` to the device and return exactly one Result per Command, in order.

        ``approved``: call ids of sensitive commands a person approved (sent in the frame, so the
        device runs them without the confirmation nobody can give there)."""
        commands = list(commands)
        if not commands:
            return []
        if timeout is None:
            timeout = self.default_timeout
        if timeout <= 0:
            return failure_results(commands, f"timeout must be positive, got {timeout}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        connection_id = await self.link.wait_online(self.device_id, min(self.reconnect_grace, timeout))
        if connection_id is None:
            return failure_results(commands, f"device {self.device_id!r} is offline")
        correlator = self.link.correlator
        batch = correlator.open(self.device_id, self.session_id, commands, self.reconnect_grace)
        # Set before sending: a disconnect seen from here on fails (or holds) this batch.
        batch.connection_id = connection_id
        remaining = max(deadline - loop.time(), 0.001)
        allowed = [c.call_id for c in batch.commands if c.call_id in approved]
        frame = CommandFrame(
            response_id=batch.response_id,
            session_id=self.session_id,
            commands=batch.commands,
            timeout=remaining,
            approved=allowed or None,
        )
        try:
            await self.link.send_frame(self.device_id, connection_id, frame)
        except DeviceUnavailable as exc:
            correlator.fail(batch, f"could not send to device {self.device_id!r}: {exc}")
        try:
            # shield: a timeout must not cancel the shared future, only stop waiting on it.
            return await asyncio.wait_for(asyncio.shield(batch.future), max(deadline - loop.time(), 0))
        except TimeoutError:
            correlator.discard(batch, "timed out")
            if batch.future.done():
                return batch.future.result()
            return failure_results(
                commands,
                f"timed out after {timeout:g} s waiting for device {self.device_id!r} "
                f"(response_id {batch.response_id})",
            )
        except asyncio.CancelledError:
            if self.cancel_reason is not None and not batch.future.done():
                await self._cancel_on_device(batch, self.cancel_reason)
            correlator.discard(batch, "cancelled")
            raise

    async def _cancel_on_device(self, batch: PendingBatch, reason: str) -> None:
        """Tell the device to stop ``batch``; wait for its answer, its loss, or ``cancel_timeout``."""
        frame = CancelFrame(response_id=batch.response_id, session_id=self.session_id, reason=reason)
        if batch.connection_id is not None:
            # gone: its batches are failed (now or after the grace), which the wait below sees
            with contextlib.suppress(DeviceUnavailable):
                await self.link.send_frame(self.device_id, batch.connection_id, frame)
        try:
            await asyncio.wait_for(asyncio.shield(batch.future), self.cancel_timeout)
        except TimeoutError:
            self.cancel_outcome = (
                f"device {self.device_id!r} did not acknowledge the cancel within {self.cancel_timeout:g} s; "
                "its commands may still be running"
            )
            return
        if self.link.correlator.closed_reason(batch.response_id) != "answered":
            # Failed rather than answered: the device disconnected, or refused the frame (an older device).
            self.cancel_outcome = f"device {self.device_id!r} went away or refused the cancel without acknowledging it"
