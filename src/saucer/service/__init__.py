"""Service mode: sessions run on a server, their commands on devices connected over WebSocket.

- :mod:`saucer.service.protocol` — the wire frames (``parse_frame``, ``encode_frame``); those the
  dispatcher itself sends and reads are :mod:`saucer.dispatch.wire`;
- :mod:`saucer.service.server` — ``ServiceConfig``, ``create_app``, ``serve``, ``running_server``;
  its parts: :mod:`~saucer.service.settings` (``ServiceConfig``), :mod:`~saucer.service.sessions`
  (``SessionManager``), :mod:`~saucer.service.api` (HTTP handlers and the WebSocket endpoint);
- :mod:`saucer.service.device` — ``run_device`` / ``DeviceClient``;
- :mod:`saucer.service.runner` — the ``TaskRunner`` seam and the plain ``PlanTaskRunner``;
- :mod:`saucer.service.engine_runner` — ``EngineTaskRunner``, the default: sessions as engine Sessions;
- :mod:`saucer.service.records` — durable ``SessionRecordStore`` (SQLite, memory);
- :mod:`saucer.dispatch.websocket` — ``WebSocketCommandDispatcher``.

Names are imported lazily so that importing the protocol alone stays cheap.
"""

from __future__ import annotations

from saucer._lazy import lazy_exports

_EXPORTS = {
    "ServiceConfig": "saucer.service.server",
    "create_app": "saucer.service.server",
    "serve": "saucer.service.server",
    "running_server": "saucer.service.server",
    "run_device": "saucer.service.device",
    "DeviceClient": "saucer.service.device",
    "DeviceError": "saucer.service.device",
    "DeviceAuthError": "saucer.service.device",
    "DeviceRefused": "saucer.service.device",
    "TaskRunner": "saucer.service.runner",
    "TaskOutcome": "saucer.service.runner",
    "SessionRecorder": "saucer.service.runner",
    "PlanTaskRunner": "saucer.service.runner",
    "EngineTaskRunner": "saucer.service.engine_runner",
    "server_identity": "saucer.service.engine_runner",
    "SessionRecordStore": "saucer.service.records",
    "SqliteSessionRecordStore": "saucer.service.records",
    "MemorySessionRecordStore": "saucer.service.records",
    "TaskSpec": "saucer.service.protocol",
    "ProtocolError": "saucer.service.protocol",
    "parse_frame": "saucer.service.protocol",
    "encode_frame": "saucer.service.protocol",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)
