"""What the viewer's pages show, read through the store API (no HTML here).

The sessions listing is one :meth:`~saucer.store.EventStore.list_sessions`
call (one query on every backend of saucer, whatever the number of sessions,
reading each session's kept summary and never its meta or log), then filters,
sorting and paging in memory. A session's page reads its log
once. Every answer is plain data; :mod:`saucer.ui.render` turns it into HTML.
"""

from __future__ import annotations

import datetime as _dt
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from saucer.context import Context
from saucer.context.events import op_key
from saucer.engine.logs import EVALUATION_LOG, REQUEST_LOG, read_evaluation_log, read_request_log
from saucer.engine.overview import session_row, timeline_data
from saucer.engine.status import ENDED
from saucer.store import Event, EventStore, SessionHead, SessionInfo
from saucer.store.summary import SessionSummary

__all__ = [
    "SessionQuery",
    "SessionsPage",
    "list_sessions",
    "SessionView",
    "session_view",
    "state_at",
    "diff",
    "history",
    "SORTS",
    "PAGE_SIZE",
]

PAGE_SIZE = 50
#: The columns the sessions table sorts by (``updated``: most recently updated first by default).
SORTS = ("updated", "created", "id", "task", "mode", "status", "steps", "cost", "version")


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
    def from_params(cls, params: Mapping[str, str]) -> "SessionQuery":
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
            desc=params.get("dir", "desc" if sort in ("updated", "created", "cost", "steps", "version") else "asc") != "asc",
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
            "status": self.status, "mode": self.mode, "task": self.task, "since": self.since, "until": self.until,
            "tzo": str(self.tz_offset) if self.since or self.until else "", "q": self.q,
            "sort": "" if self.sort == "updated" else self.sort, "dir": "asc" if not self.desc else "",
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


#: The statuses a session can have (see :mod:`saucer.engine.status`).
STATUSES = ("running", "interrupted", *sorted(ENDED), "-")


def _sort_key(sort: str) -> Any:
    if sort == "updated":
        return lambda r: (r["updated_at"], r["id"])
    if sort == "created":
        return lambda r: (r["created_at"], r["id"])
    if sort in ("steps", "cost", "version"):
        # Unknown numbers sort below every known one.
        return lambda r: (r[sort] is not None, r[sort] or 0, r["id"])
    return lambda r: (str(r[sort]).lower(), r["id"])


def _listed_row(s: SessionSummary) -> dict[str, Any]:
    """A session's columns, named as :func:`~saucer.engine.overview.session_row` names them,
    from the summary its commits keep (its request cut to 500 characters)."""
    rounds, steps, cost = s.counts()
    return {
        "id": s.session_id, "task": "-" if s.task is None else s.task, "mode": "-" if s.mode is None else s.mode,
        "status": s.status, "rounds": rounds, "steps": steps, "cost": cost, "version": s.version,
        "created_at": s.created_at, "updated_at": s.updated_at, "parent": s.origin, "runner": s.runner,
        "request": s.request, "reason": s.reason,
    }


def list_sessions(
    store: EventStore, query: SessionQuery, allowed: Iterable[str] | None = None, *, page_size: int = PAGE_SIZE
) -> SessionsPage:
    """The sessions matching ``query`` (only those in ``allowed`` unless it is None), one page of them.

    One :meth:`~saucer.store.EventStore.list_sessions` call whatever the number
    of sessions (the summaries hold status, steps and cost already); the
    filters, the search and the sorting run over those rows.
    """
    wanted = None if allowed is None else set(allowed)
    rows = [_listed_row(s) for s in store.list_sessions() if wanted is None or s.session_id in wanted]
    modes = sorted({str(r["mode"]) for r in rows})
    tasks = sorted({str(r["task"]) for r in rows})
    store_total = len(rows)
    start, end = query.window()
    needle = query.q.casefold()
    if query.mode:
        rows = [r for r in rows if str(r["mode"]) == query.mode]
    if query.task:
        rows = [r for r in rows if str(r["task"]) == query.task]
    if start is not None:
        rows = [r for r in rows if r["updated_at"] >= start]
    if end is not None:
        rows = [r for r in rows if r["created_at"] < end]
    if needle:
        rows = [
            r for r in rows
            if needle in r["id"].casefold() or needle in str(r["task"]).casefold() or needle in (r["request"] or "").casefold()
        ]
    if query.status:
        rows = [r for r in rows if r["status"] == query.status]
    if query.sort != "updated" or not query.desc:  # the store's order is already most recently updated first
        rows.sort(key=_sort_key(query.sort), reverse=query.desc)
    pages = max(1, -(-len(rows) // page_size))
    page = min(query.page, pages)
    shown = rows[(page - 1) * page_size: page * page_size]
    return SessionsPage(shown, len(rows), page, pages, list(STATUSES), modes, tasks, store_total)


@dataclass
class SessionView:
    """Everything a session's page shows."""

    info: SessionInfo
    row: dict[str, Any]
    rounds: list[dict[str, Any]]  # each: round, request, status, steps, cost, tokens, events (timeline items)
    first: int  # the first readable version
    forks: list[SessionInfo]
    parent: str | None
    calls: list[dict[str, Any]] = field(default_factory=list)  # LLM calls from the request log
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    log_problem: str | None = None
    shown_from: int = 0  # the oldest version whose event is listed (older ones are paged away)


def _log_folder(events: list[Event]) -> str | None:
    """The session's ``LOG_PATH``: the value its newest write of that name set (none when never set)."""
    for event in reversed(events):
        for op in reversed(event.ops):
            if op.get("name") == "LOG_PATH" and op["op"] == "set" and not op.get("path"):
                return op["value"] if isinstance(op["value"], str) else None
    return None


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


def _new_round(key: Any) -> dict[str, Any]:
    return {"round": key, "request": None, "status": None, "steps": 0, "cost": 0.0, "cost_unknown": False, "tokens": 0, "events": []}


def session_view(store: EventStore, sid: str, *, limit: int = 200, before: int | None = None) -> SessionView:
    """A session's row, rounds (each with its steps, cost and tokens), forks and logs.

    Every round is summarised; only ``limit`` events are listed in full: the
    newest ones, or the newest before version ``before``.
    """
    info = store.session_info(sid)
    row = session_row(SessionHead(info, store.last_event(info), store.lease_of(sid)))
    events = list(store.read(sid))
    calls, verdicts, problem = _logs(_log_folder(events))
    rounds: dict[Any, dict[str, Any]] = {}
    for event in events:  # the summary of every round: a light pass over the whole log
        meta = event.meta
        entry = rounds.get(event.round)
        if entry is None:
            entry = rounds[event.round] = _new_round(event.round)
        kind = meta.get("kind") or ("step" if event.step is not None else "change")
        if kind == "round_start":
            entry["request"] = meta.get("request")
        elif kind == "step":
            entry["steps"] += 1
        elif kind == "round_end":
            entry["status"] = meta.get("round_status")
        if "cost" in meta:
            cost = meta["cost"]
            if cost is None:
                entry["cost_unknown"] = True
            elif isinstance(cost, (int, float)) and not isinstance(cost, bool):
                entry["cost"] += cost
    for call in calls:
        entry = rounds.get(call.get("round"))
        if entry is not None:
            entry["tokens"] += int(call.get("prompt_tokens") or 0) + int(call.get("completion_tokens") or 0)
    shown = [e for e in events if before is None or e.version < before][-limit:]
    for item in timeline_data(shown)["events"]:
        rounds[item["round"]]["events"].append(item)
    parent = info.parent_id or info.meta.get("forked_from")
    return SessionView(
        info, row, list(rounds.values()), store.first_version(sid), store.forks(sid),
        parent if isinstance(parent, str) else None, calls, verdicts, problem,
        shown[0].version if shown else info.version + 1,
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


def diff(store: EventStore, sid: str, v1: int, v2: int) -> dict[str, dict[str, Any]]:
    """Keys whose values differ between two versions: ``{key: {"before": a, "after": b}}``."""
    store.check_readable(sid, v1)
    store.check_readable(sid, v2)
    ctx = Context.open(store, sid, create=False, at=store.head(sid))
    try:
        return ctx.diff(v1, v2)
    finally:
        ctx.close()


def history(store: EventStore, sid: str, key: str) -> list[dict[str, Any]]:
    """Every change to ``key`` (a name or ``vars.NAME``): version, time, author, round, step and the operation."""
    wanted = Context.history_key(key)
    changes: list[dict[str, Any]] = []
    for event in store.read(sid):
        for op in event.ops:
            if op_key(op) == wanted:
                changes.append(_change(event, op))
    return changes


def _change(event: Event, op: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "version": event.version, "time": event.timestamp, "author": event.author, "round": event.round,
        "step": event.step, "op": dict(op),
    }
