"""``saucer ui``: the web viewer of a store's sessions (see :mod:`saucer.ui`); read-only unless ``--allow-writes``."""

from __future__ import annotations

import contextlib
import ipaddress
import shlex
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import typer

from saucer.cli.common import (
    ConfigOption,
    StoreOption,
    UserError,
    err,
    friendly,
    open_existing_store,
    resolve_session,
    resolve_store_url,
)

if TYPE_CHECKING:
    import uvicorn
    from pydantic import SecretStr

    from saucer.store import EventStore
    from saucer.ui.acting import Acting

__all__ = ["ui_cmd", "DEFAULT_PORT", "ui_command"]

DEFAULT_PORT = 8766


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (127.0.0.0/8, ::1, localhost)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def ui_command(program: str, store_flag: str, session: str | None = None) -> str:
    """The command line that opens the viewer in a browser (on ``session``'s page when given)."""
    target = f" {shlex.quote(session)}" if session is not None else ""
    return f"{program} ui{target} --open{store_flag}"


@friendly
def ui_cmd(
    session: str | None = typer.Argument(
        None, help="Open this session's page (its id, a unique prefix, or 'last') instead of the sessions table."
    ),
    store: str | None = StoreOption,
    host: str = typer.Option(
        "127.0.0.1",
        "--host",
        help="Address to listen on. Anything but this machine (loopback) needs a token: SAUCER_SERVICE_TOKENS=name=token.",
    ),
    port: int = typer.Option(DEFAULT_PORT, "--port", min=0, max=65535, help="TCP port."),
    open_browser: bool = typer.Option(False, "--open", help="Open the sessions page in the default browser."),
    allow_writes: bool = typer.Option(
        False,
        "--allow-writes",
        help="Show forms on a session's page to set/delete context variables, approve/refuse a pending step, answer a "
        "pending question and cancel a running session (as saucer cancel does), each recorded with you as author "
        "(user:<login>; with tokens: the principal), and to resume a stopped session (saucer resume ID, started in the "
        "background). Default: read-only.",
    ),
    config: Path | None = ConfigOption,
) -> None:
    """Open a web viewer of the store's sessions: table, timelines, state at any version, diffs, live steps (read-only unless --allow-writes).

    Pages: /sessions, /sessions/ID, /sessions/ID/state?at=V, /sessions/ID/diff?from=A&to=B, /sessions/ID/history?key=NAME.

    On loopback no token is needed; on any other address every page asks for one of SAUCER_SERVICE_TOKENS, as saucer serve does. Ctrl-C stops.
    """
    import uvicorn

    from saucer.ui import create_app

    url = resolve_store_url(store, config)
    if url.startswith("memory://"):
        raise UserError(
            "a memory:// store lives in one process only, so there is nothing to view: pass --store sqlite:///... or postgresql://..."
        )
    authenticate = None
    if not is_loopback(host):
        from saucer.service.auth import TokenAuthenticator, TokenConfigError, service_tokens

        tokens = service_tokens(secret.get_secret_value() for secret in _settings_tokens(config))
        if not tokens:
            raise UserError(
                f"serving on {host} exposes the sessions to the network: set SAUCER_SERVICE_TOKENS=name=token "
                "(16 characters or more), or bind 127.0.0.1"
            )
        try:
            authenticate = TokenAuthenticator(tokens).principal
        except TokenConfigError as exc:
            raise UserError(str(exc)) from None
    st = open_existing_store(url)
    page = "/sessions"
    if session is not None:
        try:
            page = f"/sessions/{quote(resolve_session(st, session), safe='')}"
        except BaseException:
            st.close()
            raise
    # Without a token, only this machine's names reach the pages (no DNS rebinding from a web page).
    hosts = ["127.0.0.1", "::1", "localhost", host] if authenticate is None else None
    from saucer.cli.common import settings_for

    max_streams = settings_for(config).service.max_streams
    app = create_app(
        st,
        authenticate=authenticate,
        on_close=st.close,
        allowed_hosts=hosts,
        max_streams=max_streams,
        acting=_local_acting(st, url, config) if allow_writes else None,
    )
    shown = f"[{host}]" if ":" in host else host
    err.print(
        f"saucer ui on http://{shown}:{port}{page} · store: {url}"
        + ("" if authenticate is None else " · token required"),
        highlight=False,
    )
    err.print("  Ctrl-C stops", style="dim", highlight=False)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))
    if open_browser:
        _open_when_started(server, f"http://{shown}:{port}{page}")
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a viewer is stopped: uvicorn has shut down cleanly
        server.run()


def _local_acting(store: EventStore, url: str, config: Path | None) -> Acting:
    """Who acts through ``saucer ui --allow-writes``: anyone who reaches the viewer (loopback, or a token's
    principal), recorded as that principal or, without tokens, as ``user:<login>`` like the CLI. Resume
    starts ``saucer resume ID`` on the same store as a detached process (from this command's folder);
    cancel records the cancel in the session's log as ``saucer cancel`` does (its runner, wherever it
    runs, stops after the step in flight)."""
    import asyncio
    import subprocess
    import sys
    import threading

    from saucer.cli.common import local_user
    from saucer.engine.cancel import request_cancel
    from saucer.ui.acting import Acting

    def author(principal: str | None) -> str:
        return principal if principal is not None else local_user()

    async def allowed(principal: str | None, session_id: str) -> bool:
        return True  # the store's own participants rule still applies to every write

    async def cancel(session_id: str, principal: str | None, reason: str) -> str | None:
        # CancelError (not running) and NotAllowedToCancel are the page's 409 and 403
        await asyncio.to_thread(request_cancel, store, session_id, author=author(principal), reason=reason)
        return None

    async def resume(session_id: str, principal: str | None) -> str | None:
        command = [sys.executable, "-m", "saucer", "resume", session_id, "--store", url]
        if config is not None:
            command += ["--config", str(config)]
        try:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            return f"could not start saucer resume: {exc}"
        threading.Thread(target=proc.wait, name=f"resume-{session_id}", daemon=True).start()  # reaped when it ends
        return None  # a second runner is refused by the session's lease; the page shows what happens

    return Acting(allowed=allowed, author=author, cancel=cancel, resume=resume)


def _settings_tokens(config: Path | None) -> list[SecretStr]:
    from saucer.cli.common import settings_for

    return list(settings_for(config).service.tokens)


def _open_when_started(server: uvicorn.Server, url: str) -> None:
    """Open ``url`` in a browser once the server listens (a thread that waits for it); say so when none opens."""
    import threading
    import time
    import webbrowser

    def wait() -> None:
        for _ in range(200):
            if server.started:
                try:
                    opened = webbrowser.open(url)
                except Exception:  # noqa: BLE001  # a broken browser setting is the same news: no browser
                    opened = False
                if not opened:
                    err.print(
                        f"--open: no browser could be opened here (no display, or none found; set BROWSER); open {url} yourself",
                        highlight=False,
                        soft_wrap=True,
                    )
                return
            time.sleep(0.05)

    threading.Thread(target=wait, name="saucer-ui-open", daemon=True).start()
