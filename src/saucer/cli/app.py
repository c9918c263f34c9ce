"""The ``saucer`` command line.

Every command prints one clear sentence and exits non-zero on a user mistake
(bad path, unknown session, malformed file); tracebacks are for bugs only.
Every command that takes a session accepts its whole id, a unique prefix of
it, or ``last`` (the most recently updated session). What is printed is what
is stored: values are never read as markup, and output to a pipe is not wrapped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import uuid
from pathlib import Path
from typing import Any

import typer

from saucer import __version__
from saucer.cli import config_cmds, doctor_cmd, people, queue_cmds, running, service_cmds, store_cmds, ui_cmd
from saucer.cli import inspect as view
from saucer.cli.common import (
    ConfigOption,
    StoreOption,
    UserError,
    console,
    err,
    fork_workspace,
    friendly,
    one_shot,
    open_configured_store,
    open_ctx,
    open_existing_store,
    program_name,
    resolve_session,
    store_flag,
)
from saucer.cli.output import JsonObject, JsonStream, TextChunks, binary_stdout, print_json, styled, visible
from saucer.cli.streams import LimitOption, RoundOption, SinceOption, parse_since, window_for
from saucer.context import Context, ContextNames, prune
from saucer.context.events import op_key
from saucer.store import EventStore

app = typer.Typer(
    name="saucer",
    help="Durable, typed session state for agents: run sessions, then inspect, time-travel, fork and audit them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
store_app = typer.Typer(help="Maintain the event store: migrate, rekey, prune, delete.", no_args_is_help=True)
app.add_typer(store_app, name="store")
config_cmds.register(app)

SessionArgument = typer.Argument(..., help="Session id, a unique prefix of one, or 'last' (the most recently updated).")


def _version_callback(value: bool) -> None:
    if value:
        console.print(f"saucer {__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """saucer: durable, typed session state for agents."""


# ============================================================== inspection


@app.command("sessions")
@friendly
@one_shot
def sessions_cmd(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    limit: int | None = typer.Option(
        None, "--limit", "-n", min=1, help="At most N sessions (the first N in the order of --sort)."
    ),
    status: list[str] | None = typer.Option(
        None,
        "--status",
        help="Only sessions with this status (running, interrupted, not started, finished, failed, error, stopped, or - for one the engine did not make); repeat for several.",
    ),
    task: str | None = typer.Option(
        None, "--task", help="Only sessions whose task contains this text (letters compared without case)."
    ),
    since: str | None = typer.Option(
        None,
        "--since",
        help="Only sessions updated since this time: 2026-11-26T19:30, 19:30 (today), or a duration ago (90s, 15m, 2h, 3d).",
    ),
    sort: str = typer.Option(
        "updated", "--sort", help="Order by updated, created, id, task, status, rounds, steps, cost or version."
    ),
    reverse: bool = typer.Option(
        False, "--reverse", help="The other way round (by default newest, largest first; id and task A to Z)."
    ),
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """List sessions: id, task, mode, status, rounds, steps, cost, last update (newest first).

    One query over the summaries the commits keep, whatever the number of
    sessions. A session whose runner vanished (crash, kill, Ctrl-C) is
    'interrupted'; a cost that could not be priced is 'unknown' (null in JSON).
    In a terminal, a long list shows what fits the screen and says so.
    """
    from saucer.store.summary import ENDED, INTERRUPTED, NOT_STARTED, SORT_KEYS

    if sort not in SORT_KEYS:
        raise UserError(f"--sort {sort!r} is not one of {', '.join(SORT_KEYS)}")
    known = ["running", INTERRUPTED, NOT_STARTED, *sorted(ENDED), "-"]
    for wanted in status or []:
        if wanted not in known:
            raise UserError(f"--status {wanted!r} is not one of {', '.join(known)}")
    after = None
    if since is not None:
        kind, value = parse_since(since)
        if kind != "time":
            raise UserError(
                f"--since {since!r}: sessions are chosen by time (2026-11-26T19:30, 19:30, 15m, 2d), not by version"
            )
        after = value
    screen = None if as_json or limit is not None or not console.is_terminal else max(5, console.size.height - 8)
    ask = limit if screen is None else screen + 1  # one more tells whether there are more
    default_descending = sort not in ("id", "task")
    with open_existing_store(store, config) as st:
        summaries = st.list_sessions(
            limit=ask,
            status=status or None,
            task=task,
            since=after,
            sort=sort,
            descending=default_descending != reverse,
        )
    more = screen is not None and len(summaries) > screen
    rows = [view.listed_row(s) for s in (summaries[:screen] if more else summaries)]
    if as_json:
        stream = JsonStream(binary_stdout())
        stream.array(iter(rows))
        stream.end()
    elif not rows:
        filtered = status or task or since
        console.print("no sessions match" if filtered else f"no sessions yet; start one with: {program_name()} demo")
    elif console.is_terminal:
        view.print_uncut(console, view.sessions_table(rows))
        if more:
            console.print(
                styled(
                    (
                        f"showing the first {screen} sessions; there are more (choose with --limit N, --status, --task, --since; piped, all of them)",
                        "dim",
                    )
                )
            )
    else:
        with TextChunks(sys.stdout) as out:
            view.write_sessions(out, rows)


@app.command("show")
@friendly
@one_shot
def show_cmd(
    session: str = SessionArgument,
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Keep watching and print new steps as they commit (Ctrl-C stops)."
    ),
    interval: float = typer.Option(0.5, "--interval", help="Polling interval in seconds for --follow."),
    show_all: bool = typer.Option(
        False, "--all", "-a", help="Also list the engine's counter and log updates of each step."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the timeline as JSON: the session, its events and a summary of each round."
    ),
    limit: int | None = LimitOption,
    since: str | None = SinceOption,
    round_: int | None = RoundOption,
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """Timeline of a session: rounds → steps → agent, state, commands, results, cost and Context changes.

    The events are written as they are read, whatever the session's length.
    In a terminal, a long session shows its newest events (what fits the
    screen) and says how to see the rest; piped, it prints every event as
    plain lines, or with --json as JSON.
    """
    with open_existing_store(store, config) as st:
        sid = resolve_session(st, session)
        info = st.session_info(sid)
        summary = view.listed_row(st.list_sessions(ids=[sid])[0])
        reason = view.ended_badly_reason(st, sid, summary["status"])
        screen = None if as_json or not console.is_terminal else max(10, console.size.height // 3)
        window = window_for(st, sid, limit=limit, since=since, round=round_, default_limit=screen)
        if as_json:
            from saucer.engine.overview import RoundTally

            tally = RoundTally()
            out = JsonStream(binary_stdout())
            out.object(
                [
                    ("session", summary | ({"reason": reason} if reason else {})),
                    ("events", (tally.add(item) for item in view.timeline_items(window.events(st)))),
                    ("rounds", tally.rounds),  # complete once the events are written
                ]
            )
            out.end()
            return
        title = f"session {sid} · v{info.version} · {summary['status']}" + (
            f": {' '.join(reason.split())}" if reason else ""
        )
        if info.parent_id or info.meta.get("forked_from"):
            title += (
                f" · fork of {info.parent_id or info.meta['forked_from']}@{info.parent_version or info.meta.get('at')}"
            )
        title = visible(title)  # an imported session's meta is whatever its file said
        if console.is_terminal:
            events = list(window.events(st))  # at most what fits the screen, unless the user asked for more
            console.print(view.timeline(events, title, show_all=show_all))
            hint = window.hint(len(events))
            if hint:
                console.print(styled((hint, "dim")))
        else:
            with TextChunks(sys.stdout) as text:
                view.write_timeline(text, window.events(st), title, show_all=show_all)
        if summary["status"] == "interrupted":
            console.print(
                f"its runner is gone; continue it with: {program_name()} resume {shlex.quote(sid)}{store_flag(store)}"
            )
        if follow:
            import asyncio

            asyncio.run(_follow(st, sid, window.upto, interval, show_all))


async def _follow(store: EventStore, session: str, after: int, interval: float, show_all: bool) -> None:
    import asyncio
    import gc

    gc.enable()  # it goes on as long as the session does (see one_shot)

    console.print(styled((f"following {session} from v{after}; Ctrl-C to stop", "dim")))
    try:
        async for event in store.watch(session, after, interval=interval):
            console.print(view.timeline([event], f"v{event.version}", show_all=show_all))
            if event.meta.get("kind") == "session_end":
                console.print(styled((f"session {event.meta['session_status']}", "dim")))
                return
    except asyncio.CancelledError:  # Ctrl-C
        return


def _known_key(store: EventStore, session_id: str, key: str) -> None:
    """Refuse a ``--key`` that is neither a Context name nor a variable this session ever set
    (read as a stream, up to the first event that sets it)."""
    from saucer.dispatch.toolcheck import close_names

    names = [m.value for m in ContextNames]
    if key in names:
        return
    bare = key.removeprefix("vars.")
    seen: set[str] = set()
    for event in store.iter_events(session_id):
        for op in event.ops:
            if "var" in op:
                if op["var"] == bare:
                    return
                if len(seen) < 10_000:  # enough to suggest a name
                    seen.add(op["var"])
    same = [n for n in names if n.lower() == key.lower()]  # REQUEST for request
    guesses = same or close_names(key, names + sorted(seen) + [f"vars.{v}" for v in sorted(seen)])
    hint = (
        f"did you mean {' or '.join(guesses)}?"
        if guesses
        else "the names are ContextNames (e.g. REQUEST) and vars.NAME"
    )
    raise UserError(
        f"unknown key {key!r}: not a Context name, and this session never set a context variable {bare!r}; {hint}"
    )


@app.command("history")
@friendly
@one_shot
def history_cmd(
    session: str = SessionArgument,
    key: str | None = typer.Option(
        None, "--key", help="Only changes to this name (e.g. REQUEST) or context variable (vars.NAME or NAME)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the events as JSON (a list, written as it is read)."),
    limit: int | None = LimitOption,
    since: str | None = SinceOption,
    round_: int | None = RoundOption,
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """Every change with its version, time, author, round and step.

    Written as it is read, whatever the session's length: in a terminal, a
    long history shows its newest events (what fits the screen) and says how
    to see the rest; piped, it prints every change as plain aligned rows, or
    with --json every event as JSON.
    """
    with open_existing_store(store, config) as st:
        sid = resolve_session(st, session)
        keep = None
        if key is not None:
            _known_key(st, sid, key)
            wanted = Context.history_key(key)
            keep = lambda e: any(op_key(op) == wanted for op in e.ops)  # noqa: E731
        screen = None if as_json or not console.is_terminal else max(10, console.size.height - 8)
        window = window_for(st, sid, limit=limit, since=since, round=round_, keep=keep, default_limit=screen)
        if as_json:
            out = JsonStream(binary_stdout())
            out.array(e.to_dict() for e in window.events(st))
            out.end()
        elif console.is_terminal:
            events = list(window.events(st))  # at most what fits the screen, unless the user asked for more
            console.print(view.history_table(events, key))
            hint = window.hint(len(events))
            if hint:
                console.print(styled((hint, "dim")))
        else:
            with TextChunks(sys.stdout) as text:
                view.write_history(text, window.events(st), key)


def _state_data(ctx: Context, *, stored_json: bool = False) -> dict[str, Any]:
    """The state as ``state --json`` and ``export`` write it: the Context's own values, not
    copies (a long session's state is not held twice); read it, never change it. With
    ``stored_json`` large values stored whole are their JSON text, not decoded (for the table)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        names = ctx.to_dict(ensure_serializable=True, copy=False, stored_json=stored_json)
    variables = names.pop("_vars", {})
    data = {"session_id": ctx.session_id, "version": ctx.version, "names": names, "vars": variables}
    if ctx.retired:  # names retired since the session stored them (saucer.context.names.RETIRED)
        data["retired"] = dict(ctx.retired)
    return data


def _streamed_state(data: dict[str, Any]) -> JsonObject:
    """``data`` of :func:`_state_data` for a :class:`JsonStream`: each name's value dumped on its own."""
    return JsonObject(
        (key, JsonObject(iter(value.items())) if key == "names" else value) for key, value in data.items()
    )


@app.command("state")
@friendly
@one_shot
def state_cmd(
    session: str = SessionArgument,
    at: int | None = typer.Option(None, "--at", help="Version to show (default: the latest)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """The Context of a session as it is now, or as it was at a version (time travel)."""
    with open_existing_store(store, config) as st:
        ctx = open_ctx(st, resolve_session(st, session), at)
        data = _state_data(ctx, stored_json=not as_json)  # the table shows the start of each value
        if as_json:
            out = JsonStream(binary_stdout())
            out.value(_streamed_state(data))
            out.end()
            return
    flat = dict(data["names"])
    flat.update({f"vars.{k}": v for k, v in data["vars"].items()})
    flat.update({f"{k} (retired)": v for k, v in data.get("retired", {}).items()})
    title = f"session {data['session_id']} at v{data['version']}"
    if console.is_terminal:
        console.print(view.state_table(flat, title))
    else:
        view.plain_lines(view.state_lines(flat, title))


@app.command("diff")
@friendly
@one_shot
def diff_cmd(
    session: str = SessionArgument,
    v1: int = typer.Argument(..., help="Older version."),
    v2: int = typer.Argument(..., help="Newer version."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """What changed in the Context between two versions."""
    with open_existing_store(store, config) as st:
        changes = open_ctx(st, resolve_session(st, session)).diff(v1, v2)
    if as_json:
        print_json(changes)
    elif not changes:
        console.print(f"no differences between v{v1} and v{v2}")
    elif console.is_terminal:
        console.print(view.diff_table(changes, v1, v2))
    else:
        view.plain_lines(view.diff_lines(changes, v1, v2))


@app.command("fork")
@friendly
def fork_cmd(
    session: str = typer.Argument(..., help="Session to fork: its id, a unique prefix of one, or 'last'."),
    at: int | None = typer.Option(None, "--at", help="Version to fork at (default: the latest)."),
    new_id: str | None = typer.Option(None, "--as", help="Id of the new session (default: generated)."),
    workspace: Path | None = typer.Option(
        None,
        "--workspace",
        "-w",
        help="The fork's own directory for the built-in tools, never its parent's "
        "(default: a new folder beside the parent's, printed).",
    ),
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """Start a new session from a session's state at a version (its log is referenced, not copied).

    A fork never runs in its parent's workspace: its tools act in --workspace
    DIR, by default a new, empty folder beside the parent's (printed). A
    resumed fork writes its own log folder.
    """
    from saucer.engine.cursor import stored_session_brief

    with open_existing_store(store, config) as st:
        sid = resolve_session(st, session)
        target = new_id or f"{sid[:180]}-fork-{uuid.uuid4().hex[:6]}"
        own = fork_workspace(stored_session_brief(st, sid)[0].get("workspace"), target, workspace)
        parent = open_ctx(st, sid)
        child = parent.fork(target, at=at)
        version = child.version
        own.mkdir(parents=True, exist_ok=True)
        child.commit(author="user", meta={"kind": "fork", "workspace": str(own)})
        child.close()
    console.print(styled(f"forked {sid} at v{version} as ", (target, "bold")))
    console.print(f"  its tools act in: {visible(str(own))}")
    console.print("  (its own workspace: a fork never runs in its parent's)")
    flag = store_flag(store)
    console.print(f"  inspect it: {program_name()} state {shlex.quote(target)}{flag}")
    console.print(f"  run it: {program_name()} resume {shlex.quote(target)}{flag}")


@app.command("export")
@friendly
@one_shot
def export_cmd(
    session: str = SessionArgument,
    output: Path | None = typer.Option(None, "--output", "-o", help="Write to this file instead of standard output."),
    decrypt: bool = typer.Option(
        False,
        "--decrypt",
        help="Write values encrypted at rest in plain text (needs the store key); by default they stay encrypted.",
    ),
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """Export a session's whole log and final state as JSON (written as it is read, whatever the log's length).

    Values encrypted at rest (store.encrypt) stay encrypted in the export, and
    read as <encrypted> in its state, unless --decrypt.
    """
    from saucer.context.transfer import Lineage, export_header

    with open_existing_store(store, config) as st:
        sid = resolve_session(st, session)
        # Without --decrypt, the records as the backend holds them: sealed values stay sealed.
        source = st if decrypt else getattr(st, "inner", st)
        ctx = open_ctx(source, sid)
        if decrypt and ctx.encrypted:
            raise UserError(
                f"--decrypt needs the store key ({', '.join(sorted(ctx.encrypted))} are encrypted): "
                "set SAUCER_STORE_KEY or store.key_file"
            )
        lineage = Lineage()

        def fields() -> Any:
            # Each part is made when it is written and let go after: the session's meta (a whole
            # plan) is gone before the events stream, and the state is built after them.
            header = export_header(source, sid)
            for key in list(header):
                yield key, header.pop(key)
            yield "events", (lineage.add(event).to_dict() for event in source.iter_events(sid, upto=ctx.version))
            yield "lineage", lineage.segments
            yield "state", _streamed_state(_state_data(ctx))

        partial = None if output is None else output.with_name(f".{output.name}.partial")
        with contextlib.ExitStack() as stack:
            sink = binary_stdout() if partial is None else stack.enter_context(open(partial, "wb"))
            try:
                out = JsonStream(sink)
                out.object(fields())
                out.end()
            except BaseException:
                if partial is not None:
                    stack.close()
                    partial.unlink(missing_ok=True)  # never a half-written export under the name asked for
                raise
        if output is not None and partial is not None:
            os.replace(partial, output)
    if output is not None:
        count = sum(seg["to"] - seg["from"] + 1 for seg in lineage.segments)
        err.print(f"exported {sid} ({count} events) to {output}")


@app.command("import")
@friendly
def import_cmd(
    file: Path = typer.Argument(..., help="A file written by saucer export."),
    new_id: str | None = typer.Option(None, "--as", help="Import under this session id."),
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """Import a session exported with saucer export."""
    from saucer.context.transfer import import_session

    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{file}: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise UserError(f"{file}: its JSON nests too deeply to be a saucer export") from None
    with open_configured_store(store, config) as st:
        info = import_session(st, data, new_id)
    console.print(styled("imported session ", (info.session_id, "bold"), f" at v{info.version}"))


# ================================================================= running

app.command("run")(running.run_cmd)
app.command("resume")(running.resume_cmd)
app.command("demo")(running.demo_cmd)
app.command("ui")(ui_cmd.ui_cmd)
people.register(app)  # set, vars, approvals, approve, refuse, answer


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


@store_app.command("prune")
@friendly
def store_prune_cmd(
    session: str | None = typer.Argument(None, help="Session id, a unique prefix of one, or 'last' (or --all)."),
    all_sessions: bool = typer.Option(False, "--all", help="Prune every session."),
    keep_last: int | None = typer.Option(
        None, "--keep-last", min=0, help="Keep the newest N versions of each session."
    ),
    older_than: str | None = typer.Option(
        None, "--older-than", help="Drop versions committed longer ago than this (90s, 15m, 12h, 7d, 2w)."
    ),
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """Drop old history; every remaining version stays readable (a snapshot is kept at the new start).

    Forks keep every version too: a fork that still reads the pruned history gets its own copy of it first.
    """
    if (session is None) == (not all_sessions):
        raise UserError("name one SESSION or pass --all")
    if keep_last is None and older_than is None:
        raise UserError("say what to keep: --keep-last N and/or --older-than DURATION")
    seconds = parse_duration(older_than) if older_than is not None else None
    with open_existing_store(store, config) as st:
        targets = [resolve_session(st, session)] if session is not None else [i.session_id for i in st.sessions()]
        for sid in targets:
            before = st.first_version(sid)
            forks = [i for i in st.sessions() if i.parent_id == sid]
            first = prune(st, sid, keep_last=keep_last, older_than=seconds)
            if first > before:
                console.print(f"{sid}: versions before {first} dropped (v{first}..v{st.head(sid)} remain)")
            else:
                console.print(f"{sid}: nothing to prune (v{first}..v{st.head(sid)} remain)")
            for fork in forks:
                if st.session_info(fork.session_id).parent_id is None:
                    console.print(
                        f"  fork {fork.session_id} now holds its own copy of the history it reads (up to v{fork.parent_version})"
                    )


@store_app.command("delete")
@friendly
def store_delete_cmd(
    session: str = SessionArgument,
    yes: bool = typer.Option(False, "--yes", "-y", help="Delete without asking."),
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """Remove a session completely: its events, snapshots and lease."""
    from saucer.cli.interactor import stdin_is_terminal

    with open_existing_store(store, config) as st:
        sid = resolve_session(st, session)
        info = st.session_info(sid)
        if not yes:
            if not stdin_is_terminal():
                raise UserError(f"deleting {sid!r} cannot be undone: pass --yes to confirm")
            if not typer.confirm(f"delete session {sid} and its {info.version} versions?", default=False):
                raise typer.Exit(1)
        st.delete_session(sid)
    console.print(f"deleted session {sid}")


service_cmds.register(app)
store_cmds.register(store_app)
queue_cmds.register(app)
doctor_cmd.register(app)


def main() -> None:
    """Entry point of the ``saucer`` script."""
    app()


if __name__ == "__main__":
    main()
