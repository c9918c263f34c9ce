"""Service mode server: sessions run here, commands run on devices connected over WebSocket.

One Starlette app on one port serves the device/client WebSocket (``/ws``)
and a small HTTP API; :func:`serve` runs it with uvicorn (the CLI's ``saucer
serve``), :func:`create_app` builds it for embedding, :func:`running_server`
runs it inside the current event loop (tests, benchmarks).

HTTP API (``Authorization: Bearer <token>`` on everything but ``/health``)::

    GET  /health                          liveness of the server itself
    GET  /api/devices[/{id}[/info]]       devices this token may use (see :mod:`saucer.service.device_api`)
    PUT|DELETE /api/devices/{id}/grants/{principal}   share a device (its owner, an admin)
    POST /api/sessions                    {"device_id", "task": TaskSpec} -> 201 {"session_id", ...}
    GET  /api/sessions                    the caller's sessions
    GET  /api/sessions/{id}?wait=S        status, committed steps, outcome (long-poll up to S s)
    GET  /api/sessions/{id}/results       status and results only
    POST /api/sessions/{id}/cancel        cancel a session that has not ended

A session belongs to the principal (token name) that submitted it; another
principal gets 404 for it, as for an id that never existed. A device belongs
to the principal that registered it and is usable only by it, by the
principals it is shared with and by admins (:mod:`saucer.service.access`);
others get 404 for it too. Sessions are
durable records (:mod:`saucer.service.records`): they never vanish, their
results stay readable after they end, and after a crash or restart every
session that had not ended waits for its device and resumes from its last
committed step (see :mod:`saucer.service.runner` for the runner seam).

By default each session runs as a saucer engine session whose Context lives
in the event store ``config.event_store_url`` under the same session id
(:mod:`saucer.service.engine_runner`): ``saucer show SESSION --store URL``
prints its timeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ipaddress
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import uvicorn
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from saucer.dispatch.toolcheck import command_problem
from saucer.dispatch.websocket import DeviceUnavailable, WebSocketCommandDispatcher
from saucer.service.access import AccessPolicy, DeviceAccess
from saucer.service.auth import TokenAuthenticator, tokens_from_env
from saucer.service.device_api import DeviceRoutes, unknown_device_message
from saucer.service.http import error_response as _error
from saucer.service.http import float_param as _float_param
from saucer.service.http import json_response as _json
from saucer.service.http import unauthorized as _unauthorized
from saucer.service.hub import Connection, DeviceHub
from saucer.service.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
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
    TaskEndFrame,
    TaskFrame,
    TaskSpec,
    frame_size,
    parse_frame,
)
from saucer.service.records import (
    MemorySessionRecordStore,
    SessionRecord,
    SessionRecordStore,
    SessionStatus,
    SqliteSessionRecordStore,
)
from saucer.service.runner import (
    DEFAULT_STEP_TIMEOUT,
    StoreSessionRecorder,
    TaskOutcome,
    TaskRunner,
)

_log = logging.getLogger("saucer.service.server")

WEBSOCKET_PATH = "/ws"
"""Path of the WebSocket endpoint for devices and clients."""

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


def _quiet_refused_handshakes() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _RefusedHandshakeFilter) for f in logger.filters):
        logger.addFilter(_RefusedHandshakeFilter())


class ServiceConfig(BaseModel):
    """Settings of the service server; :meth:`from_env` fills ``tokens`` from ``SAUCER_SERVICE_TOKENS``."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    tokens: dict[str, SecretStr] = Field(default_factory=dict, description="principal name -> bearer token")
    devices: dict[str, DeviceAccess] = Field(
        default_factory=dict, description="device id -> who may register it and who it is shared with"
    )
    admins: list[str] = Field(default_factory=list, description="principals that see and use every device")
    state_dir: Path | None = Field(default=Path(".saucer/service"), description="None keeps sessions in memory only")
    store_url: str | None = Field(
        default=None,
        description="event store of the sessions' Contexts (default: sqlite:///<state_dir>/saucer.db, memory:// without a state dir)",
    )
    heartbeat_interval: float = Field(default=10.0, gt=0, description="seconds between device heartbeats")
    missed_heartbeats: int = Field(default=3, ge=1, description="silent intervals before a device is offline")
    reconnect_grace: float = Field(default=0.0, ge=0, description="seconds pending commands wait for a lost device")
    step_timeout: float = Field(default=DEFAULT_STEP_TIMEOUT, gt=0, description="default seconds per command batch")
    cancel_timeout: float = Field(default=10.0, gt=0, description="seconds a cancel waits for the device's acknowledgement")
    max_frame_bytes: int = Field(default=DEFAULT_MAX_FRAME_BYTES, ge=1024, description="larger frames get an error")
    register_timeout: float = Field(default=10.0, gt=0, description="seconds a new connection has to register")
    send_timeout: float = Field(default=10.0, gt=0, description="seconds a frame may take to leave")
    compression: bool = Field(default=False, description="permessage-deflate on the WebSocket")
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    log_level: str = "info"

    @model_validator(mode="after")
    def _tls_pair(self) -> "ServiceConfig":
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile must be given together")
        return self

    @classmethod
    def from_env(cls, **settings: Any) -> "ServiceConfig":
        """Build a config from ``settings``, taking tokens from the environment when none are given."""
        if not settings.get("tokens"):
            settings["tokens"] = tokens_from_env()
        return cls(**settings)

    @property
    def event_store_url(self) -> str:
        """Where the default (engine) runner keeps the sessions' Contexts."""
        if self.store_url:
            return self.store_url
        if self.state_dir is None:
            return "memory://"
        return f"sqlite:///{Path(self.state_dir).resolve() / 'saucer.db'}"

    @property
    def transport_max_frame_bytes(self) -> int:
        """Frames above this size are not even buffered: the connection closes with code 1009."""
        return self.max_frame_bytes * 4

    @property
    def tls(self) -> bool:
        """True when the server speaks TLS (https / wss)."""
        return self.ssl_certfile is not None


class ServiceSession:
    """A running (or waiting) session: its latest record, its task, and who to tell when it ends."""

    def __init__(self, record: SessionRecord, submitter: Connection | None = None) -> None:
        self.record = record
        self.submitter = submitter
        self.task: asyncio.Task[None] | None = None
        self.done = asyncio.Event()
        self.cancel_requested = False
        self.dispatcher: WebSocketCommandDispatcher | None = None

    @property
    def session_id(self) -> str:
        """The session's id."""
        return self.record.session_id


class SessionManager:
    """Creates, runs, resumes, cancels and looks up sessions; records everything in the store."""

    def __init__(self, store: SessionRecordStore, hub: DeviceHub, runner: TaskRunner, config: ServiceConfig) -> None:
        self.store = store
        self.hub = hub
        self.runner = runner
        self.config = config
        self._active: dict[str, ServiceSession] = {}
        self._closing = False
        hub.on_device_online(self._device_online)

    async def rehydrate(self) -> int:
        """Load every session that had not ended; each resumes when its device registers."""
        records = await self.store.list_sessions(active_only=True)
        for record in records:
            record = await self.store.update_session(record.session_id, status=SessionStatus.WAITING_DEVICE)
            self._active[record.session_id] = ServiceSession(record)
        if records:
            _log.info("rehydrated %d unfinished sessions; they resume when their devices reconnect", len(records))
        return len(records)

    async def submit(
        self, owner: str, device_id: str, task: TaskSpec, submitter: Connection | None = None
    ) -> SessionRecord:
        """Start ``task`` on ``device_id`` for ``owner``; raise :class:`ProtocolError` if it cannot start."""
        if self._closing:
            raise ProtocolError(ErrorCode.SHUTTING_DOWN, "the server is shutting down; submit again after it restarts")
        validate = getattr(self.runner, "validate", None)
        if validate is not None:
            try:
                validate(task)
            except ValueError as exc:
                raise ProtocolError(ErrorCode.INVALID_TASK, str(exc)) from None
        device = self.hub.visible(device_id, owner)
        if device is None:
            raise ProtocolError(ErrorCode.UNKNOWN_DEVICE, unknown_device_message(device_id))
        if not device.online:
            raise ProtocolError(ErrorCode.DEVICE_OFFLINE, f"device {device_id!r} is offline: {device.offline_reason}")
        problem = _tool_problem(task, getattr(device, "info", {}).get("tools"))
        if problem is not None:
            raise ProtocolError(ErrorCode.INVALID_TASK, f"{problem} (tools of device {device_id!r})")
        record = SessionRecord(session_id=uuid.uuid4().hex, owner=owner, device_id=device_id, task=task)
        await self.store.create_session(record)
        session = ServiceSession(record, submitter)
        self._active[record.session_id] = session
        self._start(session)
        return record

    async def lookup(self, session_id: str, principal: str) -> SessionRecord | None:
        """The session if ``principal`` owns it; None otherwise (whether or not it exists)."""
        session = self._active.get(session_id)
        record = session.record if session is not None else await self.store.get_session(session_id)
        if record is None or record.owner != principal:
            return None
        return record

    async def wait(self, session_id: str, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for an active session to end."""
        session = self._active.get(session_id)
        if session is not None and timeout > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(session.done.wait(), timeout)

    async def cancel(self, session_id: str, principal: str) -> SessionRecord | None:
        """Cancel the caller's session; return its record (unchanged if it had already ended)."""
        if await self.lookup(session_id, principal) is None:
            return None
        session = self._active.get(session_id)
        if session is None:
            return await self.store.get_session(session_id)
        session.cancel_requested = True
        if session.dispatcher is not None:
            # The runner unwinds only after the device has stopped the batch in flight (or is gone).
            session.dispatcher.cancel_reason = "cancelled by its owner"
        if session.task is not None and not session.task.done():
            session.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(session.done.wait())
        elif not session.done.is_set():
            await self._finish(session, TaskOutcome(status="cancelled", error="cancelled by its owner"))
        return session.record

    def begin_shutdown(self) -> None:
        """Stop every runner now, before connections close, so no session ends because of the shutdown.

        Their records stay active (``running``) and resume after the restart;
        new submissions are refused from here on.
        """
        self._closing = True
        for session in self._active.values():
            if session.task is not None and not session.task.done():
                session.task.cancel()

    async def close(self) -> None:
        """Stop running sessions without ending them and wait for their runners to unwind."""
        self.begin_shutdown()
        tasks = [s.task for s in self._active.values() if s.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    def _start(self, session: ServiceSession) -> None:
        if self._closing:
            return
        if session.task is None or session.task.done():
            session.task = asyncio.create_task(self._run(session), name=f"session-{session.session_id}")

    async def _device_online(self, device_id: str) -> None:
        for session in list(self._active.values()):
            if session.record.device_id == device_id and session.record.status == SessionStatus.WAITING_DEVICE:
                self._start(session)

    async def _run(self, session: ServiceSession) -> None:
        sid = session.session_id
        recorder = StoreSessionRecorder(self.store, sid)
        resumed_from: int | None = None
        if session.record.attempts > 0:
            sync = getattr(self.runner, "sync_steps", None)
            if sync is not None:
                # The runner's own log may be ahead of the step records (a crash between the two).
                try:
                    await sync(sid, recorder)
                except Exception:
                    _log.exception("could not bring the step records of session %s up to date", sid)
            resumed_from = len(await self.store.steps(sid))
        session.record = await self.store.update_session(
            sid,
            status=SessionStatus.RUNNING,
            attempts=session.record.attempts + 1,
            resumed_from_step=resumed_from if resumed_from is not None else session.record.resumed_from_step,
        )
        dispatcher = WebSocketCommandDispatcher(
            self.hub,
            session.record.device_id,
            sid,
            reconnect_grace=self.config.reconnect_grace,
            default_timeout=self.config.step_timeout,
            cancel_timeout=self.config.cancel_timeout,
        )
        session.dispatcher = dispatcher
        try:
            outcome = await self.runner.run(sid, session.record.task, dispatcher, recorder)
        except asyncio.CancelledError:
            if not session.cancel_requested:
                raise  # server shutdown: the record stays "running" and resumes after restart
            note = f"; {dispatcher.cancel_outcome}" if dispatcher.cancel_outcome else ""
            outcome = TaskOutcome(status="cancelled", error=f"cancelled by its owner{note}")
        except Exception as exc:
            _log.exception("runner failed for session %s", sid)
            outcome = TaskOutcome(status="failed", error=f"runner error: {type(exc).__name__}: {exc}")
        await self._finish(session, outcome)

    async def _finish(self, session: ServiceSession, outcome: TaskOutcome) -> None:
        results = outcome.results
        if outcome.status == "cancelled" and not results:
            results = [s.model_dump(mode="json") for s in await self.store.steps(session.session_id)]
        record_end = getattr(self.runner, "record_end", None)
        if record_end is not None:
            # The runner's log first (it is what a resume reads), then the record.
            try:
                await record_end(session.session_id, outcome)
            except Exception:
                _log.exception("could not record the end of session %s in the runner's store", session.session_id)
        session.record = await self.store.update_session(
            session.session_id, status=SessionStatus(outcome.status), error=outcome.error, results=results
        )
        self._active.pop(session.session_id, None)
        session.done.set()
        submitter = session.submitter
        if submitter is not None and not submitter.closed:
            frame = TaskEndFrame(
                session_id=session.session_id, status=outcome.status, results=results, error=outcome.error
            )
            with contextlib.suppress(DeviceUnavailable):
                await submitter.send(frame)


@dataclass
class ServiceState:
    """Everything the app serves from; reachable as ``app.state.service``."""

    config: ServiceConfig
    store: SessionRecordStore
    hub: DeviceHub
    sessions: SessionManager
    auth: TokenAuthenticator


class _SubmitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device_id: str = Field(min_length=1)
    task: TaskSpec


def create_app(
    config: ServiceConfig, *, runner: TaskRunner | None = None, store: SessionRecordStore | None = None
) -> Starlette:
    """Build the service app: WebSocket endpoint, HTTP API, liveness monitor, session rehydration.

    ``runner`` defaults to :class:`~saucer.service.engine_runner.EngineTaskRunner`
    over ``config.event_store_url`` (closed with the app);
    ``store`` (the session records) to SQLite under ``config.state_dir``
    (memory if that is None).
    """
    auth = TokenAuthenticator({name: secret.get_secret_value() for name, secret in config.tokens.items()})
    _quiet_refused_handshakes()
    policy = AccessPolicy(config.devices, config.admins)
    policy.check_principals(config.tokens)
    owns_store = store is None
    if store is None:
        store = (
            MemorySessionRecordStore()
            if config.state_dir is None
            else SqliteSessionRecordStore(Path(config.state_dir) / "sessions.sqlite3")
        )
    hub = DeviceHub(
        store,
        heartbeat_interval=config.heartbeat_interval,
        missed_heartbeats=config.missed_heartbeats,
        send_timeout=config.send_timeout,
        policy=policy,
    )
    owns_runner = runner is None
    if runner is None:
        from saucer.service.engine_runner import EngineTaskRunner

        runner = EngineTaskRunner.for_service(
            config.state_dir, config.event_store_url, default_step_timeout=config.step_timeout
        )
    sessions = SessionManager(store, hub, runner, config)
    state = ServiceState(config=config, store=store, hub=hub, sessions=sessions, auth=auth)
    api = _Api(state)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await sessions.rehydrate()
        liveness = asyncio.create_task(hub.run_liveness(), name="saucer-liveness")
        try:
            yield
        finally:
            liveness.cancel()
            await sessions.close()
            await hub.close_all(1012, "server shutting down")
            if owns_store:
                await store.close()
            closer = getattr(runner, "close", None)
            if owns_runner and closer is not None:
                await closer()

    app = Starlette(
        routes=[
            Route("/health", api.health, methods=["GET"]),
            *DeviceRoutes(hub, auth, config.tokens).routes(),
            Route("/api/sessions", api.list_sessions, methods=["GET"]),
            Route("/api/sessions", api.submit, methods=["POST"]),
            Route("/api/sessions/{session_id}", api.get_session, methods=["GET"]),
            Route("/api/sessions/{session_id}/results", api.get_results, methods=["GET"]),
            Route("/api/sessions/{session_id}/cancel", api.cancel, methods=["POST"]),
            WebSocketRoute(WEBSOCKET_PATH, api.websocket),
        ],
        lifespan=lifespan,
    )
    app.state.service = state
    return app


_HTTP_STATUS = {
    ErrorCode.UNKNOWN_DEVICE: 404,
    ErrorCode.DEVICE_OFFLINE: 409,
    ErrorCode.INVALID_TASK: 422,
    ErrorCode.SHUTTING_DOWN: 503,
}


class _Api:
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
        try:
            record = await self.state.sessions.submit(principal, submit.device_id, submit.task)
        except ProtocolError as exc:
            return _error(_HTTP_STATUS.get(exc.code, 400), exc.code, exc.message)
        return _json(_summary(record), 201, {"Location": f"/api/sessions/{record.session_id}"})

    async def list_sessions(self, request: Request) -> Response:
        """The caller's sessions, oldest first."""
        principal = self._principal(request)
        if principal is None:
            return _unauthorized()
        records = await self.state.store.list_sessions(owner=principal)
        return _json({"sessions": [_summary(r) for r in records]})

    async def get_session(self, request: Request) -> Response:
        """Status, committed steps and outcome of one of the caller's sessions."""
        principal = self._principal(request)
        if principal is None:
            return _unauthorized()
        session_id = request.path_params["session_id"]
        record = await self.state.sessions.lookup(session_id, principal)
        if record is None:
            return _not_found(session_id)
        wait = _float_param(request, "wait", 0.0, _MAX_LONG_POLL)
        if wait > 0 and not record.status.terminal:
            await self.state.sessions.wait(session_id, wait)
            record = await self.state.sessions.lookup(session_id, principal) or record
        steps = await self.state.store.steps(session_id)
        return _json({"session": record.model_dump(mode="json"), "steps": [s.model_dump(mode="json") for s in steps]})

    async def get_results(self, request: Request) -> Response:
        """Status and results of one of the caller's sessions."""
        principal = self._principal(request)
        if principal is None:
            return _unauthorized()
        session_id = request.path_params["session_id"]
        record = await self.state.sessions.lookup(session_id, principal)
        if record is None:
            return _not_found(session_id)
        return _json(
            {"session_id": session_id, "status": record.status.value, "results": record.results, "error": record.error}
        )

    async def cancel(self, request: Request) -> Response:
        """Cancel one of the caller's sessions."""
        principal = self._principal(request)
        if principal is None:
            return _unauthorized()
        session_id = request.path_params["session_id"]
        before = await self.state.sessions.lookup(session_id, principal)
        if before is None:
            return _not_found(session_id)
        if before.status.terminal:
            return _error(409, "session_ended", f"session {session_id} already ended as {before.status.value}")
        record = await self.state.sessions.cancel(session_id, principal)
        assert record is not None
        return _json(_summary(record))

    # ------------------------------------------------------------- WebSocket

    async def websocket(self, websocket: WebSocket) -> None:
        """One device or client connection: authenticate, register, then serve frames until it goes."""
        config = self.state.config
        principal = self.state.auth.from_header(websocket.headers.get("authorization"))
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
                    await self._handle(connection, parse_frame(data, max_bytes=config.max_frame_bytes))
                except ProtocolError as exc:
                    await connection.send_error(exc.code, exc.message, exc.ref)
                    if exc.code == ErrorCode.DEVICE_OWNED:
                        reason = "refused: device id owned by another token"
                        await connection.close(1008, "device id owned by another token")
        except Exception as exc:  # a dead peer, mostly: one line, not a traceback
            _log.warning("connection %d (%s) failed: %s: %s", connection.id, connection.client_id, type(exc).__name__, exc)
            reason = "server error on the connection"
        finally:
            self.state.hub.disconnected(connection, reason)

    async def _handle(self, connection: Connection, frame: Any) -> None:
        hub = self.state.hub
        if isinstance(frame, RegisterFrame):
            await self._register(connection, frame)
            return
        if connection.role is None:
            raise ProtocolError(ErrorCode.NOT_REGISTERED, f"send a register frame before {frame.type!r}")
        if isinstance(frame, HeartbeatFrame):
            await connection.send(HeartbeatAckFrame(sent_at=frame.sent_at))
        elif isinstance(frame, CommandResultsFrame):
            if connection.role != "device":
                raise ProtocolError(ErrorCode.UNEXPECTED_FRAME, "only devices send command_results", frame.prev_response_id)
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


def _tool_problem(task: TaskSpec, tools: Any) -> str | None:
    """The first command of ``task`` the device's tools cannot run, or None (also when it sent no tool list)."""
    if not isinstance(tools, dict):
        return None
    for i, step in enumerate(task.steps):
        for j, command in enumerate(step.commands):
            problem = command_problem(command.tool_name, command.parameters, tools)
            if problem is not None:
                return f"task.steps.{i}.commands.{j}: {problem}"
    return None


def _validation_message(exc: ValidationError) -> str:
    parts = [
        f"{'.'.join(str(p) for p in e['loc']) or '<body>'}: {e['msg']}" for e in exc.errors(include_url=False)[:5]
    ]
    return "; ".join(parts)


def _uvicorn_config(app: Starlette, config: ServiceConfig, **overrides: Any) -> uvicorn.Config:
    settings: dict[str, Any] = dict(
        host=config.host,
        port=config.port,
        ssl_certfile=str(config.ssl_certfile) if config.ssl_certfile else None,
        ssl_keyfile=str(config.ssl_keyfile) if config.ssl_keyfile else None,
        ws_max_size=config.transport_max_frame_bytes,
        # Devices prove they are alive with protocol heartbeats; clients send nothing while they wait for a
        # task_end, so WebSocket pings find the dead ones. The pong timeout is longer than the heartbeat
        # window, so a silent device is declared offline by the heartbeat check first, with its reason.
        ws_ping_interval=config.heartbeat_interval,
        ws_ping_timeout=config.heartbeat_interval * (config.missed_heartbeats + 1),
        ws_per_message_deflate=config.compression,
        log_level=config.log_level,
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    settings.update(overrides)
    return uvicorn.Config(app, **settings)


def _warn_if_exposed(config: ServiceConfig) -> None:
    try:
        loopback = ipaddress.ip_address(config.host).is_loopback
    except ValueError:
        loopback = config.host == "localhost"
    if not loopback and not config.tls:
        _log.warning("serving on %s without TLS: bearer tokens and commands travel in clear text", config.host)


class _Server(uvicorn.Server):
    """uvicorn closes WebSockets before the lifespan shutdown; stop the runners before that."""

    def __init__(self, config: uvicorn.Config, state: ServiceState) -> None:
        super().__init__(config)
        self._state = state

    async def shutdown(self, sockets: Any = None) -> None:
        # Without this, devices disconnecting first would fail in-flight
        # batches and end sessions that should resume after the restart.
        self._state.sessions.begin_shutdown()
        await super().shutdown(sockets)


async def serve(
    config: ServiceConfig, *, runner: TaskRunner | None = None, store: SessionRecordStore | None = None
) -> None:
    """Run the service server until it is told to stop (SIGINT/SIGTERM). The CLI's ``saucer serve``.

    On a graceful stop, running sessions are not ended: they resume when the
    server starts again with the same state dir (or store).
    """
    _warn_if_exposed(config)
    app = create_app(config, runner=runner, store=store)
    await _Server(_uvicorn_config(app, config), app.state.service).serve()


@dataclass
class RunningServer:
    """A server running in the current event loop (see :func:`running_server`)."""

    app: Starlette
    state: ServiceState
    host: str
    port: int
    tls: bool

    @property
    def http_url(self) -> str:
        """Base URL of the HTTP API."""
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def ws_url(self) -> str:
        """URL devices and clients connect to."""
        return f"{'wss' if self.tls else 'ws'}://{self.host}:{self.port}{WEBSOCKET_PATH}"


@contextlib.asynccontextmanager
async def running_server(
    config: ServiceConfig, *, runner: TaskRunner | None = None, store: SessionRecordStore | None = None
) -> AsyncIterator[RunningServer]:
    """Run the server inside this event loop for the duration of the block (port 0 picks a free port)."""
    app = create_app(config, runner=runner, store=store)
    server = _Server(_uvicorn_config(app, config, log_config=None, access_log=False), app.state.service)
    task = asyncio.create_task(server.serve(), name="saucer-service")
    while not server.started:
        if task.done():
            task.result()  # re-raise why it could not start
            raise RuntimeError("service server stopped before it started")
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield RunningServer(app=app, state=app.state.service, host=config.host, port=port, tls=config.tls)
    finally:
        server.should_exit = True
        await task
