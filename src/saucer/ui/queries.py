"""What the viewer's pages show, read through the store API (no HTML here).

The sessions listing is one :meth:`~saucer.store.EventStore.list_sessions`
call (one query on every backend of saucer, whatever the number of sessions,
reading each session's kept summary and never its meta or log), then filters,
sorting and paging in memory. A session's page reads its log
once. Every answer is plain data; :mod:`saucer.ui.render` turns it into HTML.
"""

from __future__ import annotations

import datetime as _dt
import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from saucer.context import Context
from saucer.context.events import op_key
from saucer.context.queries import diff_of
from saucer.context.types import Change
from saucer.engine.logs import EVALUATION_LOG, REQUEST_LOG, read_evaluation_log, read_request_log
from saucer.engine.status import ENDED, NOT_STARTED
from saucer.store import Event, EventStore, SessionInfo, SessionNotFoundError
from saucer.store.summary import SORT_KEYS, SessionSummary
from saucer.ui.steps import Tallies, item_of, rounds_view

__all__ = [
    "SessionQuery",
    "SessionsPage",
    "list_sessions",
    "SessionView",
    "session_view",
    "session_row_of",
    "session_logs",
    "session_log_folder",
    "state_at",
    "diff",
    "history",
    "Histories",
    "SORTS",
    "PAGE_SIZE",
]

PAGE_SIZE = 50
#: The columns the sessions table sorts by (``updated``: most recently updated first by default).
SORTS = ("updated", "created", "id", "task", "mode", "status", "steps", "cost", "version", "duration")


def _day(text: str | None, offset_minutes: int, end: bool) -> float | None:
    """``YYYY-MM-DD`` in the viewer's zone (``offset_minutes`` as JavaScript's getTimezoneOffset) as epoch seconds."""
    if not text:
        return None
    try:
        day = _dt.date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a date like 2026-11-23") from None
    if end:
        day += _dt.timedelta(days=1)
    zone = _dt.timezone(-_dt.timedelta(minutes=offset_minutes))
    return _dt.datetime(day.year, day.month, day.day, tzinfo=zone).timestamp()


@dataclass(frozen=True)
class SessionQuery:
    """Filters, search, sorting and page of the sessions table (the page's query string)."""

    status: str = ""
    mode: str = ""
    task: str = ""
    since: str = ""  # a date, in the viewer's zone
    until: str = ""
    tz_offset: int = 0  # minutes, as JavaScript's Date.getTimezoneOffset()
    q: str = ""  # search over id, task and request text (case-insensitive)
    sort: str = "updated"
    desc: bool = True
    page: int = 1

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> SessionQuery:
        """Read a query string; a bad value is a :class:`ValueError` naming the parameter."""

        def number(name: str, default: int, low: int, high: int) -> int:
            raw = params.get(name, "")
            if raw == "":
                return default
            try:
                value = int(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a whole number") from None
            return max(low, min(value, high))

        sort = params.get("sort", "updated") or "updated"
        if sort not in SORTS:
            raise ValueError(f"sort={sort!r} is not one of {', '.join(SORTS)}")
        query = cls(
            status=params.get("status", ""),
            mode=params.get("mode", ""),
            task=params.get("task", ""),
            since=params.get("since", ""),
            until=params.get("until", ""),
            tz_offset=number("tzo", 0, -24 * 60, 24 * 60),
            q=params.get("q", "").strip(),
            sort=sort,
            desc=params.get(
                "dir", "desc" if sort in ("updated", "created", "cost", "steps", "version", "duration") else "asc"
            )
            != "asc",
            page=number("page", 1, 1, 10**9),
        )
        query.window()  # check the dates now
        return query

    def window(self) -> tuple[float | None, float | None]:
        """The date range as epoch seconds (the end is exclusive)."""
        return _day(self.since, self.tz_offset, False), _day(self.until, self.tz_offset, True)

    def params(self, **changes: Any) -> dict[str, str]:
        """This query as query-string parameters (defaults left out), with ``changes`` applied."""
        values = {
            "status": self.status,
            "mode": self.mode,
            "task": self.task,
            "since": self.since,
            "until": self.until,
            "tzo": str(self.tz_offset) if self.since or self.until else "",
            "q": self.q,
            "sort": "" if self.sort == "updated" else self.sort,
            "dir": "asc" if not self.desc else "",
            "page": "" if self.page == 1 else str(self.page),
        }
        values.update({k: str(v) for k, v in changes.items()})
        return {k: v for k, v in values.items() if v}


@dataclass
class SessionsPage:
    """One page of the sessions table, and what its filters can choose from."""

    rows: list[dict[str, Any]]
    total: int  # sessions matching the filters
    page: int
    pages: int
    statuses: list[str]
    modes: list[str]
    tasks: list[str]
    store_total: int  # sessions this viewer may see, unfiltered
    status_counts: list[tuple[str, int]] = field(default_factory=list)  # per status, the other filters applied
    total_cost: float = 0.0  # of the sessions matching the filters, those with a known cost
    unknown_costs: int = 0  # how many of them have no known cost


#: The statuses a session can have (see :mod:`saucer.engine.status`).
STATUSES = ("running", "interrupted", NOT_STARTED, *sorted(ENDED), "-")


def _cost(s: SessionSummary) -> float | None:
    return s.counts()[2]  # the cost as listed: none for a session the engine did not make


#: The value each column of the table sorts by, from a summary (None: last, either way).
_SORT_VALUE: dict[str, Any] = {
    # text by code point, as the store's listing (``saucer sessions --sort``) orders it; no task or mode last
    "updated": lambda s: s.updated_at,
    "created": lambda s: s.created_at,
    "id": lambda s: s.session_id,
    "task": lambda s: s.task,
    "mode": lambda s: s.mode,
    "status": lambda s: s.status,
    "steps": lambda s: s.counts()[1],
    "cost": _cost,
    "version": lambda s: s.version,
    "duration": lambda s: s.updated_at - s.created_at,
}


#: The columns the store's listing sorts as the table does (its ``steps`` counts a session the engine did not
#: make as 0 where the table shows none, and it has no mode or duration to sort by).
_STORE_SORTS = frozenset(SORT_KEYS) & {"updated", "created", "id", "task", "status", "cost", "version"}


def _sorted(rows: list[SessionSummary], sort: str, desc: bool) -> list[SessionSummary]:
    """Rows in the order of ``sort``; an unknown number (None) last both ways, as ``saucer sessions`` sorts."""
    rows = sorted(rows, key=lambda s: s.session_id)  # ties by id, ascending either way (as the store's listing)
    value = _SORT_VALUE[sort]
    keyed = [(value(s), s) for s in rows]  # each value computed once
    known = sorted((pair for pair in keyed if pair[0] is not None), key=lambda pair: pair[0], reverse=desc)
    return [s for _, s in known] + [s for v, s in keyed if v is None]


def list_sessions(
    store: EventStore, query: SessionQuery, allowed: Iterable[str] | None = None, *, page_size: int = PAGE_SIZE
) -> SessionsPage:
    """The sessions matching ``query`` (only those in ``allowed`` unless it is None), one page of them.

    One :meth:`~saucer.store.EventStore.list_sessions` call whatever the number
    of sessions (the summaries hold status, steps and cost already); the
    filters, the search, the counts and the sorting run over those summaries in
    one pass each, and the rows shown are :meth:`SessionSummary.row`, what
    ``saucer sessions --json`` shows.
    """
    # The store sorts by what it lists the same way (None last, ties by id); steps and duration are sorted here.
    by_store = query.sort in _STORE_SORTS
    order: dict[str, Any] = {"sort": query.sort, "descending": query.desc} if by_store else {}
    listed = store.list_sessions(**order) if allowed is None else store.list_sessions(ids=allowed, **order)
    modes: set[str] = set()
    tasks: set[str] = set()
    start, end = query.window()
    needle = query.q.casefold()
    counts: dict[str, int] = {}
    rows: list[SessionSummary] = []
    for s in listed:  # one pass: the choices of the filters, the filters, the counts per status
        mode = "-" if s.mode is None else s.mode
        task = "-" if s.task is None else s.task
        modes.add(mode)
        tasks.add(task)
        if (
            (query.mode and mode != query.mode)
            or (query.task and task != query.task)
            or (start is not None and s.updated_at < start)
            or (end is not None and s.created_at >= end)
            or (
                needle
                and needle not in s.session_id.casefold()
                and needle not in task.casefold()
                and needle not in (s.request or "").casefold()
            )
        ):
            continue
        counts[s.status] = counts.get(s.status, 0) + 1  # what each status would show, the other filters applied
        if not query.status or s.status == query.status:
            rows.append(s)
    if not by_store:
        rows = _sorted(rows, query.sort, query.desc)
    total_cost, unknown = 0.0, 0
    for s in rows:
        cost = _cost(s)
        if cost is not None:
            total_cost += cost
        elif s.status != "-":
            unknown += 1
    pages = max(1, -(-len(rows) // page_size))
    page = min(query.page, pages)
    shown = [s.row() for s in rows[(page - 1) * page_size : page * page_size]]
    return SessionsPage(
        shown,
        len(rows),
        page,
        pages,
        list(STATUSES),
        sorted(modes),
        sorted(tasks),
        len(listed),
        [(s, counts[s]) for s in STATUSES if s in counts],
        total_cost,
        unknown,
    )


@dataclass
class SessionView:
    """Everything a session's page shows."""

    info: SessionInfo
    row: dict[str, Any]  # :meth:`SessionSummary.row`: the numbers ``saucer sessions/show --json`` show
    rounds: list[dict[str, Any]]  # see :func:`saucer.ui.steps.shape_rounds`
    first: int  # the first readable version
    forks: list[SessionInfo]
    parent: str | None
    calls: list[dict[str, Any]] = field(default_factory=list)  # LLM calls from the request log
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    log_problem: str | None = None
    shown_from: int = 0  # the oldest version whose event is listed (older ones are paged away)
    first_failure: int | None = None  # the version of the first failed step shown
    path: dict[str, Any] = field(default_factory=dict)  # see :func:`saucer.ui.steps.path_of`
    parent_version: int | None = None
    log_folder: str | None = None


def _logs(folder: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str | None]:
    """The session's request and evaluation logs, from the folder its ``LOG_PATH`` names."""
    if not folder or not Path(folder).is_dir():
        return [], [], None
    try:
        calls = [entry.model_dump(mode="json") for entry in read_request_log(Path(folder) / REQUEST_LOG)]
        verdicts = [entry.model_dump(mode="json") for entry in read_evaluation_log(Path(folder) / EVALUATION_LOG)]
    except (OSError, ValueError) as exc:
        return [], [], f"the logs in {folder} could not be read: {exc}"
    return calls, verdicts, None


def _ended_verdicts(store: EventStore, sid: str) -> list[dict[str, Any]]:
    """The verdicts of a session that wrote no log folder (a service plan session, ``service.session_logs``),
    as its end event keeps them, stamped with the end's time ([]: it has not ended)."""
    heads = store.session_heads([sid])
    last = heads[0].last if heads else None
    if last is None or last.meta.get("kind") != "session_end":
        return []
    found = last.meta.get("evaluations")
    if not isinstance(found, list):
        return []
    return [{**e, "timestamp": last.timestamp} for e in found if isinstance(e, dict)]


def session_logs(store: EventStore, sid: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str | None]:
    """The session's LLM calls and evaluations from its logs (and a problem reading them, if any)."""
    return _logs(session_log_folder(store, sid))


def session_log_folder(store: EventStore, sid: str) -> str | None:
    """The session's ``LOG_PATH`` at its head (from the Context, a bounded read)."""
    return ledgers(store, sid)[2]


def ledgers(store: EventStore, sid: str) -> tuple[dict[int, float | None], dict[int, int], str | None]:
    """The Context's per-round ledgers at the head, ``ROUND_COST`` and ``ROUND_STEP`` (what
    ``saucer state`` shows), and its ``LOG_PATH`` (None: not set); a bounded read (snapshot + tail)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ctx = Context.open(store, sid, create=False)
    try:
        costs = {int(k): v for k, v in (ctx.get("ROUND_COST") or {}).items()}
        steps = {int(k): int(v) for k, v in (ctx.get("ROUND_STEP") or {}).items()}
        folder = ctx.get("LOG_PATH")
    finally:
        ctx.close()
    return costs, steps, folder if isinstance(folder, str) and folder else None


def session_row_of(store: EventStore, sid: str) -> dict[str, Any]:
    """The session's columns from its kept summary (:meth:`SessionSummary.row`), as the table and the CLI show them."""
    found = store.list_sessions(ids=[sid])
    if not found:
        raise SessionNotFoundError(sid)
    return found[0].row()


def session_view(
    store: EventStore, sid: str, *, limit: int = 200, before: int | None = None, tallies: Tallies | None = None
) -> SessionView:
    """A session's row, rounds (each with its steps, cost, tokens and time), forks, path and logs.

    Every round is summarised (from ``tallies``, which reads only what was committed since the
    last page of this session); only ``limit`` events are listed in full: the newest ones, or the
    newest before version ``before``.
    """
    info = store.session_info(sid)
    row = session_row_of(store, sid)
    tally = (tallies or Tallies(1)).of(store, info)
    first = store.first_version(sid)
    costs, steps, folder = ledgers(store, sid)
    calls, verdicts, problem = _logs(folder)
    if folder is None:
        verdicts = _ended_verdicts(store, sid)
    upto = info.version if before is None else max(min(before - 1, info.version), first - 1)
    low = max(upto - limit, first - 1)  # shown: versions low+1..upto; the one at low gives the first its start
    events = list(store.read(sid, max(low - 1, first - 1, 0), upto)) if upto > low else []
    shown: list[dict[str, Any]] = []
    previous: float | None = None
    for event in events:
        item = item_of(event, previous)
        previous = event.timestamp
        if event.version > low:
            shown.append(item)
    rounds = rounds_view(tally, shown, calls, (costs, steps))
    parent = info.parent_id or info.meta.get("forked_from")
    at = info.parent_version if info.parent_id else info.meta.get("at")
    return SessionView(
        info,
        row,
        rounds,
        first,
        store.forks(sid),
        parent if isinstance(parent, str) else None,
        calls,
        verdicts,
        problem,
        shown[0]["version"] if shown else info.version + 1,
        tally.first_failure,
        tally.path(),
        at if isinstance(at, int) else None,
        folder,
    )


def state_at(store: EventStore, sid: str, at: int | None) -> tuple[int, dict[str, Any]]:
    """The version read (the head when ``at`` is None) and the state there: names and ``vars.NAME`` flattened."""
    version = store.head(sid) if at is None else store.check_readable(sid, at)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ctx = Context.open(store, sid, create=False, at=version)
        names = ctx.to_dict(ensure_serializable=True)
    try:
        names.pop("_vars", None)
        flat = dict(names)
        flat.update({f"vars.{k}": v for k, v in ctx.vars.items()})
    finally:
        ctx.close()
    return version, flat


def diff(store: EventStore, sid: str, v1: int, v2: int) -> dict[str, Change]:
    """Keys whose values differ between two versions: ``{key: {"before": a, "after": b}}``
    (:meth:`Context.diff`'s answer, from one hydrate: :func:`~saucer.context.queries.diff_of`)."""
    store.check_readable(sid, v1)
    store.check_readable(sid, v2)
    return diff_of(store, sid, v1, v2)


def history(store: EventStore, sid: str, key: str, kept: Histories | None = None) -> list[dict[str, Any]]:
    """Every change to ``key`` (a name or ``vars.NAME``): version, time, author, round, step and the operation.

    With ``kept`` (the viewer's), a later view of the same key reads only the events committed since."""
    if kept is not None:
        return kept.of(store, store.session_info(sid), key)
    return _changes(store, sid, Context.history_key(key), 0, None)


def _changes(store: EventStore, sid: str, wanted: Any, after: int, upto: int | None) -> list[dict[str, Any]]:
    changes: list[dict[str, Any]] = []
    for event in store.read(sid, after, upto):
        for op in event.ops:
            if op_key(op) == wanted:
                changes.append(_change(event, op))
    return changes


class Histories:
    """The changes of the keys whose history was shown last (``size`` of them), each brought up to
    date by reading only the events committed since."""

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[str, str, float], tuple[int, int, list[dict[str, Any]]]] = OrderedDict()

    def of(self, store: EventStore, info: SessionInfo, key: str) -> list[dict[str, Any]]:
        """Every change to ``key`` in ``info``'s session up to ``info.version``."""
        wanted = Context.history_key(key)
        slot = (info.session_id, key, info.created_at)
        with self._lock:
            version, since, changes = self._kept.pop(slot, (0, 0, []))
        first = store.first_version(info.session_id)
        if version > info.version or since != first:  # a prune rewrote the log's start: read it again
            version, changes = 0, []
        changes = changes + _changes(store, info.session_id, wanted, version, info.version)
        with self._lock:
            self._kept[slot] = (info.version, first, changes)
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
        return list(changes)


def _change(event: Event, op: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "version": event.version,
        "time": event.timestamp,
        "author": event.author,
        "round": event.round,
        "step": event.step,
        "op": dict(op),
    }
