"""Service mode server: sessions run here, commands run on devices connected over WebSocket.

One Starlette app on one port serves the device/client WebSocket (``/ws``)
and a small HTTP API; :func:`serve` runs it with uvicorn (the CLI's ``saucer
serve``), :func:`create_app` builds it for embedding, :func:`running_server`
runs it inside the current event loop (tests, benchmarks).

HTTP API (``Authorization: Bearer <token>`` on everything but ``/health``)::

    GET  /health                          liveness of the server itself
    GET  /ui/...                          the web viewer of the caller's sessions and devices (saucer.service.viewer)
    GET  /api/devices[/{id}[/info]]       devices this token may use (see :mod:`saucer.service.device_api`)
    PUT|DELETE /api/devices/{id}/grants/{principal}   share a device (its owner, an admin)
    POST /api/sessions                    {"device_id", "task": TaskSpec} -> 201 {"session_id", ...}
    GET  /api/sessions                    the sessions the caller sees (submitted, named as participant; admins: all)
    GET  /api/sessions/{id}?wait=S        status, committed steps, outcome (long-poll up to S s)
    GET  /api/sessions/{id}/results       status and results only
    POST /api/sessions/{id}/cancel        cancel a session that has not ended (recorded as the caller)
    GET  /api/sessions/{id}/approvals     its sensitive commands waiting for a decision, the model's questions, and past decisions
    POST /api/sessions/{id}/approvals/{n}/approve|refuse   decide (owner, admins; :mod:`saucer.service.approvals`)
    POST /api/sessions/{id}/approvals/{n}/answer           answer the model's pending question ({"answer": "..."})

A session belongs to the principal (token name) that submitted it; another
principal gets 404 for it, as for an id that never existed. A device belongs
to the principal that registered it and is usable only by it, by the
principals it is shared with and by admins (:mod:`saucer.service.access`);
others get 404 for it too. Sessions are
durable records (:mod:`saucer.service.records`): they never vanish, their
results stay readable after they end, and after a crash or restart every
session that had not ended waits for its device and resumes from its last
committed step (one whose end the event store already has ends at once; see
:mod:`saucer.service.runner` for the runner seam).

By default each session runs as a saucer engine session whose Context lives
in the event store ``config.event_store_url`` under the same session id
(:mod:`saucer.service.engine_runner`): ``saucer show SESSION --store URL``
prints its timeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route, WebSocketRoute
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from saucer.redaction import RedactingLogFilter
from saucer.service.access import AccessPolicy
from saucer.service.api import ServiceApi, quiet_refused_handshakes
from saucer.service.approvals import ApprovalRoutes
from saucer.service.auth import QueryTokenMiddleware, TokenAuthenticator
from saucer.service.device_api import DeviceRoutes
from saucer.service.hub import TRANSPORT_ALIVE_KEY, DeviceHub
from saucer.service.records import MemorySessionRecordStore, SessionRecordStore, SqliteSessionRecordStore
from saucer.service.runner import TaskRunner
from saucer.service.sessions import ServiceSession, ServiceState, SessionManager
from saucer.service.settings import ServiceConfig
from saucer.service.viewer import viewer_mount

__all__ = [
    "ServiceConfig",
    "ServiceState",
    "ServiceSession",
    "SessionManager",
    "RunningServer",
    "WEBSOCKET_PATH",
    "create_app",
    "serve",
    "running_server",
]

_log = logging.getLogger("saucer.service.server")

WEBSOCKET_PATH = "/ws"
"""Path of the WebSocket endpoint for devices and clients."""


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
    quiet_refused_handshakes()
    redact_server_logs()
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
            config.state_dir,
            config.event_store_url,
            session_logs=config.session_logs,
            default_step_timeout=config.step_timeout,
        )
    sessions = SessionManager(store, hub, runner, config)
    state = ServiceState(config=config, store=store, hub=hub, sessions=sessions, auth=auth)
    api = ServiceApi(state)

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
            if owns_runner and sessions.hooks.close is not None:
                await sessions.hooks.close()

    app = Starlette(
        routes=[
            # The routes every session takes first (submit, long-poll): the router tries them in order, and
            # no other route's path matches theirs (a wrong method still gets the same 405).
            Route("/api/sessions", api.list_sessions, methods=["GET"]),
            Route("/api/sessions", api.submit, methods=["POST"]),
            Route("/api/sessions/{session_id}", api.get_session, methods=["GET"]),
            Route("/api/sessions/{session_id}/results", api.get_results, methods=["GET"]),
            Route("/api/sessions/{session_id}/cancel", api.cancel, methods=["POST"]),
            Route("/health", api.health, methods=["GET"]),
            *DeviceRoutes(hub, auth, config.tokens).routes(),
            *ApprovalRoutes(auth, lambda: sessions.hooks.store, _owner_of(store), config.admins).routes(),
            WebSocketRoute(WEBSOCKET_PATH, api.websocket),
            *viewer_mount(
                sessions.hooks.store, store, hub, auth, config.max_streams, sessions, config.admins
            ),  # the web viewer at /ui (saucer.service.viewer)
        ],
        lifespan=lifespan,
        # A token in the query (?token=, as UFO's clients send it) leaves the URL before uvicorn logs it.
        middleware=[Middleware(QueryTokenMiddleware)],
    )
    app.state.service = state
    return app


def redact_server_logs() -> None:
    """Keep secrets out of uvicorn's logs, access log included (the query string is already redacted)."""
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingLogFilter) for f in logger.filters):
            logger.addFilter(RedactingLogFilter())


class _LivenessWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol, noting in the connection's scope when a ping or a pong arrives.

    A device speaking AIP heartbeats only every 120 s but answers pings (and
    UFO's client sends its own every 20 s): for such a connection these count
    as signs of life (:meth:`saucer.service.hub.Connection.transport_alive_at`).
    """

    def handle_ping(self) -> None:
        self._alive()
        super().handle_ping()

    def handle_pong(self, event: Any) -> None:
        self._alive()
        super().handle_pong(event)

    def _alive(self) -> None:
        # Frames (pings, pongs) arrive only after the handshake, which set the connection's scope.
        self.scope[TRANSPORT_ALIVE_KEY] = self.loop.time()  # type: ignore[literal-required]


def _owner_of(store: SessionRecordStore) -> Any:
    """The owner principal of a session and the participants its task named, from its record (None: no such session)."""

    async def owner_of(session_id: str) -> tuple[str, list[str]] | None:
        record = await store.get_session(session_id)
        return (record.owner, list(record.task.participants)) if record is not None else None

    return owner_of


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
        ws=_LivenessWebSocketProtocol,
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
