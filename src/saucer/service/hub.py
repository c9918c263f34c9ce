"""The server's registry of connections and devices, with liveness.

A connection is authenticated before it is accepted (its *principal* is the
name of its token) and registers once, as a ``device`` or a ``client``. A
device id is pinned durably to the principal that first registered it (or to
the owner the configuration names), and for the life of a connection the
device id is pinned to that connection: everything the connection says is
said by that device, and nothing else. Who else may see and use a device is
decided by :mod:`saucer.service.access` (:meth:`DeviceHub.visible`).

A device that sends nothing (heartbeats included) for ``heartbeat_interval *
missed_heartbeats`` seconds is marked offline, its connection is closed and
its pending commands fail at once (or after the dispatchers' reconnect grace).
A disconnect has the same effect immediately. A device speaking AIP (UFO's
protocol, which heartbeats every 120 s) has its own window,
``aip_heartbeat_interval * missed_heartbeats``, and a WebSocket ping or pong
from it counts as a sign of life as much as a frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel
from starlette.websockets import WebSocket

from saucer.dispatch.websocket import CommandCorrelator, DeviceUnavailable
from saucer.service.access import AccessPolicy
from saucer.service.protocol import (
    CommandResultsFrame,
    DeviceInfoRequestFrame,
    DeviceInfoResponseFrame,
    ErrorCode,
    ErrorFrame,
    ProtocolError,
    encode_frame,
    now,
)
from saucer.service.records import SessionRecordStore

_log = logging.getLogger("saucer.service.hub")

_connection_ids = itertools.count(1)

TRANSPORT_ALIVE_KEY = "saucer.transport_alive_at"
"""Key of a connection's ASGI scope where the server notes (loop time) the last WebSocket ping or pong it got."""


class Connection:
    """One accepted WebSocket, with the principal that opened it and, once registered, its role and id."""

    def __init__(self, websocket: WebSocket, principal: str, send_timeout: float) -> None:
        self.id = next(_connection_ids)
        self.websocket = websocket
        self.principal = principal
        self.role: Literal["device", "client"] | None = None
        self.client_id: str | None = None
        self.closed = False
        #: How this connection's frames are written and read when it does not speak saucer's protocol
        #: (an :class:`~saucer.service.aip_server.AipServerDialect`); None for saucer's own frames.
        self.dialect: Any = None
        #: Seconds of silence after which this connection's device is offline; None: the hub's window.
        self.liveness_window: float | None = None
        self._send_timeout = send_timeout

    def transport_alive_at(self) -> float:
        """Loop time of the last WebSocket ping or pong from this peer (0 if none was noted)."""
        value = self.websocket.scope.get(TRANSPORT_ALIVE_KEY)
        return float(value) if isinstance(value, (int, float)) else 0.0

    @property
    def protocol(self) -> str:
        """``saucer`` or the name of the connection's dialect (``aip``)."""
        return "saucer" if self.dialect is None else str(self.dialect.name)

    async def send(self, frame: BaseModel) -> None:
        """Send one frame; raise :class:`DeviceUnavailable` if the connection is gone or stuck."""
        if self.closed:
            raise DeviceUnavailable(f"connection {self.id} is closed")
        try:
            # Each ASGI send writes a whole frame with no await in between, so
            # concurrent senders never interleave and no lock is needed; the
            # timeout bounds a peer that stopped reading.
            text = encode_frame(frame) if self.dialect is None else self.dialect.encode(frame)
            await asyncio.wait_for(self.websocket.send_text(text), self._send_timeout)
        except Exception as exc:  # timeout, starlette's RuntimeError after close, uvicorn's ClientDisconnected
            raise DeviceUnavailable(f"connection {self.id}: {type(exc).__name__}: {exc}") from None

    async def send_error(self, code: str, message: str, ref: str | None = None) -> None:
        """Send an ``error`` frame, ignoring a connection that is already gone."""
        with contextlib.suppress(DeviceUnavailable):
            await self.send(ErrorFrame(code=code, message=message, ref=ref))

    async def close(self, code: int, reason: str) -> None:
        """Close the connection (best effort, bounded in time)."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.websocket.close(code=code, reason=reason[:120]), self._send_timeout)


@dataclass(eq=False)
class DeviceState:
    """What the server knows about one device id."""

    device_id: str
    owner: str
    connection: Connection | None = None
    info: dict[str, Any] = field(default_factory=dict)
    registered_at: float = 0.0
    last_seen_at: float = 0.0
    last_seen: float = 0.0  # loop time, for liveness
    offline_reason: str | None = None
    online_event: asyncio.Event = field(default_factory=asyncio.Event)
    grants: set[str] = field(default_factory=set)
    protocol: str = "saucer"

    @property
    def online(self) -> bool:
        """True while the device has a live connection."""
        return self.connection is not None

    def describe(self) -> dict[str, Any]:
        """JSON view for the HTTP API."""
        return {
            "device_id": self.device_id,
            "owner": self.owner,
            "online": self.online,
            "registered_at": self.registered_at,
            "last_seen_at": self.last_seen_at,
            "offline_reason": None if self.online else self.offline_reason,
            "protocol": self.protocol,
            "info": self.info,
        }

    def device_info(self) -> dict[str, Any]:
        """What the device reported about itself (its tool table left out), for a session's ``DEVICE_INFO``."""
        reported = {k: v for k, v in self.info.items() if k != "tools"}
        return {"device_id": self.device_id, "protocol": self.protocol, **reported}


class DeviceHub:
    """Devices, their connections and liveness; the :class:`~saucer.dispatch.websocket.DeviceLink` of the server."""

    def __init__(
        self,
        store: SessionRecordStore,
        *,
        heartbeat_interval: float,
        missed_heartbeats: int,
        send_timeout: float = 10.0,
        policy: AccessPolicy | None = None,
    ) -> None:
        self.store = store
        self.policy = policy or AccessPolicy()
        self.heartbeat_interval = heartbeat_interval
        self.missed_heartbeats = missed_heartbeats
        self.send_timeout = send_timeout
        self.correlator = CommandCorrelator()
        self.instance = uuid.uuid4().hex
        self._devices: dict[str, DeviceState] = {}
        self._info_waiters: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._online_listeners: list[Callable[[str], Awaitable[None]]] = []
        self._background: set[asyncio.Task[Any]] = set()

    @property
    def liveness_window(self) -> float:
        """Seconds of silence after which a device is declared offline."""
        return self.heartbeat_interval * self.missed_heartbeats

    def on_device_online(self, listener: Callable[[str], Awaitable[None]]) -> None:
        """Call ``listener(device_id)`` each time a device registers."""
        self._online_listeners.append(listener)

    # ------------------------------------------------------------------ DeviceLink

    async def wait_online(self, device_id: str, timeout: float) -> int | None:
        """The device's live connection id, waiting up to ``timeout`` seconds for one."""
        state = self._devices.get(device_id)
        if state is None:
            return None  # never registered: nothing to wait for
        if state.connection is None and timeout > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.online_event.wait(), timeout)
        return None if state.connection is None else state.connection.id

    async def send_frame(self, device_id: str, connection_id: int, frame: BaseModel) -> None:
        """Send ``frame`` to the device if ``connection_id`` is still its live connection."""
        state = self._devices.get(device_id)
        connection = None if state is None else state.connection
        if connection is None or connection.id != connection_id:
            raise DeviceUnavailable(f"device {device_id!r} disconnected")
        await connection.send(frame)

    # --------------------------------------------------------------- registration

    def get(self, device_id: str) -> DeviceState | None:
        """The device's state, or None if it never registered with this server."""
        return self._devices.get(device_id)

    def devices(self, principal: str) -> list[DeviceState]:
        """The devices known to this server process that ``principal`` may use, by id."""
        return [self._devices[k] for k in sorted(self._devices) if self.visible(k, principal) is not None]

    def visible(self, device_id: str, principal: str) -> DeviceState | None:
        """The device if ``principal`` may see and use it; None for an unknown id and for someone else's alike."""
        state = self._devices.get(device_id)
        if state is None or not self.policy.may_use(device_id, state.owner, principal, state.grants):
            return None
        return state

    async def grant(self, device_id: str, principal: str) -> None:
        """Share a known device with ``principal`` (durably)."""
        await self.store.grant_device(device_id, principal)
        self._devices[device_id].grants.add(principal)

    async def revoke(self, device_id: str, principal: str) -> bool:
        """Stop sharing a device with ``principal``; sessions already running on it go on."""
        self._devices[device_id].grants.discard(principal)
        return await self.store.revoke_device(device_id, principal)

    async def register_device(
        self, connection: Connection, device_id: str, info: dict[str, Any], inflight: set[str]
    ) -> DeviceState:
        """Bind ``device_id`` to ``connection``; refuse a device id pinned to another principal."""
        owner = self.policy.pinned_owner(device_id) or await self.store.claim_device(device_id, connection.principal)
        if owner != connection.principal:
            raise ProtocolError(ErrorCode.DEVICE_OWNED, f"device id {device_id!r} is registered to another token")
        state = self._devices.get(device_id)
        if state is None:
            state = self._devices[device_id] = DeviceState(device_id=device_id, owner=owner)
            state.grants = set(await self.store.device_grants(device_id))
        previous = state.connection
        connection.role, connection.client_id = "device", device_id
        state.connection = connection
        state.info = info
        state.protocol = connection.protocol
        state.registered_at = state.last_seen_at = now()
        state.last_seen = asyncio.get_running_loop().time()
        state.offline_reason = None
        state.online_event.set()
        # Batches the device still holds move to this connection; the others were lost with it.
        self.correlator.device_registered(device_id, connection.id, inflight)
        if previous is not None and previous is not connection:
            # The newer connection wins: the old one is most likely half-open after a network change.
            self._spawn(self._close_superseded(previous))
        return state

    def announce_online(self, device_id: str) -> None:
        """Tell the listeners (session resumption) that ``device_id`` registered and was told so."""
        for listener in self._online_listeners:
            self._spawn(listener(device_id))

    async def _close_superseded(self, connection: Connection) -> None:
        await connection.send_error(ErrorCode.SUPERSEDED, "a newer connection registered the same device id")
        await connection.close(4001, "superseded")

    def touch(self, connection: Connection) -> None:
        """Note that ``connection`` sent something: its device is alive."""
        if connection.role != "device" or connection.client_id is None:
            return
        state = self._devices.get(connection.client_id)
        if state is not None and state.connection is connection:
            state.last_seen = asyncio.get_running_loop().time()
            state.last_seen_at = now()

    def disconnected(self, connection: Connection, reason: str) -> None:
        """``connection`` is gone: mark its device offline and release its commands."""
        connection.closed = True
        if connection.role != "device" or connection.client_id is None:
            return
        state = self._devices.get(connection.client_id)
        if state is None or state.connection is not connection:
            return  # superseded earlier; the newer connection owns the device now
        self._mark_offline(state, reason)

    def _mark_offline(self, state: DeviceState, reason: str) -> None:
        connection = state.connection
        state.connection = None
        state.offline_reason = reason
        state.online_event.clear()
        if connection is not None:
            self.correlator.connection_lost(state.device_id, connection.id, f"device {state.device_id!r} {reason}")
        _log.info("device %s offline: %s", state.device_id, reason)

    # ------------------------------------------------------------------ frames in

    def accept_results(self, connection: Connection, frame: CommandResultsFrame) -> list[str]:
        """Hand a device's results to the waiting dispatcher; see :meth:`CommandCorrelator.resolve`."""
        assert connection.client_id is not None
        return self.correlator.resolve(connection.client_id, frame.session_id, frame.prev_response_id, frame.results)

    def accept_error(self, connection: Connection, frame: ErrorFrame) -> None:
        """A device refused one of our frames: if it names a pending batch of that device, fail it now."""
        if connection.role != "device" or frame.ref is None:
            return
        for batch in self.correlator.pending_for(connection.client_id or ""):
            if batch.response_id == frame.ref:
                self.correlator.fail(
                    batch, f"device {batch.device_id!r} refused the commands: {frame.code}: {frame.message}"
                )

    def accept_info(self, connection: Connection, frame: DeviceInfoResponseFrame) -> None:
        """A device answered a ``device_info_request``."""
        waiter = self._info_waiters.get(frame.request_id)
        if waiter is None or connection.role != "device":
            raise ProtocolError(ErrorCode.UNKNOWN_RESPONSE, f"no device_info_request {frame.request_id!r} is pending")
        state = self._devices.get(connection.client_id or "")
        if state is not None:
            state.info = frame.info
        if not waiter.done():
            waiter.set_result(frame.info)

    def update_info(self, connection: Connection, info: dict[str, Any]) -> None:
        """A device sent its description unasked (AIP's push): it replaces what it registered with."""
        state = self._devices.get(connection.client_id or "")
        if connection.role == "device" and state is not None and state.connection is connection:
            tools = state.info.get("tools")
            state.info = {**info, **({"tools": tools} if tools is not None and "tools" not in info else {})}

    async def request_info(self, device_id: str, timeout: float) -> dict[str, Any]:
        """Ask a live device for its description; raise :class:`DeviceUnavailable` or TimeoutError.

        An AIP device pushes its description when it registers (and whenever
        it changes) rather than being asked, so its latest one is the answer.
        """
        state = self._devices.get(device_id)
        if state is None or state.connection is None:
            raise DeviceUnavailable(f"device {device_id!r} is offline")
        if state.connection.dialect is not None:
            return state.info
        request_id = uuid.uuid4().hex
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._info_waiters[request_id] = waiter
        try:
            await state.connection.send(DeviceInfoRequestFrame(request_id=request_id, device_id=device_id))
            return await asyncio.wait_for(waiter, timeout)
        finally:
            self._info_waiters.pop(request_id, None)

    # ------------------------------------------------------------------- liveness

    async def run_liveness(self) -> None:
        """Forever: declare offline every device silent for longer than the liveness window."""
        period = min(self.heartbeat_interval / 2, 1.0)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(period)
            for state in list(self._devices.values()):
                connection = state.connection
                if connection is None:
                    continue
                window = connection.liveness_window or self.liveness_window
                last = state.last_seen
                if connection.dialect is not None:
                    # AIP devices heartbeat rarely: a WebSocket ping or pong from them counts too.
                    last = max(last, connection.transport_alive_at())
                if last < loop.time() - window:
                    reason = f"missed {self.missed_heartbeats} heartbeats ({window:g} s without a frame)"
                    self._mark_offline(state, reason)
                    self._spawn(self._close_dead(connection, reason))

    async def _close_dead(self, connection: Connection, reason: str) -> None:
        await connection.send_error(ErrorCode.HEARTBEAT_TIMEOUT, reason)
        await connection.close(4000, "heartbeat timeout")

    async def close_all(self, code: int, reason: str) -> None:
        """Close every device connection (server shutdown) and stop background work."""
        for state in self._devices.values():
            if state.connection is not None:
                connection = state.connection
                self._mark_offline(state, reason)
                await connection.close(code, reason)
        for task in list(self._background):
            task.cancel()

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run ``coro`` in the background until it ends or the hub closes (a failure is logged)."""
        self._spawn(coro)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_log_failure)


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        exc = task.exception()
        _log.warning("background task %s failed: %s: %s", task.get_name(), type(exc).__name__, exc)
