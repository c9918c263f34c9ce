"""The server's HTTP API and its WebSocket endpoint, over one :class:`~saucer.service.sessions.ServiceState`.

The routes are listed in :mod:`saucer.service.server`, which mounts them.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.websockets import WebSocket

from saucer.service.aip_server import AipServerDialect, InfoPush, TaskEndNotice, discover_tools, speaks_aip
from saucer.service.auth import query_token
from saucer.service.device_api import unknown_device_message
from saucer.service.http import error_response as _error
from saucer.service.http import float_param as _float_param
from saucer.service.http import json_response as _json
from saucer.service.http import unauthorized as _unauthorized
from saucer.service.hub import Connection
from saucer.service.protocol import (
    PROTOCOL_VERSION,
    CommandResultsFrame,
    DeviceInfoRequestFrame,
    DeviceInfoResponseFrame,
    ErrorCode,
    ErrorFrame,
    HeartbeatAckFrame,
    HeartbeatFrame,
    ProtocolError,
    RegisteredFrame,
    RegisterFrame,
    TaskAcceptedFrame,
    TaskFrame,
    TaskSpec,
    frame_size,
    parse_frame,
)
from saucer.service.records import SessionRecord, StepRecord
from saucer.service.sessions import ServiceState

__all__ = ["ServiceApi", "quiet_refused_handshakes"]

_log = logging.getLogger("saucer.service.server")

_MAX_LONG_POLL = 60.0

# Set in the task of a WebSocket whose handshake this app refused with a denial response.
_handshake_refused: contextvars.ContextVar[bool] = contextvars.ContextVar("saucer_handshake_refused", default=False)


class _RefusedHandshakeFilter(logging.Filter):
    """Drops uvicorn's "ASGI callable returned without completing handshake" after a deliberate refusal.

    uvicorn logs it as an ERROR even when the app answered the handshake with
    a complete denial response (401); the app logs its own one-line warning.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_handshake_refused.get() and "without completing handshake" in str(record.msg))


def quiet_refused_handshakes() -> None:
    """Keep uvicorn from logging an error for each handshake this app refused on purpose."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _RefusedHandshakeFilter) for f in logger.filters):
        logger.addFilter(_RefusedHandshakeFilter())


class _SubmitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device_id: str | None = Field(None, min_length=1)
    task: TaskSpec
    #: Run it on saucer worker processes (the store's queue, their own tools) instead of a device; admins only.
    queue: bool = False


_HTTP_STATUS = {
    ErrorCode.UNKNOWN_DEVICE: 404,
    ErrorCode.DEVICE_OFFLINE: 409,
    ErrorCode.INVALID_TASK: 422,
    ErrorCode.SHUTTING_DOWN: 503,
}


class ServiceApi:
    """HTTP handlers and the WebSocket endpoint over one :class:`ServiceState`."""

    def __init__(self, state: ServiceState) -> None:
        self.state = state

    def _principal(self, request: Request) -> str | None:
        return self.state.auth.from_header(request.headers.get("authorization"))

    # ------------------------------------------------------------------ HTTP

    async def health(self, request: Request) -> Response:
        """Unauthenticated: is the server up, and which protocol does it speak."""
        return _json({"status": "ok", "protocol_version": PROTOCOL_VERSION, "instance": self.state.hub.instance})

    async def submit(self, request: Request) -> Response:
        """Create a session running a task on a device; the caller owns it."""
        principal = self._principal(request)
        if principal is None:
            return _unauthorized()
        limit = self.state.config.max_frame_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return _error(413, ErrorCode.FRAME_TOO_LARGE, f"request body exceeds {limit} bytes")
        body = await request.body()
        if frame_size(body) > limit:
            return _error(413, ErrorCode.FRAME_TOO_LARGE, f"request body exceeds {limit} bytes")
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return _error(400, ErrorCode.MALFORMED_JSON, f"body is not valid JSON: {exc}")
        if isinstance(data, dict) and "session_id" in data:
            return _error(422, ErrorCode.INVALID_TASK, "session ids are assigned by the server; do not send one")
        try:
            submit = _SubmitRequest.model_validate(data)
        except ValidationError as exc:
            return _error(422, ErrorCode.INVALID_TASK, _validation_message(exc))
        if submit.queue:
            return await _enqueue(self.state.config, principal, submit)
        if submit.device_id is None:
            return _error(422, ErrorCode.INVALID_TASK, "device_id: name the device to run the task on (or queue: true)")
        try:
            record = await self.state.sessions.submit(principal, submit.device_id, submit.task)
        except ProtocolError as exc:
            return _error(_HTTP_STATUS.get(exc.code, 400), exc.code, exc.message)
        return _json(_summary(record), 201, {"Location": f"/api/sessions/{record.session_id}"})

    async def list_sessions(self, request: Request) -> Response:
        """The sessions the caller sees (its own, those its tasks' participants name it in; an admin: all), oldest first."""
        principal = self._principal(request)
        if principal is None:
            return _unauthorized()
        records = await self.state.sessions.visible(principal)
        return _json({"sessions": [_summary(r) for r in records]})

    async def _own_session(self, request: Request) -> tuple[str, str, SessionRecord] | Response:
        """The caller, the path's session id and the caller's record of it; or the 401 or 404 to answer."""
        principal = self._principal(request)
        if principal is None:
            return _unauthorized()
        session_id = request.path_params["session_id"]
        record = await self.state.sessions.lookup(session_id, principal)
        return _not_found(session_id) if record is None else (principal, session_id, record)

    async def get_session(self, request: Request) -> Response:
        """Status, committed steps and outcome of one of the caller's sessions."""
        owned = await self._own_session(request)
        if isinstance(owned, Response):
            return owned
        principal, session_id, record = owned
        wait = _float_param(request, "wait", 0.0, _MAX_LONG_POLL)
        steps: list[StepRecord] | None = None
        if wait > 0 and not record.status.terminal:
            # The record of a session that ended meanwhile is the one its end wrote, and its steps the ones
            # its run committed, when that run was its only one (no read of the store).
            ended = await self.state.sessions.wait_ended(session_id, wait)
            if ended is not None:
                record, steps = ended.record, ended.final_steps
            else:
                record = await self.state.sessions.lookup(session_id, principal) or record
        if steps is None:
            steps = await self.state.store.steps(session_id)
        return _json({"session": record.model_dump(mode="json"), "steps": [s.model_dump(mode="json") for s in steps]})

    async def get_results(self, request: Request) -> Response:
        """Status and results of one of the caller's sessions."""
        owned = await self._own_session(request)
        if isinstance(owned, Response):
            return owned
        _, session_id, record = owned
        return _json(
            {"session_id": session_id, "status": record.status.value, "results": record.results, "error": record.error}
        )

    async def cancel(self, request: Request) -> Response:
        """Cancel a session the caller sees; the cancel is recorded with the caller as its author."""
        owned = await self._own_session(request)
        if isinstance(owned, Response):
            return owned
        principal, session_id, before = owned
        if before.status.terminal:
            return _error(409, "session_ended", f"session {session_id} already ended as {before.status.value}")
        record = await self.state.sessions.cancel(session_id, principal)
        assert record is not None
        return _json(_summary(record))

    # ------------------------------------------------------------- WebSocket

    async def websocket(self, websocket: WebSocket) -> None:
        """One device or client connection: authenticate, register, then serve frames until it goes."""
        config = self.state.config
        auth = self.state.auth
        # UFO's clients cannot set a header: they send the token as ?token= (taken out of the logged URL).
        principal = auth.from_header(websocket.headers.get("authorization")) or auth.principal(
            query_token(websocket.scope)
        )
        if principal is None:
            # Refused at the handshake with a readable body, before any frame is accepted.
            _handshake_refused.set(True)
            peer = f"{websocket.client.host}:{websocket.client.port}" if websocket.client else "an unknown peer"
            _log.warning("refused a WebSocket connection from %s: missing or invalid bearer token", peer)
            await websocket.send_denial_response(_error(401, ErrorCode.UNAUTHORIZED, "missing or invalid bearer token"))
            return
        await websocket.accept()
        connection = Connection(websocket, principal, config.send_timeout)
        reason = "disconnected"
        try:
            while not connection.closed:
                timeout = None if connection.role else config.register_timeout
                try:
                    message = await asyncio.wait_for(websocket.receive(), timeout)
                except TimeoutError:
                    reason = "did not register in time"
                    await connection.send_error(ErrorCode.NOT_REGISTERED, f"no register frame within {timeout:g} s")
                    await connection.close(1008, "not registered")
                    break
                if message["type"] == "websocket.disconnect":
                    reason = f"disconnected (close code {message.get('code')})"
                    break
                data = message.get("text")
                if data is None:
                    data = message.get("bytes") or b""
                # Any frame, even a bad one, proves the peer is alive.
                self.state.hub.touch(connection)
                try:
                    await self._handle(connection, self._decode(connection, data))
                except ProtocolError as exc:
                    await connection.send_error(exc.code, exc.message, exc.ref)
                    if exc.code == ErrorCode.DEVICE_OWNED:
                        reason = "refused: device id owned by another token"
                        await connection.close(1008, "device id owned by another token")
        except Exception as exc:  # a dead peer, mostly: one line, not a traceback
            _log.warning(
                "connection %d (%s) failed: %s: %s", connection.id, connection.client_id, type(exc).__name__, exc
            )
            reason = "server error on the connection"
        finally:
            self.state.hub.disconnected(connection, reason)

    def _decode(self, connection: Connection, data: bytes | str) -> Any:
        """The frame ``data`` carries, in the connection's dialect (decided by its first message)."""
        limit = self.state.config.max_frame_bytes
        if connection.dialect is None and connection.role is None and speaks_aip(data, limit):
            parameters = {
                device: {name: secret.get_secret_value() for name, secret in params.items()}
                for device, params in self.state.config.aip_parameters.items()
            }
            connection.dialect = AipServerDialect(
                heartbeat_interval=self.state.config.aip_heartbeat_interval,
                session_of=self.state.hub.correlator.session_of,
                parameters=parameters,
            )
        if connection.dialect is not None:
            return connection.dialect.decode(data, limit)
        return parse_frame(data, max_bytes=limit)

    async def _handle(self, connection: Connection, frame: Any) -> None:
        hub = self.state.hub
        if isinstance(frame, InfoPush) and connection.role is not None:
            hub.update_info(connection, frame.info)
            return
        if isinstance(frame, TaskEndNotice) and connection.role is not None:
            _log.debug(
                "%s %s: task_end %s for session %s",
                connection.role,
                connection.client_id,
                frame.status,
                frame.session_id,
            )
            return
        if isinstance(frame, RegisterFrame):
            await self._register(connection, frame)
            return
        if connection.role is None:
            raise ProtocolError(ErrorCode.NOT_REGISTERED, f"send a register frame before {frame.type!r}")
        if isinstance(frame, HeartbeatFrame):
            await connection.send(HeartbeatAckFrame(sent_at=frame.sent_at))
        elif isinstance(frame, CommandResultsFrame):
            if connection.role != "device":
                raise ProtocolError(
                    ErrorCode.UNEXPECTED_FRAME, "only devices send command_results", frame.prev_response_id
                )
            problems = hub.accept_results(connection, frame)
            if problems:
                await connection.send_error(ErrorCode.RESULTS_MISMATCH, "; ".join(problems), frame.prev_response_id)
        elif isinstance(frame, TaskFrame):
            await self._task(connection, frame)
        elif isinstance(frame, DeviceInfoRequestFrame):
            device_id = frame.device_id or connection.client_id or ""
            device = hub.visible(device_id, connection.principal)
            if device is None:
                raise ProtocolError(ErrorCode.UNKNOWN_DEVICE, unknown_device_message(device_id), frame.request_id)
            await connection.send(
                DeviceInfoResponseFrame(request_id=frame.request_id, device_id=device.device_id, info=device.describe())
            )
        elif isinstance(frame, DeviceInfoResponseFrame):
            hub.accept_info(connection, frame)
        elif isinstance(frame, ErrorFrame):
            _log.warning("%s %s reported %s: %s", connection.role, connection.client_id, frame.code, frame.message)
            hub.accept_error(connection, frame)
        else:
            raise ProtocolError(ErrorCode.UNEXPECTED_FRAME, f"{frame.type!r} frames are sent by the server, not to it")

    async def _register(self, connection: Connection, frame: RegisterFrame) -> None:
        if connection.role is not None:
            raise ProtocolError(ErrorCode.ALREADY_REGISTERED, f"this connection is already {connection.client_id!r}")
        hub = self.state.hub
        if frame.role == "device":
            await hub.register_device(connection, frame.client_id, frame.info, set(frame.inflight))
        else:
            connection.role, connection.client_id = "client", frame.client_id
        await connection.send(
            RegisteredFrame(
                client_id=frame.client_id,
                role=frame.role,
                server_instance=hub.instance,
                heartbeat_interval=hub.heartbeat_interval,
                max_frame_bytes=self.state.config.max_frame_bytes,
            )
        )
        if frame.role == "device":
            # Only after "registered" is out: resumed sessions may send commands right away.
            hub.announce_online(frame.client_id)
            if connection.dialect is not None:
                # AIP's devices heartbeat every 120 s (WebSocket pings find dead peers sooner), and list
                # their tools only when asked (a UFO device may first start its MCP servers: a step's time).
                connection.liveness_window = self.state.config.aip_liveness_window
                hub.spawn(discover_tools(hub, frame.client_id, connection, self.state.config.step_timeout))

    async def _task(self, connection: Connection, frame: TaskFrame) -> None:
        target = frame.target_device_id or (connection.client_id if connection.role == "device" else None)
        if target is None:
            raise ProtocolError(ErrorCode.INVALID_TASK, "a client must name target_device_id", frame.request_id)
        try:
            record = await self.state.sessions.submit(connection.principal, target, frame.task, submitter=connection)
        except ProtocolError as exc:
            raise ProtocolError(exc.code, exc.message, frame.request_id) from None
        await connection.send(
            TaskAcceptedFrame(session_id=record.session_id, device_id=target, request_id=frame.request_id)
        )


def _not_found(session_id: str) -> Response:
    # Same answer for "never existed" and "someone else's": ids are not an oracle.
    return _error(404, "unknown_session", f"no session {session_id!r} for this token")


async def _enqueue(config: Any, principal: str, submit: _SubmitRequest) -> Response:
    """``"queue": true``: the task goes on the store's queue; workers run it with their own tools, so only admins may."""
    from saucer.config import load_settings
    from saucer.queue import QueueUnavailableError
    from saucer.queue.client import enqueue_task

    if principal not in config.admins:
        return _error(403, ErrorCode.UNAUTHORIZED, "only service admins may queue tasks for saucer worker processes")
    try:
        task = submit.task.submitted_by(principal).model_dump(mode="json")
        done = await enqueue_task(load_settings(overrides={"store.url": config.event_store_url}), task, user=principal)
    except QueueUnavailableError as exc:
        return _error(409, ErrorCode.INVALID_TASK, str(exc))
    return _json({"session_id": done.spec.session_id, "queued": done.outcome != "skipped", "job_id": done.job_id}, 202)


def _summary(record: SessionRecord) -> dict[str, Any]:
    return {
        "session_id": record.session_id,
        "device_id": record.device_id,
        "status": record.status.value,
        "task": record.task.task,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "attempts": record.attempts,
        "error": record.error,
    }


def _validation_message(exc: ValidationError) -> str:
    parts = [f"{'.'.join(str(p) for p in e['loc']) or '<body>'}: {e['msg']}" for e in exc.errors(include_url=False)[:5]]
    return "; ".join(parts)
