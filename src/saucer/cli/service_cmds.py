"""``saucer serve`` and ``saucer device``: service mode from the command line.

``register(app)`` adds both commands to the ``saucer`` app. The server runs
each submitted task as an engine session whose Context lives in the event
store (``--store`` / ``store.url``), so ``saucer show SESSION`` prints it;
a device runs the commands it receives on its own tools (``[mcp.servers]`` of
its config, else the built-in shell and files tools in ``--workspace``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

if (
    TYPE_CHECKING
):  # asyncio, ssl, signal and logging are imported by the commands that use them (start-up of the others)
    import ssl

import orjson
import typer

__all__ = ["register", "websocket_url", "NO_TOKEN_MESSAGE"]

TOKENS_ENV = "SAUCER_SERVICE_TOKENS"
DEVICE_TOKEN_ENV = "SAUCER_SERVICE_TOKEN"

NO_TOKEN_MESSAGE = (
    "saucer serve needs at least one bearer token: set "
    f"{TOKENS_ENV}=NAME=TOKEN (comma-separated for several, each TOKEN at least 16 characters, e.g. "
    'from `openssl rand -hex 24`) or put tokens = ["NAME=TOKEN"] under [service] in saucer.toml; '
    "NAME owns the sessions its token submits"
)

_MAX_TOOLS_INFO = 256 * 1024
"""A device describes its tools in its register frame only while they stay this small (bytes of JSON)."""

_LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


# Help texts as single-line paragraphs: the CLI renders them with rich, which keeps source line breaks.
SERVE_HELP = "\n\n".join(
    [
        "Run the service server: devices connect to it, clients submit tasks to them over HTTP or WebSocket.",
        'Tokens come from \\[service] tokens in the config (each "name=token"; the name owns the sessions its '
        f"token submits) and from {TOKENS_ENV} (name=token,...). Each task runs as a saucer session whose Context "
        "is durable in the store, so `saucer show SESSION --store URL` prints its timeline. If the server stops or "
        "dies, its unfinished sessions resume from their last committed step when it starts again with the same "
        "--state-dir and store.",
        "A device is usable by the token that registered it, by the principals it is shared with "
        "(\\[service.devices.NAME] principals = \\[...] in the config, or PUT /api/devices/ID/grants/PRINCIPAL by its "
        "owner) and by \\[service] admins; to everyone else it does not exist.",
        "Devices speaking UFO's AIP (UFO's own client, or saucer device --protocol aip) join the same /ws with the "
        'token as ?token=; SAUCER_AIP_PARAMETERS=\'{"DEVICE or *": {"api_key": "..."}}\' adds credentials their '
        "tools want to the commands they get, on the wire only.",
        "HTTP API (Authorization: Bearer TOKEN): GET /api/devices · POST /api/sessions "
        '{"device_id": ID, "task": {"task": NAME, "steps": \\[{"subtask": TEXT, "commands": \\[...]}]}} '
        "(no steps: the task is a request for the LLM agent) · GET /api/sessions/ID?wait=SECONDS · "
        "GET /api/sessions/ID/results · POST /api/sessions/ID/cancel · GET /health (no token).",
    ]
)
DEVICE_HELP = "\n\n".join(
    [
        "Connect this machine to a saucer server as a device and run the commands it sends.",
        "Commands run on this machine's own tools: the \\[mcp.servers] of the config, else the built-in shell and "
        "files tools rooted at --workspace. Every command gets a result (a local error is a failure result). The "
        "device heartbeats, and reconnects with backoff when the connection drops, keeping its registration and "
        "the answers of commands in flight. Ctrl-C stops it.",
        "--protocol aip joins a server that speaks UFO's AIP instead (UFO's own server, or saucer serve): the token "
        "goes in the URL's query (?token=), the device registers with its system info, heartbeats every "
        "--heartbeat-interval seconds (120, as UFO's client) and answers list_tools and every command, a command for "
        "an --agent-name it does not serve or a tool it does not have included (with an error, never silence).",
    ]
)


def websocket_url(server: str) -> str:
    """The WebSocket URL of a server given as ``ws(s)://host:port/ws`` or ``http(s)://host:port`` (``/ws`` added)."""
    parts = urlsplit(server.strip())
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss") or not parts.netloc:
        raise ValueError(f"--server must be a URL like ws://127.0.0.1:8765/ws (or wss://... with TLS), not {server!r}")
    path = parts.path if parts.path not in ("", "/") else "/ws"
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


def _log_level(value: str) -> str:
    level = value.lower()
    if level not in _LOG_LEVELS:
        raise ValueError(f"--log-level must be one of {', '.join(_LOG_LEVELS)}, not {value!r}")
    return level


def _setup_logging(level: str) -> None:
    import logging

    from saucer.redaction import RedactingLogFilter

    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # every line, a library's debug output included, without secrets
        if not any(isinstance(f, RedactingLogFilter) for f in handler.filters):
            handler.addFilter(RedactingLogFilter())


def _compact_tools(tools: dict[str, Any]) -> dict[str, Any] | None:
    """The tool list a device registers with, small enough for one frame (None when it is not)."""
    compact = {name: {k: v for k, v in info.items() if k != "output_schema"} for name, info in tools.items()}
    if len(orjson.dumps(compact)) > _MAX_TOOLS_INFO:
        return None
    return compact


def register(app: typer.Typer) -> None:
    """Add ``serve`` and ``device`` to ``app`` (the ``saucer`` command line); a second call does nothing."""
    if any(command.name in ("serve", "device") for command in app.registered_commands):
        return
    from saucer.cli import common as cli

    @app.command("serve", help=SERVE_HELP)
    @cli.friendly
    def serve_cmd(
        host: str | None = typer.Option(
            None,
            "--host",
            help="Address to listen on. Default: service.host, 127.0.0.1 (this machine only). "
            "Anything else exposes tokens and commands to the network: use it with --certfile/--keyfile.",
        ),
        port: int | None = typer.Option(
            None, "--port", min=0, max=65535, help="TCP port. Default: service.port, 8765."
        ),
        state_dir: Path | None = typer.Option(
            None,
            "--state-dir",
            help="Session records (owners, status, results), the server's identity and session logs. "
            "Restart with the same one to resume unfinished sessions. Default: service.state_dir, .saucer/service.",
        ),
        certfile: Path | None = typer.Option(
            None, "--certfile", help="TLS certificate (PEM): serve https:// and wss://. Needs --keyfile."
        ),
        keyfile: Path | None = typer.Option(None, "--keyfile", help="TLS private key (PEM) for --certfile."),
        heartbeat_interval: float | None = typer.Option(
            None, "--heartbeat-interval", min=0.01, help="Seconds between device heartbeats. Default: 10."
        ),
        missed_heartbeats: int | None = typer.Option(
            None,
            "--missed-heartbeats",
            min=1,
            help="Heartbeats a device may miss before it is offline and its commands fail. Default: 3.",
        ),
        aip_heartbeat_interval: float = typer.Option(
            120.0,
            "--aip-heartbeat-interval",
            min=0.01,
            help="Seconds between the heartbeats of a device speaking UFO's AIP (UFO's client: 120); its WebSocket pings count too.",
        ),
        reconnect_grace: float | None = typer.Option(
            None,
            "--reconnect-grace",
            min=0,
            help="Seconds a command waits for its device to reconnect before it fails. Default: 0.",
        ),
        step_timeout: float | None = typer.Option(
            None,
            "--step-timeout",
            min=0.01,
            help="Seconds a step's commands may take unless the task says. Default: 300.",
        ),
        max_frame_bytes: int | None = typer.Option(
            None, "--max-frame-bytes", min=1024, help="Largest frame or request body accepted. Default: 1 MiB."
        ),
        log_level: str = typer.Option("info", "--log-level", help="critical, error, warning, info or debug."),
        store: str | None = cli.StoreOption,
        config: Path | None = cli.ConfigOption,
    ) -> None:
        """Run the service server (see SERVE_HELP)."""
        from saucer.service.access import AccessPolicy
        from saucer.service.auth import TokenAuthenticator, service_tokens
        from saucer.service.engine_runner import EngineTaskRunner, server_identity
        from saucer.service.server import ServiceConfig, serve

        level = _log_level(log_level)
        settings = cli.settings_for(
            config,
            {
                "store.url": store,
                "service.host": host,
                "service.port": port,
                "service.state_dir": state_dir,
                "service.certfile": certfile,
                "service.keyfile": keyfile,
                "service.heartbeat_interval": heartbeat_interval,
                "service.missed_heartbeats": missed_heartbeats,
                "service.reconnect_grace": reconnect_grace,
                "service.step_timeout": step_timeout,
                "service.max_frame_bytes": max_frame_bytes,
            },
        )
        svc = settings.service
        tokens = service_tokens(secret.get_secret_value() for secret in svc.tokens)
        if not tokens:
            raise cli.UserError(NO_TOKEN_MESSAGE)
        TokenAuthenticator(tokens)  # too-short tokens are refused before anything starts
        from saucer.service.aip_server import aip_parameters

        try:
            device_parameters = aip_parameters()
        except ValueError as exc:
            raise cli.UserError(str(exc)) from None
        for path, flag in ((svc.certfile, "--certfile"), (svc.keyfile, "--keyfile")):
            if path is not None and not Path(path).is_file():
                raise cli.UserError(f"{flag} {path} is not a file")
        if "root" not in settings.logs.model_fields_set:
            settings.logs.root = Path(svc.state_dir) / "logs"
        service_config = ServiceConfig(
            host=svc.host,
            port=svc.port,
            tokens=tokens,
            devices={name: access.model_dump() for name, access in svc.devices.items()},
            admins=svc.admins,
            state_dir=svc.state_dir,
            session_logs=svc.session_logs,
            store_url=settings.store.url,
            heartbeat_interval=svc.heartbeat_interval,
            missed_heartbeats=svc.missed_heartbeats,
            aip_heartbeat_interval=aip_heartbeat_interval,
            aip_parameters=device_parameters,
            reconnect_grace=svc.reconnect_grace,
            step_timeout=svc.step_timeout,
            max_frame_bytes=svc.max_frame_bytes,
            max_streams=svc.max_streams,
            ssl_certfile=svc.certfile,
            ssl_keyfile=svc.keyfile,
            log_level=level,
        )
        try:
            AccessPolicy(service_config.devices, service_config.admins).check_principals(tokens)
        except ValueError as exc:
            raise cli.UserError(str(exc)) from None
        _setup_logging(level)
        runner = EngineTaskRunner(
            settings,
            owner=server_identity(svc.state_dir),
            default_step_timeout=svc.step_timeout,
            session_logs=svc.session_logs,
        )
        scheme = "https" if service_config.tls else "http"
        cli.err.print(
            f"saucer serve on {scheme}://{svc.host}:{svc.port} · devices connect to "
            f"{'wss' if service_config.tls else 'ws'}://{svc.host}:{svc.port}/ws\n"
            f"  store: {settings.store.url} · state: {svc.state_dir} · tokens: {', '.join(sorted(tokens))}",
            highlight=False,
        )

        async def main() -> None:
            try:
                await serve(service_config, runner=runner)
            finally:
                await runner.close()

        import asyncio

        asyncio.run(main())

    @app.command("device", help=DEVICE_HELP)
    @cli.friendly
    def device_cmd(
        server: str = typer.Option(
            ...,
            "--server",
            help="The server's WebSocket URL: ws://HOST:PORT/ws (wss:// with TLS); http(s)://HOST:PORT works too.",
        ),
        token: str | None = typer.Option(
            None,
            "--token",
            envvar=DEVICE_TOKEN_ENV,
            show_envvar=True,
            help=f"Bearer token the server accepts. Prefer {DEVICE_TOKEN_ENV}: a --token shows in the process list.",
        ),
        device_id: str = typer.Option(
            ...,
            "--device-id",
            help="This device's name (letters, digits, . _ : @ -); the first token to register it owns it.",
        ),
        workspace: Path | None = typer.Option(
            None,
            "--workspace",
            "-w",
            help="Directory the built-in shell and files tools act in (created if missing). Default: the current directory. "
            "Ignored when the config lists \\[mcp.servers].",
        ),
        yes: bool = typer.Option(
            False,
            "--yes",
            "-y",
            help="Run sensitive commands (rm, sudo, ... and tools marked sensitive) without asking. Without it they "
            "wait on the server for the session's owner (or an admin) to approve them (saucer approve, or the API), "
            "and run only when approved.",
        ),
        cafile: Path | None = typer.Option(
            None, "--cafile", help="CA bundle (PEM) to verify a wss:// server's certificate with."
        ),
        backoff_initial: float = typer.Option(
            0.5, "--backoff-initial", min=0.01, help="First wait (seconds) before reconnecting."
        ),
        backoff_max: float = typer.Option(
            30.0, "--backoff-max", min=0.01, help="Longest wait (seconds) between reconnection attempts."
        ),
        log_level: str = typer.Option("info", "--log-level", help="critical, error, warning, info or debug."),
        protocol: str = typer.Option(
            "saucer", "--protocol", help="saucer (saucer serve's own frames) or aip (UFO's protocol)."
        ),
        agent_name: list[str] | None = typer.Option(
            None,
            "--agent-name",
            help="With --protocol aip: an agent_name this device serves (repeatable). Default: LinuxAgent, HostAgent, AppAgent.",
        ),
        device_platform: str = typer.Option(
            "linux",
            "--platform",
            help="With --protocol aip: the platform it registers with (sets the server's agent_name).",
        ),
        heartbeat_interval: float = typer.Option(
            120.0,
            "--heartbeat-interval",
            min=0.05,
            help="With --protocol aip: seconds between heartbeats (WebSocket pings go every 20 s).",
        ),
        config: Path | None = cli.ConfigOption,
    ) -> None:
        """Run this machine as a device (see DEVICE_HELP)."""
        from saucer.service.device import DeviceError

        level = _log_level(log_level)
        url = websocket_url(server)
        if not token:
            raise cli.UserError(
                f"saucer device needs the server's token: set {DEVICE_TOKEN_ENV}=TOKEN (or pass --token TOKEN)"
            )
        if backoff_max < backoff_initial:
            raise cli.UserError("--backoff-max must be at least --backoff-initial")
        if protocol not in ("saucer", "aip"):
            raise cli.UserError(f"--protocol must be saucer or aip, not {protocol!r}")
        aip = {
            "agent_names": tuple(agent_name or ()),
            "platform": device_platform,
            "heartbeat_interval": heartbeat_interval,
        }
        context: ssl.SSLContext | None = None
        if cafile is not None:
            if not cafile.is_file():
                raise cli.UserError(f"--cafile {cafile} is not a file")
            import ssl

            context = ssl.create_default_context(cafile=str(cafile))
        settings = cli.settings_for(config)
        where = (workspace or Path.cwd()).expanduser()
        if not settings.mcp.servers:
            where.mkdir(parents=True, exist_ok=True)
        _setup_logging(level)
        try:
            import asyncio

            asyncio.run(
                _run_device(
                    cli,
                    url,
                    token,
                    device_id,
                    settings,
                    where,
                    assume_yes=yes,
                    ssl_context=context,
                    backoff=(backoff_initial, backoff_max),
                    aip=aip if protocol == "aip" else None,
                )
            )
        except DeviceError as exc:
            cli.fail(str(exc), 3)


async def _run_device(
    cli: Any,
    url: str,
    token: str,
    device_id: str,
    settings: Any,
    workspace: Path,
    *,
    assume_yes: bool,
    ssl_context: ssl.SSLContext | None,
    backoff: tuple[float, float],
    aip: dict[str, Any] | None = None,
) -> None:
    from saucer.dispatch.local import LocalCommandDispatcher
    from saucer.dispatch.servers import DesktopServer, configured_servers
    from saucer.service.device import DeviceClient, server_approver

    desktop = None
    if settings.desktop.enabled:
        artifacts = settings.desktop.artifacts_dir or workspace / "artifacts"
        desktop = DesktopServer(artifacts=artifacts, display=settings.desktop.display, sandbox=settings.shell)
    servers = configured_servers(
        settings.mcp.servers, workspace, desktop=desktop, isolate=settings.mcp.isolate, shell=settings.shell
    )
    import asyncio

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        import signal

        loop.add_signal_handler(signal.SIGTERM, stop.set)
    approved: set[str] = set()  # call ids the server sends as approved by a person
    async with LocalCommandDispatcher.from_config(
        servers, assume_yes=assume_yes, approver=None if assume_yes else server_approver(approved)
    ) as dispatcher:
        failed = await dispatcher.start()
        for name, reason in failed.items():
            cli.err.print(f"warning: tool server {name!r} did not start: {reason}")
        tools = await dispatcher.list_tools()
        info: dict[str, Any] = {"tools_count": len(tools)}
        if assume_yes:
            info["assume_yes"] = True  # the server does not ask for approvals: this device runs sensitive commands
        if not settings.mcp.servers:
            info["workspace"] = str(workspace.resolve())
        compact = _compact_tools(tools)
        if compact is not None:
            info["tools"] = compact
        else:
            cli.err.print("warning: the tool list is too large to send; LLM sessions on this device will see no tools")
        cli.err.print(
            f"saucer device {device_id} → {url}{' (AIP)' if aip is not None else ''} · tools: {', '.join(sorted(tools)) or 'none'}"
            + (f" · workspace: {info['workspace']}" if "workspace" in info else ""),
            highlight=False,
        )
        if aip is not None:
            from saucer.service.aip_device import DEFAULT_AGENT_NAMES, AipDeviceClient

            await AipDeviceClient(
                url,
                token,
                device_id,
                dispatcher,
                tools=tools,
                info={k: v for k, v in info.items() if k != "tools"},
                agent_names=aip["agent_names"] or DEFAULT_AGENT_NAMES,
                platform=aip["platform"],
                heartbeat_interval=aip["heartbeat_interval"],
                backoff_initial=backoff[0],
                backoff_max=backoff[1],
                ssl=ssl_context,
                stop=stop,
            ).run()
            return
        client = DeviceClient(
            url,
            token,
            device_id,
            dispatcher,
            info=info,
            backoff_initial=backoff[0],
            backoff_max=backoff[1],
            ssl=ssl_context,
            stop=stop,
            approved_calls=approved,
        )
        await client.run()
