"""Which events an inspection command shows, read as a stream: ``--limit``, ``--since``, ``--round``.

``saucer history`` and ``saucer show`` read a session's log through
:meth:`~saucer.store.EventStore.iter_events` (a batch of versions at a time)
and write each event as it is read, so their memory does not grow with the
session. A :class:`Window` says which versions to read and which events of
them to keep; ``--limit N`` keeps the newest N, reading only the last N
versions when nothing else filters (otherwise it keeps N in a ring while
reading).
"""

from __future__ import annotations

import collections
import datetime as _dt
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import typer

from saucer.cli.common import UserError
from saucer.store import Event, EventStore

__all__ = ["Window", "parse_since", "window_for", "LimitOption", "SinceOption", "RoundOption"]

LimitOption = typer.Option(
    None, "--limit", "-n", min=1, help="Only the newest N events (versions) of those the other options select."
)
SinceOption = typer.Option(
    None,
    "--since",
    help="From this version on (e.g. 120 or v120), or from this time on: 2026-11-26T19:30, '2026-11-26 19:30:05', "
    "19:30 (today), or a duration ago (90s, 15m, 2h, 3d).",
)
RoundOption = typer.Option(None, "--round", min=0, help="Only the events of round N.")

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str, now: float | None = None) -> tuple[str, float]:
    """``("version", N)`` for ``N``/``vN``, else ``("time", epoch seconds)`` for a local date-time,
    a time of today, or a duration ago; :class:`UserError` otherwise."""
    raw = text.strip()
    number = raw[1:] if raw[:1] in ("v", "V") else raw
    if number.isdigit():
        return "version", int(number)
    match = _DURATION.match(raw.lower())
    if match:
        ago = float(match.group(1)) * _UNITS[match.group(2)]
        return "time", (now if now is not None else _dt.datetime.now().timestamp()) - ago
    try:
        when = _dt.datetime.fromisoformat(raw)
    except ValueError:
        try:
            clock = _dt.time.fromisoformat(raw)
        except ValueError:
            raise UserError(
                f"--since {text!r} is neither a version (120 or v120), a time (2026-11-26T19:30 or 19:30) "
                "nor a duration ago (90s, 15m, 2h, 3d)"
            ) from None
        when = _dt.datetime.combine(_dt.date.today(), clock)
    return "time", when.timestamp()


@dataclass
class Window:
    """The versions a command reads (``after < v <= upto``), the events it keeps, and how many it may show."""

    session_id: str
    after: int
    upto: int
    keep: Callable[[Event], bool] | None = None
    limit: int | None = None
    first: int = 1  #: the session's first readable version
    capped: bool = False  #: whether a default limit (not the user's) may cut the window
    _after_since: int = 0
    matched: int = 0  #: events the filter kept so far (all of them once :meth:`events` is consumed)

    @property
    def total(self) -> int:
        """Readable versions of the session up to ``upto``."""
        return max(0, self.upto - self.first + 1)

    def events(self, store: EventStore) -> Iterator[Event]:
        """The selected events, oldest first, read as a stream (at most ``limit`` kept in memory)."""
        stream = store.iter_events(self.session_id, self.after, self.upto)
        if self.keep is not None:
            stream = self._kept(stream, self.keep)
        if self.limit is None or self.keep is None:
            return stream  # an unfiltered limit is already in the versions read
        return iter(collections.deque(stream, maxlen=self.limit))

    def _kept(self, stream: Iterator[Event], keep: Callable[[Event], bool]) -> Iterator[Event]:
        for event in stream:
            if keep(event):
                self.matched += 1
                yield event

    def hint(self, shown: int, noun: str = "events") -> str | None:
        """``showing the last N of M ...`` when a default limit cut what is shown, else None."""
        if not self.capped:
            return None
        total = self.matched if self.keep is not None else self.upto - max(self.first - 1, self._after_since)
        if shown >= total:
            return None
        return f"showing the last {shown} of {total} {noun} (choose with --limit N, --since VERSION|TIME, --round N; piped, all of them)"


def _first_at_or_after(store: EventStore, session_id: str, lo: int, hi: int, ts: float) -> int:
    """The first version in ``lo..hi`` committed at or after ``ts`` (``hi + 1`` if none), by bisection
    (commit times grow with versions), one single-event read per probe."""
    while lo <= hi:
        mid = (lo + hi) // 2
        event = next(iter(store.read(session_id, mid - 1, mid)), None)
        if event is not None and event.timestamp >= ts:
            hi = mid - 1
        else:
            lo = mid + 1
    return lo


def window_for(
    store: EventStore,
    session_id: str,
    *,
    limit: int | None = None,
    since: str | None = None,
    round: int | None = None,
    keep: Callable[[Event], bool] | None = None,
    default_limit: int | None = None,
) -> Window:
    """The window of ``--limit``/``--since``/``--round`` (and a filter such as ``--key``) over the session's log.

    ``default_limit`` applies when the user gave no ``--limit`` (a terminal
    shows what fits a screen); :attr:`Window.capped` then says it cut something.
    """
    info = store.session_info(session_id)
    first = max(1, store.first_version(session_id))
    upto = info.version
    after = first - 1
    if since is not None:
        kind, value = parse_since(since)
        if kind == "version":
            after = max(after, int(value) - 1)
        else:
            after = _first_at_or_after(store, session_id, first, upto, value) - 1
    filters = [f for f in (keep, None if round is None else (lambda e, r=round: e.round == r)) if f is not None]
    keep_event = filters[0] if len(filters) == 1 else (lambda e: all(f(e) for f in filters)) if filters else None
    window = Window(session_id, after, upto, keep_event, limit, first)
    window._after_since = after
    if limit is None and default_limit is not None:
        window.limit = default_limit
        if keep_event is not None or upto - after > default_limit:
            window.capped = True  # the caller says so only if it did cut (see shown())
        else:
            window.limit = None
    if window.limit is not None and keep_event is None:
        window.after = max(window.after, upto - window.limit)
    return window
