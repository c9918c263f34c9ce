"""``python -m saucer.service serve|device``: run a server or a device without the full CLI.

The CLI (``saucer serve`` / ``saucer device``) calls the same functions:
:func:`saucer.service.server.serve` and :func:`saucer.service.device.run_device`.
Tokens come from the environment so they do not show in the process list:
``SAUCER_SERVICE_TOKENS`` (server, ``name=token,...``) and
``SAUCER_SERVICE_TOKEN`` (device), unless ``--token`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import ssl
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from saucer.service.auth import TokenConfigError


def load_factory(spec: str) -> Callable[[], Any]:
    """Resolve ``package.module:attribute`` to the callable that makes a dispatcher."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"dispatcher must be given as 'module:attribute', got {spec!r}")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{spec} is not callable")
    factory: Callable[[], Any] = target
    return factory


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m saucer.service")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the service server")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument("--state-dir", type=Path, default=Path(".saucer/service"))
    serve.add_argument("--store", help="event store URL of the sessions' Contexts (default: sqlite in the state dir)")
    serve.add_argument(
        "--runner",
        choices=("engine", "plan"),
        default="engine",
        help="engine sessions (default) or the plain plan runner",
    )
    serve.add_argument("--heartbeat-interval", type=float, default=10.0)
    serve.add_argument("--missed-heartbeats", type=int, default=3)
    serve.add_argument("--reconnect-grace", type=float, default=0.0)
    serve.add_argument("--step-timeout", type=float, default=300.0)
    serve.add_argument("--max-frame-bytes", type=int, default=1024 * 1024)
    serve.add_argument("--certfile", type=Path)
    serve.add_argument("--keyfile", type=Path)
    serve.add_argument("--log-level", default="info")
    serve.add_argument(
        "--config", type=Path, help="saucer.toml whose [service] devices and admins say who may use which device"
    )

    device = commands.add_parser("device", help="connect this machine as a device")
    device.add_argument("--server", required=True, help="ws://host:port/ws or wss://...")
    device.add_argument("--token", help="bearer token (default: $SAUCER_SERVICE_TOKEN)")
    device.add_argument("--device-id", required=True)
    device.add_argument("--dispatcher", required=True, help="module:callable returning the local dispatcher")
    device.add_argument("--backoff-initial", type=float, default=0.5)
    device.add_argument("--backoff-max", type=float, default=30.0)
    device.add_argument("--cafile", type=Path, help="CA bundle to verify a wss:// server with")
    device.add_argument("--log-level", default="info")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        from saucer.service.access import AccessPolicy
        from saucer.service.server import ServiceConfig, serve

        try:
            access: dict[str, Any] = {}
            if args.config is not None:
                from saucer.config import ConfigError, load_settings

                try:
                    service = load_settings(args.config).service
                except ConfigError as exc:
                    raise ValueError(str(exc)) from None
                access = {"devices": {k: v.model_dump() for k, v in service.devices.items()}, "admins": service.admins}
            config = ServiceConfig.from_env(
                **access,
                host=args.host,
                port=args.port,
                state_dir=args.state_dir,
                store_url=args.store,
                heartbeat_interval=args.heartbeat_interval,
                missed_heartbeats=args.missed_heartbeats,
                reconnect_grace=args.reconnect_grace,
                step_timeout=args.step_timeout,
                max_frame_bytes=args.max_frame_bytes,
                ssl_certfile=args.certfile,
                ssl_keyfile=args.keyfile,
                log_level=args.log_level,
            )
            runner = None
            if args.runner == "plan":
                from saucer.service.runner import PlanTaskRunner

                runner = PlanTaskRunner(config.step_timeout)
            AccessPolicy(config.devices, config.admins).check_principals(config.tokens)
            asyncio.run(serve(config, runner=runner))
        except (TokenConfigError, ValueError) as exc:
            print(f"saucer serve: {exc}", file=sys.stderr)
            return 2
        return 0

    from saucer.service.device import DEVICE_TOKEN_ENV, DeviceError, run_device

    token = args.token or os.environ.get(DEVICE_TOKEN_ENV)
    if not token:
        print(f"saucer device: no token: pass --token or set {DEVICE_TOKEN_ENV}", file=sys.stderr)
        return 2
    try:
        factory = load_factory(args.dispatcher)
    except (ImportError, AttributeError, ValueError) as exc:
        print(f"saucer device: cannot load dispatcher {args.dispatcher!r}: {exc}", file=sys.stderr)
        return 2
    context = ssl.create_default_context(cafile=str(args.cafile)) if args.cafile else None
    try:
        asyncio.run(
            run_device(
                args.server,
                token,
                args.device_id,
                factory,
                backoff_initial=args.backoff_initial,
                backoff_max=args.backoff_max,
                ssl=context,
            )
        )
    except DeviceError as exc:
        print(f"saucer device: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
