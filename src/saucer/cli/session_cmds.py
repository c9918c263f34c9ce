"""The commands that read a session: ``sessions``, ``show``, ``history``, ``state`` and ``diff``.

``register(app)`` adds them to the ``saucer`` command line. Their rendering is
:mod:`saucer.cli.inspect` (listings, history, state, diffs) and
:mod:`saucer.cli.timeline`; what is printed is what is stored.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import typer

from saucer.cli import inspect as view
from saucer.cli import timeline
from saucer.cli.common import (
    ConfigOption,
    StoreOption,
    UserError,
    console,
    friendly,
    one_shot,
    open_ctx,
    open_existing_store,
    program_name,
    resolve_session,
    store_flag,
)
from saucer.cli.output import JsonObject, JsonStream, TextChunks, binary_stdout, print_json, styled, visible
from saucer.cli.streams import LimitOption, RoundOption, SinceOption, parse_since, window_for
from saucer.context import Context, ContextNames
from saucer.context.events import op_key
from saucer.store import EventStore

__all__ = ["SessionArgument", "register", "state_data", "streamed_state"]

SessionArgument = typer.Argument(..., help="Session id, a unique prefix of one, or 'last' (the most recently updated).")


def register(app: typer.Typer) -> None:
    """Add ``sessions``, ``show``, ``history``, ``state`` and ``diff`` to ``app`` (in this order: ``--help``'s)."""
    app.command("sessions")(sessions_cmd)
    app.command("show")(show_cmd)
    app.command("history")(history_cmd)
    app.command("state")(state_cmd)
    app.command("diff")(diff_cmd)


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
                    ("events", (tally.add(item) for item in timeline.timeline_items(window.events(st)))),
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
            console.print(timeline.timeline(events, title, show_all=show_all))
            hint = window.hint(len(events))
            if hint:
                console.print(styled((hint, "dim")))
        else:
            with TextChunks(sys.stdout) as lines:
                timeline.write_timeline(lines, window.events(st), title, show_all=show_all)
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
            console.print(timeline.timeline([event], f"v{event.version}", show_all=show_all))
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
            with TextChunks(sys.stdout) as lines:
                view.write_history(lines, window.events(st), key)


def state_data(ctx: Context, *, stored_json: bool = False) -> dict[str, Any]:
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


def streamed_state(data: dict[str, Any]) -> JsonObject:
    """``data`` of :func:`state_data` for a :class:`JsonStream`: each name's value dumped on its own."""
    return JsonObject(
        (key, JsonObject(iter(value.items())) if key == "names" else value) for key, value in data.items()
    )


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
        data = state_data(ctx, stored_json=not as_json)  # the table shows the start of each value
        if as_json:
            out = JsonStream(binary_stdout())
            out.value(streamed_state(data))
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
