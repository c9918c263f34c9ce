"""A session's timeline for the terminal: rounds, then each step's agent, commands, results, cost and changes.

Built one event at a time (:func:`timeline_entries`) into a rich tree
(:func:`timeline`) or plain lines (:func:`write_timeline`); the same events as
data come from :mod:`saucer.engine.overview`. The value formatting it shares
with the other views is :mod:`saucer.cli.inspect`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from rich.console import Group
from rich.text import Text
from rich.tree import Tree

from saucer.cli.conversation import CONVERSATION_KEY, conversation_lines
from saucer.cli.inspect import PlainText, describe_op, short, when
from saucer.cli.output import visible
from saucer.context import Event
from saucer.context.events import op_key

__all__ = [
    "BOOKKEEPING",
    "timeline",
    "timeline_data",
    "timeline_entries",
    "timeline_items",
    "write_timeline",
]

_STATUS_STYLE = {"success": "green", "failure": "red", "skipped": "yellow", "none": "dim"}


def _commands_text(meta: Mapping[str, Any], Text: Any = Text) -> list[Any]:
    """One line per command of a step: tool, parameters, status and the result or error."""
    lines: list[Text] = []
    commands = meta.get("commands") or []
    results = meta.get("results") or []
    for index, command in enumerate(commands):
        result = results[index] if index < len(results) else {}
        status = str(result.get("status", "-"))
        line = Text("  → ")
        line.append(visible(str(command.get("tool_name", "?"))), style="bold")
        line.append(f"({short(command.get('parameters', {}), 50)}) ")
        line.append(status, style=_STATUS_STYLE.get(status, ""))
        detail = result.get("error") or result.get("result")
        if detail not in (None, ""):
            line.append(f"  {short(detail, 70)}", style="dim")
        lines.append(line)
    return lines


def _artifacts_text(meta: Mapping[str, Any], Text: Any = Text) -> list[Any]:
    """One line per artifact saved before a step (``system.save_ui_tree``, operator modes), or after a round's
    last step (marked ``after``): its file, or why not."""
    lines: list[Text] = []
    for entry in meta.get("artifacts") or []:
        if not isinstance(entry, Mapping):
            continue
        kind = str(entry.get("kind", "artifact")).replace("_", " ") + (" after the step" if entry.get("after") else "")
        line = Text(f"  {visible(kind)}: ")
        if entry.get("error"):
            line.append(f"not saved: {short(entry['error'], 100)}", style="yellow")
        elif entry.get("path"):
            line.append(visible(str(entry["path"])))
            if entry.get("nodes") is not None:
                line.append(f" ({visible(str(entry['nodes']))} elements)", style="dim")
            elif entry.get("width") is not None:
                line.append(f" ({visible(str(entry['width']))}x{visible(str(entry.get('height')))})", style="dim")
        else:
            line.append(f"read, not saved ({visible(str(entry.get('nodes', '?')))} elements)", style="dim")
        lines.append(line)
    return lines


#: Counters and logs the engine updates on every step; collapsed in the timeline unless asked for.
BOOKKEEPING = frozenset(
    {
        "SESSION_STEP",
        "ROUND_STEP",
        "ROUND_SUBTASK_AMOUNT",
        "STRUCTURAL_LOGS",
        "PREVIOUS_SUBTASKS",
        "ROUND_COST",
        "SESSION_COST",
    }
)

_SYSTEM_KINDS = {
    "session_start": "session started",
    "round_end": "round ended",
    "session_end": "session ended",
}


def _changes(event: Event, show_all: bool, Text: Any = Text) -> Any:
    shown: list[str] = []
    hidden = 0
    for op in event.ops:
        key = op_key(op)
        if not show_all and CONVERSATION_KEY.match(key):
            continue  # shown as the conversation (conversation_lines)
        if not show_all and key in BOOKKEEPING:
            hidden += 1
            continue
        if not show_all and key == "TOOL_INFO" and op["op"] == "set" and isinstance(op.get("value"), dict):
            shown.append(f"TOOL_INFO = ({len(op['value'])} tools)")
            continue
        shown.append(describe_op(op))
    if not shown and not hidden:
        return None
    limit = len(shown) if show_all else 6
    text = "; ".join(shown[:limit])
    if len(shown) > limit:
        text += f" (+{len(shown) - limit} more)"
    if hidden:
        text += f"{'; ' if shown else ''}+{hidden} counter/log update{'s' if hidden != 1 else ''}"
    return Text("  changes: " + visible(text), style="green")


def _system_line(event: Event, Text: Any = Text) -> Any:
    from saucer.engine.approvals import approval_line

    meta = event.meta
    kind = meta.get("kind")
    approval = approval_line(event)
    if approval is not None:
        line = Text(f"v{event.version} ", style="dim")
        line.append(short(approval, 160), style="yellow")
        return line
    if kind == "round_start":
        return None  # the round's heading says it
    label = _SYSTEM_KINDS.get(kind or "")
    if label is None:
        return None
    if kind == "round_end":
        label = f"round {meta.get('round_status', 'ended')}"
    elif kind == "session_end":
        label = f"session {meta.get('session_status', 'ended')}"
    elif kind == "session_start":
        label = f"session started ({meta.get('mode', '?')} mode)"
    line = Text(f"v{event.version} ", style="dim")
    line.append(label, style="bold")
    reason = meta.get("reason") or (meta.get("summary") or {}).get("reason")
    if reason:
        line.append(f": {short(reason, 80)}")
    if meta.get("error"):
        line.append(f"  {short(meta['error'], 80)}", style="red")
    if kind == "session_end" and isinstance(meta.get("skipped"), dict) and meta["skipped"]:
        line.append(f"  (skipped: {', '.join(str(k) for k in meta['skipped'])})", style="yellow")
    return line


def timeline_entries(
    events: Iterable[Event], *, show_all: bool = False, text: Any = Text
) -> Iterator[tuple[Any, str, bool, list[Any]]]:
    """Each event of a timeline as ``(round key, round label, renames, its lines)``: the label its
    round has if this event is the round's first; ``renames`` when it names the round anyway (a round
    start with a request); no lines for an event that shows nothing. One event at a time: the tree
    and the plain text are both built from these (lines of ``text``: rich's Text, or :class:`PlainText`)."""
    Text = text
    for event in events:
        meta = event.meta
        round_key = event.round if event.round is not None else "-"
        label = "session" if meta.get("kind") == "session_start" else f"round {round_key}"
        if meta.get("request"):
            label += f": {short(meta['request'], 70)}"
        renames = meta.get("kind") == "round_start" and bool(meta.get("request"))
        changes = _changes(event, show_all, Text)
        system = _system_line(event, Text) if event.step is None and meta.get("kind") else None
        if system is not None or (meta.get("kind") == "round_start" and not show_all):
            parts: list[Any] = [system] if system is not None else []
            if show_all and changes is not None:
                parts.append(changes)
            yield round_key, label, renames, parts
            continue
        head = Text(f"v{event.version} ", style="dim")
        if event.step is not None:
            head.append(f"step {meta.get('session_step', event.step)} ", style="bold")
        head.append(visible(str(meta.get("agent") or event.author)))
        if meta.get("state"):
            head.append(f" [{visible(str(meta['state']))}]", style="magenta")
        if meta.get("status"):
            head.append(f" → {visible(str(meta['status']))}")
        if "cost" in meta and meta["cost"] is None:
            head.append(" cost unknown", style="yellow")
        elif isinstance(meta.get("cost"), (int, float)) and meta["cost"]:
            head.append(f" cost {meta['cost']:.4f}", style="yellow")
        head.append(f"  {when(event.timestamp)}", style="dim")
        parts = [head]
        if meta.get("subtask"):
            parts.append(Text(f"  subtask: {short(meta['subtask'], 80)}"))
        parts.extend(_artifacts_text(meta, Text))
        parts.extend(Text("  " + line, style="cyan") for line in conversation_lines(event))
        parts.extend(_commands_text(meta, Text))
        if changes is not None:
            parts.append(changes)
        if meta.get("error"):
            parts.append(Text(f"  error: {visible(str(meta['error']))}", style="red"))
        yield round_key, label, renames, parts


def timeline(events: Iterable[Event], title: str, *, show_all: bool = False) -> Tree:
    """Rounds → steps: agent, state, commands, results, cost, and each step's Context changes.

    Engine bookkeeping (step counters, structural logs) is summarised unless ``show_all``.
    """
    tree = Tree(Text(title, style="bold"))
    rounds: dict[Any, Tree] = {}
    for round_key, label, renames, parts in timeline_entries(events, show_all=show_all):
        branch = rounds.get(round_key)
        if branch is None:
            branch = rounds[round_key] = tree.add(Text(label, style="cyan"))
        elif renames:
            branch.label = Text(label, style="cyan")
        if parts:
            branch.add(Group(*parts))
    if not rounds:
        tree.add(Text("(no events yet)", style="dim"))
    return tree


def write_timeline(out: Any, events: Iterable[Event], title: str, *, show_all: bool = False) -> int:
    """The timeline as plain lines on the text stream ``out``, written as the events are read
    (a round's heading, then its events indented); returns the number of events."""
    out.write(title + "\n")
    current: Any = object()
    count = 0
    for round_key, label, renames, parts in timeline_entries(events, show_all=show_all, text=PlainText):
        count += 1
        if round_key != current or renames:
            current = round_key
            out.write(label + "\n")
        for part in parts:
            out.write("  " + part.plain + "\n")
    if not count:
        out.write("  (no events yet)\n")
    return count


def timeline_data(events: list[Event]) -> dict[str, Any]:
    """The timeline as data (``saucer show --json``); see :func:`saucer.engine.overview.timeline_data`."""
    from saucer.engine.overview import timeline_data as data

    return data(events)


def timeline_items(events: Iterable[Event]) -> Iterator[dict[str, Any]]:
    """The events of :func:`timeline_data`, one by one as they are read; see :func:`saucer.engine.overview.timeline_items`."""
    from saucer.engine.overview import timeline_items as items

    return items(events)
