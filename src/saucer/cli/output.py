"""How the command line writes: literally, and without wrapping when the output is not a terminal.

Stored values, messages and names are printed exactly as they are stored:
consoles never interpret rich markup (``[bold]``) or emoji codes (``:smile:``)
in text, and styles come only from :class:`rich.text.Text` spans. Output to a
pipe or a file is never wrapped, so a line can be copied, grepped or parsed
whatever its length; in a terminal, rich lays out to the terminal's width.
"""

from __future__ import annotations

import sys
from typing import Any

import orjson
from rich.console import Console
from rich.text import Text

__all__ = ["make_console", "print_json", "styled", "visible", "PIPE_WIDTH"]

#: Width used when the output is not a terminal: wide enough that nothing wraps.
PIPE_WIDTH = 100_000

# Control characters (newline and escape included) would move the cursor or
# recolour the terminal: they are shown as escapes, e.g. "\x1b[2J" as \x1b[2J.
_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x20), *range(0x7F, 0xA0)] if c != 0x09}
_CONTROLS.update({0x0A: "\\n", 0x0D: "\\r"})


def make_console(*, stderr: bool = False) -> Console:
    """A console that prints text literally; to a pipe or a file, lines are never wrapped."""
    options: dict[str, Any] = {"stderr": stderr, "markup": False, "emoji": False, "highlight": False}
    console = Console(**options)
    if not console.is_terminal:
        console = Console(**options, width=PIPE_WIDTH, soft_wrap=True)
    return console


_CONTROLS_BUT_NEWLINE = {**_CONTROLS, 0x0A: None}
del _CONTROLS_BUT_NEWLINE[0x0A]


def visible(text: str, *, lines: bool = False) -> str:
    """``text`` with control characters as escapes (``\\x1b``, and ``\\n`` unless ``lines``); the rest as it is."""
    return text.translate(_CONTROLS_BUT_NEWLINE if lines else _CONTROLS)


def styled(*parts: str | tuple[str, str]) -> Text:
    """A line from plain strings and ``(text, style)`` pairs; no markup is parsed in either."""
    return Text.assemble(*parts)


def print_json(data: Any, stream: Any = None) -> None:
    """Write ``data`` as indented JSON to standard output (or ``stream``), byte for byte, with no styling."""
    text = orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str).decode()
    out = stream if stream is not None else sys.stdout
    out.write(text + "\n")
    out.flush()
