"""Rendering of sessions for the terminal: listings, history, state and diffs, and the value formatting they share.

Pure presentation over the store and the Context; no command-line parsing here.
A session's timeline is :mod:`saucer.cli.timeline`.
Every stored value goes into a :class:`rich.text.Text` (or a plain string
cell), never through rich markup, so it is printed as it is stored.
"""

from __future__ import annotations

import datetime as _dt
import functools
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import orjson
from rich import box
from rich.table import Table
from rich.text import Text

from saucer.cli.output import json_key, visible
from saucer.context import Context, Event
from saucer.context.events import StoredJson, op_key
from saucer.context.names import RENAMED, RETIRED, stored_name

__all__ = [
    "listed_row",
    "write_sessions",
    "sessions_table",
    "write_history",
    "history_rows",
    "history_table",
    "state_table",
    "diff_table",
    "describe_op",
    "short",
]


def when(ts: float | None) -> str:
    """A local timestamp, to the second; a stored time no calendar can show (imported before its
    range was checked: ``1e300``, NaN) is shown as the number it is, never an error."""
    if not ts:
        return "-"
    try:
        return _second(int(ts))
    except (OverflowError, ValueError, OSError, TypeError):
        return f"{ts!r} (not a valid time)"


@functools.lru_cache(maxsize=4096)
def _second(second: int) -> str:
    # A long log's events share their seconds: format each second once.
    return _dt.datetime.fromtimestamp(second).strftime("%Y-%m-%d %H:%M:%S")


class PlainText:
    """What the timeline needs of :class:`rich.text.Text` (``append``, ``plain``), for plain output:
    the styles are dropped, the strings only concatenated (rich's Text costs more than the rest)."""

    __slots__ = ("plain",)

    def __init__(self, text: str = "", style: str = "") -> None:
        self.plain = text

    def append(self, text: str, style: str = "") -> PlainText:
        """Add ``text`` (``style`` is ignored)."""
        self.plain += text
        return self


def short(value: Any, width: int = 60) -> str:
    """A one-line JSON rendering of ``value``, cut to ``width`` characters.

    Only what is shown is formatted: a long dict or list is written item by item
    until there is more than ``width`` characters (a 10^5-step log is not dumped
    whole to show its first 200)."""
    if isinstance(value, str):
        text = value
    elif isinstance(value, StoredJson):  # the JSON text itself, as stored
        text = value[: 4 * width + 4].decode("utf-8", "ignore")
    else:
        try:
            text = _json_head(value, 4 * width + 4).decode("utf-8", "ignore")  # "ignore": a character cut at the end
        except TypeError:
            text = repr(value)
    text = visible(text)
    return text if len(text) <= width else text[: width - 1] + "…"


_SHORT_JSON = orjson.OPT_NON_STR_KEYS


def _json_head(value: Any, room: int) -> bytes:
    """The compact JSON of ``value`` (as ``orjson.dumps(value, option=OPT_NON_STR_KEYS, default=str)``),
    or a start of it at least ``room`` bytes long: dicts and lists are written item by item until then."""
    cls = value.__class__
    if cls is dict and value:
        parts, size = [b"{"], 1
        for key, item in value.items():
            if size > room:
                return b"".join(parts)
            piece = (b"," if size > 1 else b"") + json_key(key) + b":" + _json_head(item, room - size)
            parts.append(piece)
            size += len(piece)
        return b"".join(parts) if size > room else b"".join(parts) + b"}"  # an item may have been cut
    if cls is list and value:
        parts, size = [b"["], 1
        for item in value:
            if size > room:
                return b"".join(parts)
            piece = (b"," if size > 1 else b"") + _json_head(item, room - size)
            parts.append(piece)
            size += len(piece)
        return b"".join(parts) if size > room else b"".join(parts) + b"]"
    return orjson.dumps(value, option=_SHORT_JSON, default=str)


def describe_op(op: Mapping[str, Any]) -> str:
    """One operation in words, e.g. ``REQUEST = "open notepad"`` or ``vars.n += 1``."""
    key = op_key(op)
    name = op.get("name")
    if name is not None and name in RETIRED:
        key += " (retired)"
    elif name is not None and name in RENAMED:
        key += f" (now {stored_name(name)})"
    if op.get("path"):
        key += "".join(f"[{p!r}]" for p in op["path"])
    kind = op["op"]
    if kind == "set":
        return f"{key} = {short(op['value'])}"
    if kind == "delete":
        return f"del {key}"
    if kind == "incr":
        return f"{key} += {op['by']}"
    if kind == "append":
        return f"{key} += [{short(op['value'])}]"
    if kind == "cas":
        return f"{key} = {short(op['value'])} (was {short(op['expected'])})"
    if kind == "sealed":
        return f"{key} = <encrypted>"
    return f"{kind} {key}"


def listed_row(summary: Any) -> dict[str, Any]:
    """A row of ``saucer sessions`` (and ``--json``) from a :class:`~saucer.store.summary.SessionSummary`
    of :meth:`saucer.store.EventStore.list_sessions`, without reading the log.

    A session the engine did not make (status ``-``) has no rounds, steps or cost (None).
    """
    row = summary.row()  # the viewer shows the same fields from the same function
    return {
        "id": row["id"],
        "task": row["task"],
        "mode": row["mode"],
        "status": row["status"],
        "rounds": row["rounds"],
        "steps": row["steps"],
        "cost": row["cost"],
        "version": row["version"],
        "updated": when(row["updated_at"]),
        "parent": row["parent"],
        "runner": row["runner"],
    }


_SESSION_COLUMNS = ("id", "task", "mode", "status", "rounds", "steps", "cost", "updated")


def _session_cells(row: Mapping[str, Any]) -> tuple[str, ...]:
    fork = f" (fork of {row['parent']})" if row.get("parent") else ""
    return (
        visible(row["id"] + fork),
        visible(str(row["task"])),
        visible(str(row["mode"])),
        str(row["status"]),
        _count(row["rounds"]),
        _count(row["steps"]),
        _cost_text(row),
        # Month to minute of a time; "-" or the number of a stored time no calendar shows (see when()).
        row["updated"][5:16] if row["updated"][4:5] == "-" else row["updated"].split(" ")[0],
    )


def write_sessions(out: Any, rows: Iterable[Mapping[str, Any]]) -> None:
    """``saucer sessions`` for a pipe: a header line, then one line a session, columns two spaces apart; no
    title, box, rule or padding (grep and awk read it). Without rich: 10^4 rows in a blink, nothing cut."""
    cells = [_session_cells(row) for row in rows]
    widths = [max([len(name)] + [len(c[i]) for c in cells]) for i, name in enumerate(_SESSION_COLUMNS)]
    # Every cell but the last padded to its column's width (str.ljust), in one format call a row.
    line = ("  ".join([*(f"{{:<{w}}}" for w in widths[:-1]), "{}"]) + "\n").format
    out.write(line(*_SESSION_COLUMNS))
    out.writelines(line(*c) for c in cells)


def _cost_text(row: Mapping[str, Any]) -> str:
    from saucer.store.summary import (
        cost_text,
    )  # the viewer's rule too; importing the engine costs a listing its start-up

    return cost_text(row.get("cost"), str(row.get("status")))


def _count(value: Any) -> str:
    return "-" if value is None else str(value)


def sessions_table(rows: Iterable[Mapping[str, Any]]) -> Table:
    """The ``saucer sessions`` table; ids are never wrapped or cut (print it with :func:`print_uncut`)."""
    # A light box keeps the columns readable in an 80-column terminal.
    table = Table(title="sessions", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    table.add_column("id", no_wrap=True, overflow="ignore")
    table.add_column("task", overflow="fold", min_width=6)
    for column in ("mode", "status", "rounds", "steps", "cost", "updated"):
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(*(Text(cell) for cell in _session_cells(row)))
    return table


def print_uncut(console: Any, renderable: Any) -> None:
    """Print ``renderable`` at the console's width, or wider when it needs more: nothing is cut (the terminal wraps)."""
    needed = console.measure(renderable, options=console.options.update(width=10_000)).maximum
    width, height = console.size
    if needed <= width:
        console.print(renderable)
        return
    console.size = (needed, height)  # Console.print(width=...) can only narrow the output
    try:
        console.print(renderable)
    finally:
        console.size = (width, height)


def _cells(*values: str) -> list[Text]:
    return [Text(visible(v)) for v in values]


def history_table(events: Iterable[Event], key: str | None) -> Table:
    """Every change (optionally only to ``key``) with version, time, author, round, step."""
    table = Table(title=Text(f"history of {key}" if key else "history"), title_justify="left")
    for column in ("version", "time", "author", "round", "step", "change"):
        table.add_column(column, overflow="fold")
    wanted = None if key is None else Context.history_key(key)
    for event in events:
        for op in event.ops:
            if wanted is not None and op_key(op) != wanted:
                continue
            table.add_row(
                *_cells(
                    str(event.version),
                    when(event.timestamp),
                    event.author,
                    "-" if event.round is None else str(event.round),
                    "-" if event.step is None else str(event.step),
                    describe_op(op),
                )
            )
    return table


def history_rows(events: Iterable[Event], key: str | None) -> Iterator[tuple[str, ...]]:
    """The rows of ``saucer history``: (version, time, author, round, step, change) per operation
    (only those on ``key``, if given), control characters shown as escapes."""
    wanted = None if key is None else Context.history_key(key)
    authors: dict[str, str] = {}
    for event in events:
        if not event.ops:
            continue
        author = authors.get(event.author)
        if author is None:
            author = authors[event.author] = visible(event.author)
        head = (
            str(event.version),
            when(event.timestamp),
            author,
            "-" if event.round is None else str(event.round),
            "-" if event.step is None else str(event.step),
        )
        for op in event.ops:
            if wanted is not None and op_key(op) != wanted:
                continue
            yield (*head, visible(describe_op(op)))


_HISTORY_COLUMNS = ("version", "time", "author", "round", "step", "change")


def write_history(out: Any, events: Iterable[Event], key: str | None, *, sample: int = 500) -> int:
    """``saucer history`` as plain aligned rows on the text stream ``out``, written as the events are read.

    The columns are as wide as the header and the first ``sample`` rows need
    (a wider value later pushes only its own line); the change is last and
    never cut or wrapped. Returns the number of rows.
    """
    rows = history_rows(events, key)
    head: list[tuple[str, ...]] = []
    for row in rows:
        head.append(row)
        if len(head) >= sample:
            break
    widths = [max([len(name)] + [len(row[i]) for row in head]) for i, name in enumerate(_HISTORY_COLUMNS[:-1])]

    def line(row: tuple[str, ...]) -> str:
        return "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])) + "  " + row[-1] + "\n"

    out.write(line(_HISTORY_COLUMNS))
    count = 0
    for row in head:
        out.write(line(row))
        count += 1
    for row in rows:
        out.write(line(row))
        count += 1
    return count


def shown(value: Any, width: int = 60) -> str:
    """How ``state`` and ``diff`` write a value in text: :func:`short`, with an empty string as ``""``
    (zero, false and null are written as JSON writes them: ``0``, ``0.0``, ``false``, ``null``)."""
    return '""' if isinstance(value, str) and value == "" else short(value, width)


def state_table(state: Mapping[str, Any], title: str) -> Table:
    """Every value of a state (names and ``vars.*``), empty ones included, for a terminal."""
    table = Table(title=Text(title), title_justify="left")
    table.add_column("key", no_wrap=True)
    table.add_column("value", overflow="fold")
    for key, value in state.items():
        table.add_row(*_cells(key, shown(value, 200)))
    return table


def state_lines(state: Mapping[str, Any], title: str) -> Iterator[str]:
    """:func:`state_table` as plain lines (``KEY = VALUE``), for a pipe."""
    yield visible(title)
    for key, value in state.items():
        yield f"{visible(key)} = {shown(value, 200)}"


def diff_table(diff: Mapping[str, Mapping[str, Any]], v1: int, v2: int) -> Table:
    """Keys that changed between two versions, for a terminal."""
    table = Table(title=f"changes from v{v1} to v{v2}", title_justify="left")
    table.add_column("key", no_wrap=True)
    table.add_column(f"v{v1}", overflow="fold")
    table.add_column(f"v{v2}", overflow="fold")
    for key, change in diff.items():
        table.add_row(*_cells(key, shown(change["before"], 80), shown(change["after"], 80)))
    return table


def diff_lines(diff: Mapping[str, Mapping[str, Any]], v1: int, v2: int) -> Iterator[str]:
    """:func:`diff_table` as plain lines (``KEY: BEFORE -> AFTER``), for a pipe."""
    yield f"changes from v{v1} to v{v2}"
    for key, change in diff.items():
        yield f"{visible(key)}: {shown(change['before'], 80)} -> {shown(change['after'], 80)}"


def plain_lines(lines: Iterable[str]) -> None:
    """Lines to a pipe as they are: no table, no wrapping, no markup."""
    for line in lines:
        sys.stdout.write(line + "\n")


def ended_badly_reason(store: Any, session_id: str, status: str) -> str | None:
    """Why a session ended ``failed`` or ``error`` (one line, as stored), else None."""
    if status not in ("failed", "error"):
        return None
    from saucer.engine.status import stored_status

    return str(stored_status(store, session_id).summary.get("reason") or "") or None
