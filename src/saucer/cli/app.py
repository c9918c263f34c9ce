"""The ``saucer`` command line.

Every command prints one clear sentence and exits non-zero on a user mistake
(bad path, unknown session, malformed file); tracebacks are for bugs only.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import typer
from rich.console import Console

from saucer import __version__
from saucer.cli import inspect as view
from saucer.context import Context
from saucer.store import (
    ConflictError,
    CorruptRecordError,
    EventStore,
    LeaseHeldError,
    SessionExistsError,
    SessionNotFoundError,
    StoreError,
    open_store,
)

app = typer.Typer(
    name="saucer",
    help="Durable, typed session state for agents: run sessions, then inspect, time-travel, fork and audit them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
store_app = typer.Typer(help="Maintain the event store: migrate, prune, delete.", no_args_is_help=True)
app.add_typer(store_app, name="store")

console = Console()
err = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_STORE = "sqlite:///.saucer/saucer.db"

StoreOption = typer.Option(
    None,
    "--store",
    help="Store URL (memory://, sqlite:///path.db, postgresql://...). Default: store.url from saucer.toml, else sqlite:///.saucer/saucer.db.",
    envvar="SAUCER_STORE_URL",
)
ConfigOption = typer.Option(None, "--config", help="Settings file (default: ./saucer.toml when present).")


class UserError(Exception):
    """A mistake of the user's, reported as one sentence and exit code 2."""


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def friendly(fn: F) -> F:
    """Turn expected errors into one clear sentence and a non-zero exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except SessionNotFoundError as exc:
            _fail(f"{exc}. List sessions with: saucer sessions")
        except (UserError, SessionExistsError, LeaseHeldError, ConflictError, CorruptRecordError) as exc:
            _fail(str(exc))
        except FileNotFoundError as exc:
            _fail(f"no such file: {exc.filename or exc}")
        except (ValueError, TypeError, KeyError) as exc:
            _fail(str(exc.args[0]) if exc.args else str(exc))
        except StoreError as exc:
            _fail(f"store error: {exc}")
        except KeyboardInterrupt:
            _fail("interrupted", 130)

    return wrapper  # type: ignore[return-value]


def _settings(config: Optional[Path], overrides: dict[str, Any] | None = None) -> Any:
    from saucer.config import load_settings

    return load_settings(config_file=config, overrides=overrides or {})


def resolve_store_url(store: Optional[str], config: Optional[Path] = None) -> str:
    """``--store`` wins, then the settings (file, environment), then the default SQLite file."""
    if store:
        return store
    try:
        return str(_settings(config).store.url)
    except ImportError:  # settings module not available in a minimal install
        return DEFAULT_STORE


def _open_existing_store(store: Optional[str], config: Optional[Path] = None) -> EventStore:
    url = resolve_store_url(store, config)
    if url.startswith("sqlite:///"):
        from saucer.store.sqlite import path_from_url

        path = path_from_url(url)
        if not path.exists():
            raise UserError(f"no saucer store at {path} yet; run a session first (saucer demo) or pass --store URL")
    return open_store(url)


def _open_ctx(store: EventStore, session_id: str, at: Optional[int] = None) -> Context:
    if at is None:
        return Context.open(store, session_id, create=False, at=store.head(session_id))
    return Context.open(store, session_id, create=False, at=at)


def _version_callback(value: bool) -> None:
    if value:
        console.print(f"saucer {__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."),
) -> None:
    """saucer: durable, typed session state for agents."""


# ============================================================== inspection


@app.command("sessions")
@friendly
def sessions_cmd(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    store: Optional[str] = StoreOption,
    config: Optional[Path] = ConfigOption,
) -> None:
    """List sessions: id, task, mode, status, rounds, steps, cost, last update."""
    with _open_existing_store(store, config) as st:
        rows = [view.session_summary(st, info) for info in st.sessions()]
    if as_json:
        view.print_json(console, rows)
    elif not rows:
        console.print("no sessions yet; start one with: saucer demo")
    else:
        console.print(view.sessions_table(rows))


@app.command("show")
@friendly
def show_cmd(
    session: str = typer.Argument(..., help="Session id."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep watching and print new steps as they commit (Ctrl-C stops)."),
    interval: float = typer.Option(0.5, "--interval", help="Polling interval in seconds for --follow."),
    store: Optional[str] = StoreOption,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Timeline of a session: rounds → steps → agent, state, commands, results, cost and Context changes."""
    with _open_existing_store(store, config) as st:
        info = st.session_info(session)
        events = list(st.read(session))
        title = f"session {session} · v{info.version}"
        if info.parent_id:
            title += f" · fork of {info.parent_id}@{info.parent_version}"
        console.print(view.timeline(events, title))
        if follow:
            asyncio.run(_follow(st, session, info.version, interval))


async def _follow(store: EventStore, session: str, after: int, interval: float) -> None:
    console.print(f"[dim]following {session} from v{after}; Ctrl-C to stop[/]")
    try:
        async for event in store.watch(session, after, interval=interval):
            console.print(view.timeline([event], f"v{event.version}"))
            if event.meta.get("session_status") in ("finished", "failed", "error"):
                console.print(f"[dim]session {event.meta['session_status']}[/]")
                return
    except asyncio.CancelledError:  # Ctrl-C
        return


@app.command("history")
@friendly
def history_cmd(
    session: str = typer.Argument(..., help="Session id."),
    key: Optional[str] = typer.Option(None, "--key", help="Only changes to this name (e.g. REQUEST) or context variable (vars.NAME or NAME)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON events."),
    store: Optional[str] = StoreOption,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Every change with its version, time, author, round and step."""
    with _open_existing_store(store, config) as st:
        ctx = _open_ctx(st, session)
        events = ctx.history(key)
    if as_json:
        view.print_json(console, [e.to_dict() for e in events])
    else:
        console.print(view.history_table(events, key))


def _state_data(ctx: Context) -> dict[str, Any]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        names = ctx.to_dict(ensure_serializable=True)
    names.pop("_vars", None)
    return {"session_id": ctx.session_id, "version": ctx.version, "names": names, "vars": dict(ctx.vars)}


@app.command("state")
@friendly
def state_cmd(
    session: str = typer.Argument(..., help="Session id."),
    at: Optional[int] = typer.Option(None, "--at", help="Version to show (default: the latest)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    store: Optional[str] = StoreOption,
    config: Optional[Path] = ConfigOption,
) -> None:
    """The Context of a session as it is now, or as it was at a version (time travel)."""
    with _open_existing_store(store, config) as st:
        ctx = _open_ctx(st, session, at)
        data = _state_data(ctx)
    if as_json:
        view.print_json(console, data)
        return
    flat = dict(data["names"])
    flat.update({f"vars.{k}": v for k, v in data["vars"].items()})
    console.print(view.state_table(flat, f"session {session} at v{data['version']} (empty values hidden)"))


@app.command("diff")
@friendly
def diff_cmd(
    session: str = typer.Argument(..., help="Session id."),
    v1: int = typer.Argument(..., help="Older version."),
    v2: int = typer.Argument(..., help="Newer version."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    store: Optional[str] = StoreOption,
    config: Optional[Path] = ConfigOption,
) -> None:
    """What changed in the Context between two versions."""
    with _open_existing_store(store, config) as st:
        changes = _open_ctx(st, session).diff(v1, v2)
    if as_json:
        view.print_json(console, changes)
    elif not changes:
        console.print(f"no differences between v{v1} and v{v2}")
    else:
        console.print(view.diff_table(changes, v1, v2))


@app.command("fork")
@friendly
def fork_cmd(
    session: str = typer.Argument(..., help="Session id to fork."),
    at: Optional[int] = typer.Option(None, "--at", help="Version to fork at (default: the latest)."),
    new_id: Optional[str] = typer.Option(None, "--as", help="Id of the new session (default: generated)."),
    store: Optional[str] = StoreOption,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Start a new session from a session's state at a version (its log is referenced, not copied)."""
    with _open_existing_store(store, config) as st:
        target = new_id or f"{session}-fork-{uuid.uuid4().hex[:6]}"
        parent = _open_ctx(st, session)
        child = parent.fork(target, at=at)
        version = child.version
        child.close()
    console.print(f"forked {session} at v{version} as [bold]{target}[/]")
    console.print(f"  inspect it: saucer state {target}")


@app.command("export")
@friendly
def export_cmd(
    session: str = typer.Argument(..., help="Session id."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write to this file instead of standard output."),
    store: Optional[str] = StoreOption,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Export a session's whole log and final state as JSON."""
    from saucer.store.transfer import export_session

    with _open_existing_store(store, config) as st:
        ctx = _open_ctx(st, session)
        data = export_session(st, session, _state_data(ctx))
    text = json.dumps(data, indent=2, default=str)
    if output is None:
        sys.stdout.write(text + "\n")
    else:
        output.write_text(text + "\n", encoding="utf-8")
        err.print(f"exported {session} ({len(data['events'])} events) to {output}")


@app.command("import")
@friendly
def import_cmd(
    file: Path = typer.Argument(..., help="A file written by saucer export."),
    new_id: Optional[str] = typer.Option(None, "--as", help="Import under this session id."),
    store: Optional[str] = StoreOption,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Import a session exported with saucer export."""
    from saucer.store.transfer import import_session

    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{file}: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    with open_store(resolve_store_url(store, config)) as st:
        info = import_session(st, data, new_id)
    console.print(f"imported session [bold]{info.session_id}[/] at v{info.version}")


def main() -> None:
    """Entry point of the ``saucer`` script."""
    app()


if __name__ == "__main__":
    main()
