"""Settings of the service server (:class:`ServiceConfig`), read by the server, its sessions and its API."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from saucer.service.access import DeviceAccess
from saucer.service.auth import tokens_from_env
from saucer.service.protocol import DEFAULT_MAX_FRAME_BYTES
from saucer.service.runner import DEFAULT_STEP_TIMEOUT

__all__ = ["ServiceConfig"]


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
    session_logs: Literal["auto"] | bool = Field(
        default="auto",
        description="which sessions of the default runner write a log folder under <state_dir>/logs: auto, those "
        "with LLM agents (a plan session's steps and verdict are all in the event store); true, all; false, none",
    )
    store_url: str | None = Field(
        default=None,
        description="event store of the sessions' Contexts (default: sqlite:///<state_dir>/saucer.db, memory:// without a state dir)",
    )
    heartbeat_interval: float = Field(default=10.0, gt=0, description="seconds between device heartbeats")
    missed_heartbeats: int = Field(default=3, ge=1, description="silent intervals before a device is offline")
    aip_heartbeat_interval: float = Field(
        default=120.0, gt=0, description="seconds between the heartbeats of an AIP (UFO) device"
    )
    aip_parameters: dict[str, dict[str, SecretStr]] = Field(
        default_factory=dict, description="device id (or *) -> parameters added on the wire to its AIP actions"
    )
    reconnect_grace: float = Field(default=0.0, ge=0, description="seconds pending commands wait for a lost device")
    step_timeout: float = Field(default=DEFAULT_STEP_TIMEOUT, gt=0, description="default seconds per command batch")
    cancel_timeout: float = Field(
        default=10.0, gt=0, description="seconds a cancel waits for the device's acknowledgement"
    )
    max_frame_bytes: int = Field(default=DEFAULT_MAX_FRAME_BYTES, ge=1024, description="larger frames get an error")
    register_timeout: float = Field(default=10.0, gt=0, description="seconds a new connection has to register")
    send_timeout: float = Field(default=10.0, gt=0, description="seconds a frame may take to leave")
    compression: bool = Field(default=False, description="permessage-deflate on the WebSocket")
    max_streams: int = Field(default=16, ge=1, description="live viewer pages one principal may hold open")
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    log_level: str = "info"

    @model_validator(mode="after")
    def _tls_pair(self) -> ServiceConfig:
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile must be given together")
        return self

    @classmethod
    def from_env(cls, **settings: Any) -> ServiceConfig:
        """Build a config from ``settings``, taking tokens from the environment when none are given."""
        if not settings.get("tokens"):
            settings["tokens"] = tokens_from_env()
        return cls(**settings)

    @property
    def aip_liveness_window(self) -> float:
        """Seconds of silence after which an AIP device is offline (never shorter than saucer's own window)."""
        return max(self.aip_heartbeat_interval, self.heartbeat_interval) * self.missed_heartbeats

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
