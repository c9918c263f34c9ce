"""How the command line writes: literally, and without wrapping when the output is not a terminal.

Stored values, messages and names are printed exactly as they are stored:
consoles never interpret rich markup (``[bold]``) or emoji codes (``:smile:``)
in text, and styles come only from :class:`rich.text.Text` spans. Output to a
pipe or a file is never wrapped, so a line can be copied, grepped or parsed
whatever its length; in a terminal, rich lays out to the terminal's width.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

import orjson
from rich.console import Console
from rich.text import Text

__all__ = [
    "make_console",
    "print_json",
    "styled",
    "visible",
    "PIPE_WIDTH",
    "JsonStream",
    "JsonObject",
    "TextChunks",
    "binary_stdout",
    "json_key",
]

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
    if text.isprintable():  # no control character (they are not printable): nothing to escape (C speed)
        return text
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


_OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS
_OPTIONS_FLAT = orjson.OPT_NON_STR_KEYS


def json_key(key: Any) -> bytes:
    """An object's key as JSON, as ``orjson.dumps`` with ``OPT_NON_STR_KEYS`` writes it (a non-str key as a string)."""
    if key.__class__ is str:
        return orjson.dumps(key)
    return orjson.dumps({key: 0}, option=_OPTIONS_FLAT, default=str)[1:-3]


#: Dicts and lists longer than this are written item by item by :class:`JsonStream`.
BIG = 256


class JsonObject:
    """An object for :class:`JsonStream` whose ``(key, value)`` pairs are written as they come
    (a value may be made only when its turn comes)."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: Iterable[tuple[Any, Any]]) -> None:
        self.pairs = pairs


def binary_stdout() -> BinaryIO:
    """Standard output for bytes, after what was printed to it as text (rich, ``print``) is flushed."""
    sys.stdout.flush()
    return sys.stdout.buffer


class _Chunks:
    """Writes gathered into chunks of about 64 KB before they reach ``out`` (output of 10^5 events
    would otherwise be a system call a line when stdout is unbuffered, as under ``python -u``)."""

    def __init__(self, out: Any, empty: Any, chunk: int) -> None:
        self._out = out
        self._empty = empty  # "" or b"": what the queued parts are joined with
        self._parts: list[Any] = []
        self._size = 0
        self._chunk = chunk

    def write(self, data: Any) -> None:
        """Queue ``data`` (text or bytes, as the stream takes)."""
        self._parts.append(data)
        self._size += len(data)
        if self._size >= self._chunk:
            self._drain()

    def _drain(self) -> None:
        self._out.write(self._empty.join(self._parts))
        self._parts.clear()
        self._size = 0

    def flush(self) -> None:
        """Write what is queued and flush the stream."""
        self._drain()
        self._out.flush()


class TextChunks(_Chunks):
    """A text stream's ``write`` gathered into chunks of about 64 KB."""

    def __init__(self, out: Any, chunk: int = 1 << 16) -> None:
        super().__init__(out, "", chunk)

    def writelines(self, lines: Iterable[str]) -> None:
        """Queue each of ``lines``."""
        for line in lines:
            self.write(line)

    def __enter__(self) -> TextChunks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush()


class JsonStream(_Chunks):
    """Indented JSON written to a binary stream as its parts arrive: what :func:`print_json`
    writes for the same data, byte for byte, without holding the whole of it.

    An object's value, or an array, may be an iterator: its items are written
    one by one, as they are read (a 10^5-event log never sits in memory).
    """

    def __init__(self, out: BinaryIO, *, chunk: int = 1 << 16) -> None:
        super().__init__(out, b"", chunk)

    @staticmethod
    def _dump(value: Any, depth: int) -> bytes:
        text = orjson.dumps(value, option=_OPTIONS, default=str)
        return text.replace(b"\n", b"\n" + b"  " * depth) if depth else text

    def value(self, value: Any, depth: int = 0) -> None:
        """Write ``value`` at nesting ``depth``. An iterator (not a list or dict) is written as a
        streamed array, a :class:`JsonObject` as a streamed object, and a dict or list of more than
        :data:`BIG` items item by item (never one dump of a whole long log or state)."""
        kind = value.__class__
        if kind is JsonObject:
            self.object(value.pairs, depth)
        elif kind is dict and len(value) > BIG:
            self.object(iter(value.items()), depth)
        elif kind is list and len(value) > BIG:
            self.array(iter(value), depth)
        elif isinstance(value, Iterator):
            self.array(value, depth)
        else:
            self.write(self._dump(value, depth))

    def array(self, items: Iterable[Any], depth: int = 0) -> None:
        """Write ``[...]`` with one item per line block, as each item comes."""
        pad = b"\n" + b"  " * (depth + 1)
        first = True
        for item in items:
            self.write(b"[" + pad if first else b"," + pad)
            first = False
            self.value(item, depth + 1)
        self.write(b"[]" if first else b"\n" + b"  " * depth + b"]")

    def object(self, fields: Iterable[tuple[str, Any]], depth: int = 0) -> None:
        """Write ``{...}`` from ``(key, value)`` pairs in order; a value may be an iterator (a streamed array)."""
        pad = b"\n" + b"  " * (depth + 1)
        first = True
        for key, value in fields:
            self.write((b"{" if first else b",") + pad + json_key(key) + b": ")
            first = False
            self.value(value, depth + 1)
            del value  # let a big part go before the next one is made
        self.write(b"{}" if first else b"\n" + b"  " * depth + b"}")

    def end(self) -> None:
        """End the document with a newline and flush it."""
        self.write(b"\n")
        self.flush()
