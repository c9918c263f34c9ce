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
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)  # one line, however long
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
        except _user_errors() as exc:
            _fail(str(exc))
        except FileNotFoundError as exc:
            _fail(f"no such file: {exc.filename or exc}")
        except ValueError as exc:  # bad values the user gave (versions, URLs, files); other errors are bugs
            _fail(str(exc.args[0]) if exc.args else str(exc))
        except StoreError as exc:
            _fail(f"store error: {exc}")
        except KeyboardInterrupt:
            _fail("interrupted", 130)

    return wrapper  # type: ignore[return-value]


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors of the engine and the settings that describe a user's mistake."""
    from saucer.config import ConfigError
    from saucer.engine.errors import EngineError

    return (ConfigError, EngineError)


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
    show_all: bool = typer.Option(False, "--all", "-a", help="Also list the engine's counter and log updates of each step."),
    store: Optional[str] = StoreOption,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Timeline of a session: rounds → steps → agent, state, commands, results, cost and Context changes."""
    with _open_existing_store(store, config) as st:
        info = st.session_info(session)
        events = list(st.read(session))
        title = f"session {session} · v{info.version}"
        if info.parent_id or info.meta.get("forked_from"):
            title += f" · fork of {info.parent_id or info.meta['forked_from']}@{info.parent_version or info.meta.get('at')}"
        console.print(view.timeline(events, title, show_all=show_all))
        if follow:
            asyncio.run(_follow(st, session, info.version, interval, show_all))


async def _follow(store: EventStore, session: str, after: int, interval: float, show_all: bool) -> None:
    console.print(f"[dim]following {session} from v{after}; Ctrl-C to stop[/]")
    try:
        async for event in store.watch(session, after, interval=interval):
            console.print(view.timeline([event], f"v{event.version}", show_all=show_all))
            if event.meta.get("kind") == "session_end":
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
        target = new_id or f"{session[:180]}-fork-{uuid.uuid4().hex[:6]}"
        parent = _open_ctx(st, session)
        child = parent.fork(target, at=at)
        version = child.version
        child.close()
    console.print(f"forked {session} at v{version} as [bold]{target}[/]")
    flag = f" --store {store}" if store else ""
    console.print(f"  inspect it: {program_name()} state {target}{flag}", highlight=False, soft_wrap=True)


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
    except RecursionError:
        raise UserError(f"{file}: its JSON nests too deeply to be a saucer export") from None
    with open_store(resolve_store_url(store, config)) as st:
        info = import_session(st, data, new_id)
    console.print(f"imported session [bold]{info.session_id}[/] at v{info.version}")


# ================================================================= running

ModeOption = typer.Option(
    None,
    "--mode",
    help="normal (a request, answered by the LLM agent), follower (a plan), batch_normal (a folder of plans) "
    "or service (through saucer serve). Default: follower for a plan file, batch_normal for a folder, normal for a request.",
)


def _run_settings(config: Optional[Path], store: Optional[str], **flags: Any) -> Any:
    overrides: dict[str, Any] = {"store.url": store}
    overrides.update({k: v for k, v in flags.items() if v is not None})
    return _settings(config, overrides)


def _print_result(result: Any) -> None:
    style = "green" if result.ok else "red"
    console.print(
        f"[{style}]session {result.session_id}: {result.status}[/]"
        + (f" ({result.reason})" if result.reason else ""),
        highlight=False,
    )
    console.print(result.cost.render())
    if result.log_path:
        console.print(f"logs: {result.log_path}")
    if getattr(result, "experience_path", None):
        console.print(f"experience saved as a replayable plan: {result.experience_path}")


async def _run_sessions(sessions: list[Any], concurrency: int) -> list[Any]:
    from saucer.engine.pool import SessionPool

    if len(sessions) == 1:
        return [await sessions[0].run()]
    pool = SessionPool(sessions, max_concurrency=concurrency, progress=True, console=console)
    results = await pool.run_all()
    console.print(pool.summary_table())
    return results


def _factory(settings: Any, yes: bool, workspace: Optional[Path], show_session: bool = False) -> Any:
    from saucer.cli.interactor import RichInteractor
    from saucer.cli.progress import StepPrinter
    from saucer.engine.factory import SessionFactory

    return SessionFactory(
        settings,
        interactor=RichInteractor(err, assume_yes=yes),
        observer=StepPrinter(console, show_session=show_session),
        workspace=workspace,
    )


def _exit_for(results: list[Any]) -> None:
    if not all(r.ok for r in results):
        raise typer.Exit(1)


@app.command("run")
@friendly
def run_cmd(
    request: Optional[str] = typer.Option(None, "--request", "-r", help="What the agents should do, in plain language (normal mode)."),
    plan: Optional[Path] = typer.Option(None, "--plan", "-p", help="A plan JSON file, or a folder of them."),
    mode: Optional[str] = ModeOption,
    task: Optional[str] = typer.Option(None, "--task", help="Task name (default: the plan's task, or 'request')."),
    workspace: Optional[Path] = typer.Option(None, "--workspace", "-w", help="Directory the built-in shell and files tools act in (default: the current directory)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Approve sensitive steps without asking."),
    concurrency: int = typer.Option(4, "--concurrency", "-c", min=1, help="Sessions run at once for a folder of plans."),
    max_step: Optional[int] = typer.Option(None, "--max-step", min=1, help="Override system.max_step."),
    max_round: Optional[int] = typer.Option(None, "--max-round", min=1, help="Override system.max_round."),
    durability: Optional[str] = typer.Option(None, "--durability", help="step (default), strict or exit."),
    store: Optional[str] = StoreOption,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Run a session: a request in plain language, a plan, or a folder of plans."""
    if request is not None and plan is not None:
        raise UserError("give --request TEXT or --plan FILE|DIR, not both")
    if request is None and plan is None and mode != "normal":
        raise UserError("give either --request TEXT or --plan FILE|DIR")
    if plan is not None and not plan.exists():
        raise UserError(f"no such plan file or folder: {plan}")
    mode = mode or ("normal" if plan is None else "batch_normal" if plan.is_dir() else "follower")
    settings = _run_settings(
        config, store, **{"system.max_step": max_step, "system.max_round": max_round, "store.durability": durability}
    )
    if mode == "normal":
        from saucer.agents.llm import require_model_settings

        require_model_settings(settings)
        if request is None:
            from saucer.cli.interactor import stdin_is_terminal

            if not stdin_is_terminal():
                raise UserError("normal mode needs a request: pass --request TEXT (there is no terminal to ask)")
    if mode == "service":
        raise UserError("service-mode sessions run on a server: start it with saucer serve and submit tasks to it")
    if workspace is not None:
        workspace.mkdir(parents=True, exist_ok=True)
    name = task or ("request" if plan is None else None)
    with _factory(settings, yes, workspace, show_session=plan is not None and plan.is_dir()) as factory:
        if name is None:
            from saucer.engine.plan import load_plan

            name = load_plan(plan).task if plan.is_file() else plan.name  # type: ignore[union-attr]
        sessions = factory.create_session(name, mode, plan=plan, request=request or "")
        results = asyncio.run(_run_sessions(sessions, concurrency))
    if len(results) == 1:
        _print_result(results[0])
        _print_next_steps(results[0].session_id, store)
    _exit_for(results)


def _shortest(path: Path) -> str:
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else str(path)


def program_name() -> str:
    """How the user can run saucer again: ``saucer`` when that is on PATH, else a path that works from here."""
    import shutil

    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if Path(argv0).name != "saucer":  # python -m saucer
        return f"{_shortest(Path(sys.executable).absolute())} -m saucer"
    found = shutil.which("saucer")
    if found and Path(found).resolve() == Path(argv0).resolve():
        return "saucer"
    return _shortest(Path(argv0).absolute())


def _print_next_steps(session_id: str, store: Optional[str], at: int = 3) -> None:
    prog = program_name()
    flag = f" --store {store}" if store else ""
    console.print("\n[bold]next[/] (each works as printed):")
    for comment, command in (
        ("the timeline: rounds, steps, commands, results", f"show {session_id}"),
        ("every change with its version, author, round and step", f"history {session_id}"),
        (f"time travel: the Context as it was at version {at}", f"state {session_id} --at {at}"),
        ("what changed between two versions", f"diff {session_id} {at} {at + 3}"),
        ("branch off a new session from that version", f"fork {session_id} --at {at}"),
        ("continue at the first uncommitted step", f"resume {session_id}"),
    ):
        console.print(f"  [dim]# {comment}[/]")
        console.print(f"  {prog} {command}{flag}", highlight=False, soft_wrap=True)


@app.command("resume")
@friendly
def resume_cmd(
    session: str = typer.Argument(..., help="Session id."),
    workspace: Optional[Path] = typer.Option(None, "--workspace", "-w", help="Tools directory (default: the session's own)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Approve sensitive steps without asking."),
    store: Optional[str] = StoreOption,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Continue a session at its first uncommitted step (a finished session just reports its result)."""
    settings = _run_settings(config, store)
    with _open_existing_store(store, config):
        pass  # a clear error when there is no store yet
    with _factory(settings, yes, workspace) as factory:
        factory.store.session_info(session)  # SessionNotFoundError before anything starts
        kw = {"workspace": workspace} if workspace is not None else {}
        result = asyncio.run(factory.resume_session(session, **kw).run())
    _print_result(result)
    _exit_for([result])


@app.command("demo")
@friendly
def demo_cmd(
    store: Optional[str] = StoreOption,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Run the shipped demo: a plan that builds, edits and searches a small project with the built-in tools.

    No network and no API key needed. It ends with the session's timeline and
    the commands to resume, inspect and time-travel it.
    """
    from importlib.resources import files

    plan_path = Path(str(files("saucer.cli") / "demo_plan.json"))
    settings = _run_settings(config, store)
    run_id = uuid.uuid4().hex[:6]
    workspace = Path(".saucer") / "demo" / run_id
    workspace.mkdir(parents=True, exist_ok=True)
    console.rule("[bold]saucer demo")
    console.print(f"plan: {plan_path.name} · workspace: {workspace} · store: {settings.store.url}\n")
    with _factory(settings, True, workspace) as factory:
        sessions = factory.create_session("demo", "follower", plan=plan_path, session_id=f"demo-{run_id}")
        result = asyncio.run(sessions[0].run())
        events = list(factory.store.read(result.session_id))
    console.print()
    console.print(view.timeline(events, f"session {result.session_id} · v{result.version}"))
    _print_result(result)
    _print_next_steps(result.session_id, store)
    _exit_for([result])


# ================================================================== store

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``12h``, ``7d`` or ``2w`` in seconds."""
    raw = text.strip().lower()
    unit = raw[-1:] if raw[-1:] in _DURATION_UNITS else "s"
    number = raw[:-1] if raw[-1:] in _DURATION_UNITS else raw
    try:
        value = float(number)
    except ValueError:
        raise UserError(f"--older-than {text!r} is not a duration like 90s, 15m, 12h, 7d or 2w") from None
    if value < 0:
        raise UserError(f"--older-than {text!r} must not be negative")
    return value * _DURATION_UNITS[unit]


@store_app.command("migrate")
@friendly
def store_migrate_cmd(store: Optional[str] = StoreOption, config: Optional[Path] = ConfigOption) -> None:
    """Create or upgrade the store's schema (opening a store does it too; this makes it explicit)."""
    url = resolve_store_url(store, config)
    with open_store(url) as st:
        version = st.migrate()
    console.print(f"store {url} is at schema version {version}" if version is not None else f"store {url} needs no schema")


@store_app.command("prune")
@friendly
def store_prune_cmd(
    session: Optional[str] = typer.Argument(None, help="Session id (or --all)."),
    all_sessions: bool = typer.Option(False, "--all", help="Prune every session."),
    keep_last: Optional[int] = typer.Option(None, "--keep-last", min=0, help="Keep the newest N versions of each session."),
    older_than: Optional[str] = typer.Option(None, "--older-than", help="Drop versions committed longer ago than this (90s, 15m, 12h, 7d, 2w)."),
    store: Optional[str] = StoreOption,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Drop old history; every remaining version stays readable (a snapshot is kept at the new start).

    Forks keep every version too: a fork that still reads the pruned history gets its own copy of it first.
    """
    if (session is None) == (not all_sessions):
        raise UserError("name one SESSION or pass --all")
    if keep_last is None and older_than is None:
        raise UserError("say what to keep: --keep-last N and/or --older-than DURATION")
    seconds = parse_duration(older_than) if older_than is not None else None
    with _open_existing_store(store, config) as st:
        targets = [session] if session is not None else [i.session_id for i in st.sessions()]
        for sid in targets:
            before = st.first_version(sid)
            forks = [i for i in st.sessions() if i.parent_id == sid]
            first = st.prune(sid, keep_last=keep_last, older_than=seconds)
            if first > before:
                console.print(f"{sid}: versions before {first} dropped (v{first}..v{st.head(sid)} remain)")
            else:
                console.print(f"{sid}: nothing to prune (v{first}..v{st.head(sid)} remain)")
            for fork in forks:
                if st.session_info(fork.session_id).parent_id is None:
                    console.print(f"  fork {fork.session_id} now holds its own copy of the history it reads (up to v{fork.parent_version})")


@store_app.command("delete")
@friendly
def store_delete_cmd(
    session: str = typer.Argument(..., help="Session id."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Delete without asking."),
    store: Optional[str] = StoreOption,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Remove a session completely: its events, snapshots and lease."""
    from saucer.cli.interactor import stdin_is_terminal

    with _open_existing_store(store, config) as st:
        info = st.session_info(session)
        if not yes:
            if not stdin_is_terminal():
                raise UserError(f"deleting {session!r} cannot be undone: pass --yes to confirm")
            if not typer.confirm(f"delete session {session} and its {info.version} versions?", default=False):
                raise typer.Exit(1)
        st.delete_session(session)
    console.print(f"deleted session {session}")


from saucer.cli import service_cmds  # noqa: E402  (it registers onto the app defined above)

service_cmds.register(app)


def main() -> None:
    """Entry point of the ``saucer`` script."""
    app()


if __name__ == "__main__":
    main()
