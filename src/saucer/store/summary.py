"""The per-session summary a store keeps up to date with every commit, and the
query that lists sessions from it.

A listing of 10^4 sessions must not read 10^4 logs: each commit folds its
event into a few counters kept beside the session's head (:func:`fold`), and
:meth:`~saucer.store.EventStore.list_sessions` answers from those rows in one
query. What a commit changes is said by its writer, with the commit: a
:class:`SummaryDelta` (``EventStore.append(..., summary=...)``, stored with the
event). The store interprets neither operations (which may be sealed) nor
meta; the engine makes its deltas (:mod:`saucer.engine.summaries`):

- ``status``: the newest delta's ``status``, else the session meta's
  ``status`` given at creation (None: not an engine session);
- ``steps``: the highest ``step`` of the session's events (its step counter);
- ``rounds``: the sum of the deltas' ``rounds_add``;
- ``cost``: the sum of their ``cost_add``; an ``unknown`` makes the total
  unknown for good;
- ``reason``: the newest event's delta's ``reason``;
- a delta's ``final_rounds``, ``final_steps`` and ``final_cost`` (a session's
  end, with the engine's own final figures) replace the counts.

A fork starts from its parent's counters at its branch point, with the status
of its meta (``not started``, :data:`NOT_STARTED`, for an engine session's fork)
until a run of its own writes one; a prune keeps them (the versions it drops were counted). The listed ``status`` is derived
as :mod:`saucer.engine.status` does: a session that has not ended and whose
runner's lease has expired (or that has none) is ``interrupted``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, TypeGuard

__all__ = [
    "ENDED",
    "INTERRUPTED",
    "NOT_STARTED",
    "SETTLED",
    "REQUEST_CHARS",
    "SORT_KEYS",
    "Counters",
    "SummaryDelta",
    "Summarised",
    "ListQuery",
    "SessionSummary",
    "apply",
    "ascii_lower",
    "brief_of",
    "fold",
    "fold_events",
    "initial_counters",
    "listed_sql",
    "listed_status",
    "make_summary",
    "order_sql",
    "select",
    "fork_counters",
    "fork_meta",
    "cost_text",
]

#: Statuses of a session that has ended (its last event is ``session_end``).
ENDED = frozenset({"finished", "failed", "error", "stopped", "cancelled"})
#: The listed status of a session that has not ended and whose runner is gone.
INTERRUPTED = "interrupted"
#: The status of a fork of an engine session until it is resumed (its first own run writes ``running``).
NOT_STARTED = "not started"
#: Statuses a listing shows as they are, whatever the lease says.
SETTLED = ENDED | {NOT_STARTED}
#: What :meth:`~saucer.store.EventStore.list_sessions` can sort by.
SORT_KEYS = ("updated", "created", "id", "task", "status", "rounds", "steps", "cost", "version")
#: A request longer than this is cut in the summary (the session meta keeps it whole).
REQUEST_CHARS = 500


@dataclass(frozen=True, slots=True)
class Counters:
    """The part of a summary that commits change (see the module docs)."""

    status: str | None = None
    rounds: int = 0
    steps: int = 0
    cost: float = 0.0
    cost_unknown: bool = False
    reason: str | None = None


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class SummaryDelta:
    """What one commit changes in its session's summary: given by the writer (the engine) with the
    commit (``EventStore.append(..., summary=...)``), stored with the event, and applied by
    :func:`apply` -- the store never reads an event's ``meta`` to guess it.

    The PostgreSQL store applies it in its append statement (``_postgres_sql``) as :func:`apply`
    does, so that every backend counts alike. Records written before format 6 carry none: their
    upcaster (:mod:`saucer.store.upcast`) gives the one their meta then meant.
    """

    status: str | None = None  # the session's new status, or None: unchanged
    rounds_add: int = 0  # rounds this commit ends
    cost_add: float = 0.0  # cost this commit adds
    unknown: bool = False  # the total cost becomes unknown (something could not be priced)
    reason: str | None = None  # the reason after this commit (None: none)
    final_rounds: int | None = None  # a session end's own figures replace the counts
    final_steps: int | None = None
    final_cost: float | None = None  # with it, ``unknown`` alone says whether the total is known

    def to_wire(self) -> dict[str, Any]:
        """The fields that differ from their default, as JSON data (how records store it)."""
        return {name: getattr(self, name) for name in _FIELDS if getattr(self, name) != getattr(_NO_CHANGE, name)}

    @classmethod
    def from_wire(cls, data: Any) -> SummaryDelta | None:
        """The delta a record stored (:meth:`to_wire`); None for none. A field of the wrong type
        is left at its default: a summary is a listing's, and must not make a record unreadable."""
        if not isinstance(data, Mapping):
            return None

        def text(name: str) -> str | None:
            value = data.get(name)
            return value if isinstance(value, str) else None

        def count(name: str) -> int | None:
            value = data.get(name)
            return int(value) if _number(value) else None

        cost = data.get("final_cost")
        return cls(
            text("status"),
            count("rounds_add") or 0,
            float(data["cost_add"]) if _number(data.get("cost_add")) else 0.0,
            data.get("unknown") is True,
            text("reason"),
            count("final_rounds"),
            count("final_steps"),
            float(cost) if _number(cost) else None,
        )


_FIELDS = tuple(SummaryDelta.__dataclass_fields__)
#: The delta of a commit that says nothing about its session's summary.
_NO_CHANGE = SummaryDelta()


def apply(c: Counters, step: int | None, d: SummaryDelta | None) -> Counters:
    """The counters after a commit with this ``step`` (steps become at least it) and delta ``d``."""
    d = _NO_CHANGE if d is None else d
    if d.final_steps is not None:
        steps = d.final_steps
    elif isinstance(step, int) and not isinstance(step, bool) and step > c.steps:
        steps = step
    else:
        steps = c.steps
    rounds = d.final_rounds if d.final_rounds is not None else c.rounds + d.rounds_add
    if d.final_cost is not None:
        cost, unknown = d.final_cost, d.unknown
    else:
        cost, unknown = c.cost + d.cost_add, c.cost_unknown or d.unknown
    reason = d.reason[:REQUEST_CHARS] if d.reason else None
    return Counters(d.status if d.status is not None else c.status, rounds, steps, cost, unknown, reason)


class Summarised(Protocol):
    """What :func:`fold` reads of an event: its step and its summary delta."""

    @property
    def step(self) -> int | None: ...

    @property
    def summary(self) -> SummaryDelta | None: ...


def fold(counters: Counters, event: Summarised) -> Counters:
    """``counters`` after one more event; pure, the same on every backend."""
    return apply(counters, event.step, event.summary)


def fold_events(counters: Counters, events: Iterable[Summarised]) -> Counters:
    """:func:`fold` over events, in order."""
    for event in events:
        counters = apply(counters, event.step, event.summary)
    return counters


def brief_of(meta: Mapping[str, Any]) -> tuple[str | None, str | None, str | None, str | None, int | None, int]:
    """What a listing shows of a session's meta: ``(task, mode, request, forked_from, at, pruned_to)``,
    each None unless of the right type (the request cut to :data:`REQUEST_CHARS`)."""

    def text(name: str) -> str | None:
        value = meta.get(name)
        return value if isinstance(value, str) else None

    request = text("request")
    at = meta.get("at")
    pruned = meta.get("pruned_to")
    return (
        text("task"),
        text("mode"),
        request[:REQUEST_CHARS] if request is not None else None,
        text("forked_from"),
        at if isinstance(at, int) and not isinstance(at, bool) else None,
        pruned if isinstance(pruned, int) and not isinstance(pruned, bool) else 0,
    )


def initial_counters(meta: Mapping[str, Any]) -> Counters:
    """The counters of a new session (not a fork): its meta's ``status``, nothing counted."""
    status = meta.get("status")
    return Counters(status=status if isinstance(status, str) else None)


def fork_meta(parent: Mapping[str, Any], meta: Mapping[str, Any], parent_id: str, at: int) -> dict[str, Any]:
    """The meta of a new fork: ``forked_from`` and ``at``, its parent's ``task`` and ``mode`` (unless
    ``meta`` names its own), and ``status`` ``not started`` for an engine session's fork (until it runs)."""
    out = dict(meta)
    out.setdefault("forked_from", parent_id)
    out.setdefault("at", at)
    for inherited in ("task", "mode"):
        if isinstance(parent.get(inherited), str):
            out.setdefault(inherited, parent[inherited])
    if isinstance(parent.get("status"), str):
        out.setdefault("status", NOT_STARTED)
    return out


def fork_counters(parent: Counters, meta: Mapping[str, Any]) -> Counters:
    """The counters of a new fork: its parent's at the branch point, with the status its ``meta``
    gives (``not started`` for an engine session's fork, until it runs), if any."""
    status = meta.get("status")
    if not isinstance(status, str):
        return parent
    return Counters(status, parent.rounds, parent.steps, parent.cost, parent.cost_unknown, parent.reason)


def listed_status(
    status: str | None, lease_owner: str | None, lease_expires: float | None, now: float
) -> tuple[str, str | None]:
    """``(status as listed, runner)``: ``-`` for no status, ``interrupted`` for a session that has
    not ended without a live lease (a fork not started yet is listed as such); ``runner`` is the
    live lease's owner while running."""
    if status is None:
        return "-", None
    if status in SETTLED:
        return status, None
    if lease_owner is not None and lease_expires is not None and lease_expires > now:
        return status, lease_owner
    return INTERRUPTED, None


class SessionSummary(NamedTuple):
    """One row of :meth:`~saucer.store.EventStore.list_sessions`: what ``saucer sessions`` shows.

    ``status`` is as listed (``-``, ``interrupted``, or the stored status);
    ``cost`` is None when some cost could not be priced; ``origin`` is
    ``"parent@version"`` for a fork (attached, or standing alone after a
    prune), else None; ``runner`` the owner of the live lease while running.
    A named tuple: a listing makes 10^4 of them, and a frozen dataclass costs
    about twice the query's own time to build.
    """

    session_id: str
    version: int
    created_at: float
    updated_at: float
    task: str | None
    mode: str | None
    status: str
    rounds: int
    steps: int
    cost: float | None
    reason: str | None = None
    request: str | None = None
    origin: str | None = None
    runner: str | None = None
    parent_id: str | None = None
    parent_version: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The row as JSON data (field names as above)."""
        return dict(zip(self._fields, self, strict=False))

    def row(self) -> dict[str, Any]:
        """The session's columns as every surface shows them (``saucer sessions/show --json`` and the
        viewer's table and page): id, task and mode (``-`` when none), status, rounds, steps, cost
        (see :meth:`counts`), version, created_at, updated_at, parent (``"id@version"``), runner,
        request and reason."""
        rounds, steps, cost = self.counts()
        return {
            "id": self.session_id,
            "task": "-" if self.task is None else self.task,
            "mode": "-" if self.mode is None else self.mode,
            "status": self.status,
            "rounds": rounds,
            "steps": steps,
            "cost": cost,
            "version": self.version,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "parent": self.origin,
            "runner": self.runner,
            "request": self.request,
            "reason": self.reason,
        }

    def counts(self) -> tuple[int | None, int | None, float | None]:
        """``(rounds, steps, cost)`` as listings show them: None each for a session the engine
        did not make (status ``-`` and nothing counted), as its own page shows it."""
        if self.status != "-" or self.rounds or self.steps:
            return self.rounds, self.steps, self.cost
        return None, None, None


def cost_text(cost: float | None, status: str) -> str:
    """A session's cost as the CLI and the viewer print it: four decimals; ``unknown`` for an ended
    session that could not be priced; ``-`` while there is no total yet."""
    if cost is not None:
        return f"{cost:.4f}"
    return "unknown" if status in ENDED else "-"


def make_summary(row: Sequence[Any]) -> SessionSummary:
    """A :class:`SessionSummary` from the columns every backend selects, in this order: ``session_id,
    head, created_at, updated_at, parent_id, parent_version, listed status, rounds, steps, cost (None:
    unknown), reason, task, mode, request, forked_from, forked_at, runner``."""
    (
        sid,
        head,
        created,
        updated,
        parent_id,
        parent_version,
        status,
        rounds,
        steps,
        cost,
        reason,
        task,
        mode,
        request,
        forked_from,
        forked_at,
        runner,
    ) = row
    if parent_id is not None:
        origin = f"{parent_id}@{parent_version}"
    elif forked_from is not None:
        origin = f"{forked_from}@{forked_at}"
    else:
        origin = None
    return SessionSummary(
        sid,
        head,
        created,
        updated,
        task,
        mode,
        status,
        rounds,
        steps,
        cost,
        reason,
        request,
        origin,
        runner,
        parent_id,
        parent_version,
    )


def listed_sql(now: str) -> tuple[str, str]:
    """SQL expressions ``(listed status, runner)`` over ``s`` (sessions) and ``l`` (leases),
    as :func:`listed_status` computes them; ``now`` is the SQL of the current time."""
    ended = ", ".join(f"'{s}'" for s in sorted(SETTLED))
    live = f"l.expires_at > {now}"
    status = (
        f"CASE WHEN s.status IS NULL THEN '-' WHEN s.status IN ({ended}) THEN s.status "
        f"WHEN {live} THEN s.status ELSE '{INTERRUPTED}' END"
    )
    runner = f"CASE WHEN s.status IS NOT NULL AND s.status NOT IN ({ended}) AND {live} THEN l.owner END"
    return status, runner


@dataclass(frozen=True, slots=True)
class ListQuery:
    """A checked query of :meth:`~saucer.store.EventStore.list_sessions`."""

    limit: int | None = None
    statuses: frozenset[str] | None = None
    task: str | None = None
    since: float | None = None
    sort: str = "updated"
    descending: bool = True
    ids: tuple[str, ...] | None = None
    now: float = field(default_factory=time.time)

    @classmethod
    def of(
        cls,
        limit: int | None = None,
        status: str | Iterable[str] | None = None,
        task: str | None = None,
        since: float | None = None,
        sort: str = "updated",
        descending: bool | None = None,
        ids: Iterable[str] | None = None,
    ) -> ListQuery:
        """Check the arguments of ``list_sessions``; ValueError/TypeError naming the bad one."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise ValueError(f"limit must be a non-negative int or None, not {limit!r}")
        statuses = None
        if status is not None:
            statuses = frozenset([status] if isinstance(status, str) else status)
            if not all(isinstance(s, str) for s in statuses):
                raise TypeError(f"status must be a string or strings, not {status!r}")
        if task is not None and not isinstance(task, str):
            raise TypeError(f"task must be a string, not {task!r}")
        if since is not None and (isinstance(since, bool) or not isinstance(since, (int, float))):
            raise TypeError(f"since must be epoch seconds (a number), not {since!r}")
        if sort not in SORT_KEYS:
            raise ValueError(f"cannot sort sessions by {sort!r}; use one of: {', '.join(SORT_KEYS)}")
        if descending is None:
            descending = sort not in ("id", "task")
        chosen = None if ids is None else tuple(dict.fromkeys(ids))
        return cls(limit, statuses, task, None if since is None else float(since), sort, descending, chosen)

    def task_matches(self, task: str | None) -> bool:
        """The task filter: a substring, ignoring the case of ASCII letters (as every backend does)."""
        return self.task is None or (task is not None and ascii_lower(self.task) in ascii_lower(task))


_UPPER = {c: c + 32 for c in range(65, 91)}


def ascii_lower(text: str) -> str:
    """``text`` with A-Z lowered and nothing else changed (what SQL ``lower()`` does in SQLite)."""
    return text.translate(_UPPER)


_SORT_FIELD = {
    "updated": "updated_at",
    "created": "created_at",
    "id": "session_id",
    "task": "task",
    "status": "status",
    "rounds": "rounds",
    "steps": "steps",
    "cost": "cost",
    "version": "version",
}


def select(rows: Iterable[SessionSummary], query: ListQuery) -> list[SessionSummary]:
    """Filter, sort and cut summaries in Python, as the SQL backends do in their query.

    Ties (and None values, which sort last) are broken by session id, ascending.
    """
    wanted = None if query.ids is None else set(query.ids)
    kept = [
        r
        for r in rows
        if (wanted is None or r.session_id in wanted)
        and (query.statuses is None or r.status in query.statuses)
        and query.task_matches(r.task)
        and (query.since is None or r.updated_at >= query.since)
    ]
    name = _SORT_FIELD[query.sort]
    kept.sort(key=lambda r: r.session_id)

    def key(r: SessionSummary) -> Any:  # the cost as listed: none for a session the engine did not make
        return r.counts()[2] if name == "cost" else getattr(r, name)

    present = [r for r in kept if key(r) is not None]
    missing = [r for r in kept if key(r) is None]
    present.sort(key=key, reverse=query.descending)
    out = present + missing
    return out if query.limit is None else out[: query.limit]


def order_sql(query: ListQuery, status: str, task: str, collate: str = "") -> str:
    """The ORDER BY clause of a query: its key, None values last, ties by session id.

    ``status`` is the SQL of the listed status (:func:`listed_sql`), ``task`` the
    task's column; ``collate`` a clause that makes text compare by code point,
    as Python does (PostgreSQL's default collation may not).
    """
    key = {
        "updated": "s.updated_at",
        "created": "s.created_at",
        "id": f"s.session_id{collate}",
        "task": f"{task}{collate}",
        "status": f"({status}){collate}",
        "rounds": "s.rounds",
        "steps": "s.steps",
        # the cost as listed (SessionSummary.counts): unknown, or none for a session the engine did not make
        "cost": "(CASE WHEN s.cost_unknown OR (s.status IS NULL AND s.rounds = 0 AND s.steps = 0) THEN NULL ELSE s.cost END)",
        "version": "s.head",
    }[query.sort]
    return f"ORDER BY ({key} IS NULL), {key} {'DESC' if query.descending else 'ASC'}, s.session_id{collate}"
