"""What a session's page shows of its steps: the timeline with time (durations, waterfall, failures),
the path its agents took, and one step in full (the step inspector). Plain data, no HTML.

Costs per round follow the rule of the kept summaries (:func:`saucer.engine.summaries.summary_of`:
a step's or an evaluation's cost counts, a round's end repeats them and does not), so a
round's total is what the Context's ``ROUND_COST`` ledger holds and ``saucer state`` shows.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from saucer.context.queries import change_of
from saucer.context.replay import replay
from saucer.context.types import Change
from saucer.engine.overview import timeline_items
from saucer.engine.summaries import summary_of
from saucer.store import Event, EventStore, SessionInfo, StoreError

__all__ = [
    "SessionTally",
    "Tallies",
    "States",
    "item_of",
    "rounds_view",
    "path_of",
    "step_detail",
    "is_failure",
    "artifact_file",
    "new_round",
    "SEPARATORS",
]

#: Event kinds shown as thin separators between steps (not as steps).
SEPARATORS = frozenset({"session_start", "session_resume", "round_start", "round_end", "session_end"})
_FAILED = frozenset({"failure", "failed", "error", "timeout", "refused"})


def is_failure(item: Mapping[str, Any]) -> bool:
    """Whether a timeline item records a failure: an error, a failed status, or a failed command result."""
    if item.get("error"):
        return True
    if str(item.get("status") or "").lower() in _FAILED or str(item.get("round_status") or "") in ("failed", "error"):
        return True
    if str(item.get("session_status") or "") in ("failed", "error"):
        return True
    for command in item.get("commands") or []:
        result = command.get("result") or {}
        if isinstance(result, Mapping) and str(result.get("status") or "") in _FAILED:
            return True
    return False


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def new_round(key: Any) -> dict[str, Any]:
    """An empty round entry of :func:`rounds_view`."""
    return {
        "round": key,
        "request": None,
        "status": None,
        "steps": 0,
        "cost": 0.0,
        "cost_unknown": False,
        "tokens": 0,
        "events": [],
        "start": None,
        "end": None,
        "duration": None,
        "failures": 0,
        "failed_any": False,
    }


def item_of(event: Event, previous: float | None) -> dict[str, Any]:
    """The timeline item of ``event`` (:func:`~saucer.engine.overview.timeline_items`) with ``failed``, and
    for a step its ``duration`` in seconds from its ``started_at`` (else from ``previous``, the time
    of the event before it) and ``began``."""
    [item] = list(timeline_items([event]))
    began = event.meta.get("started_at")
    start = began if _number(began) and began else previous
    if item["kind"] == "step" and start is not None and item["time"] >= start:
        item["duration"] = item["time"] - start
        item["began"] = start
    item["failed"] = is_failure(item)
    return item


class SessionTally:
    """What a session's page shows of its whole log, folded event by event so that a later page
    reads only the events committed since (:meth:`add`): each round's request, status, steps,
    cost (the kept summaries' rule), start, end and failures; the path (:func:`path_of`); the
    first failure. Its events' items are not kept."""

    def __init__(self) -> None:
        self.version = 0
        self.previous: float | None = None
        self.rounds: dict[Any, dict[str, Any]] = {}
        self.first_failure: int | None = None
        self.nodes: dict[str, int] = {}
        self.edges: dict[tuple[str, str], int] = {}

    def add(self, event: Event) -> None:
        """Fold one more event (the next version) in."""
        item = item_of(event, self.previous)
        self.previous, self.version = event.timestamp, event.version
        entry = self.rounds.get(item["round"])
        if entry is None:
            entry = self.rounds[item["round"]] = new_round(item["round"])
        kind, time = item["kind"], item["time"]
        if entry["start"] is None:
            entry["start"] = item.get("began", time)
        entry["end"] = time
        if kind == "round_start":
            entry["request"] = item.get("request")
        elif kind == "step":
            entry["steps"] += 1
            self._path(event.meta)
        elif kind == "round_end":
            entry["status"] = item.get("round_status")
        delta = summary_of(item)  # the kept summaries' rule: a round's end repeats its steps' cost
        entry["cost"] += delta.cost_add
        entry["cost_unknown"] = entry["cost_unknown"] or (delta.unknown and kind in ("step", "evaluation"))
        if item["failed"]:
            entry["failed_any"] = True
            entry["failures"] += kind not in SEPARATORS  # failed steps; a failed end is shown, not counted
            if self.first_failure is None and kind not in SEPARATORS:
                self.first_failure = item["version"]

    def _path(self, meta: Mapping[str, Any]) -> None:
        if not meta.get("agent"):
            return
        here = f"{meta['agent']}: {meta.get('state') or '-'}"
        self.nodes[here] = self.nodes.get(here, 0) + 1
        if meta.get("next_agent") or meta.get("next_state"):
            there = f"{meta.get('next_agent') or meta['agent']}: {meta.get('next_state') or '-'}"
            self.nodes.setdefault(there, 0)
            self.edges[(here, there)] = self.edges.get((here, there), 0) + 1

    def path(self) -> dict[str, Any]:
        """The path the session's agents took: ``nodes`` (agent and state, with how many steps ran there)
        and ``edges`` (from, to, how many times), in the order first seen."""
        order = {name: i for i, name in enumerate(self.nodes)}
        return {
            "nodes": [{"name": n, "steps": c, "index": order[n]} for n, c in self.nodes.items()],
            "edges": [
                {"from": order[a], "to": order[b], "count": c, "source": a, "target": b}
                for (a, b), c in self.edges.items()
            ],
        }


class Tallies:
    """Each session's :class:`SessionTally`, kept between pages (the ``size`` most recently shown) and
    brought up to date by reading only the events committed since: a page of a session of 10^4
    steps decodes its whole log once, not on every view."""

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, tuple[float, SessionTally]] = OrderedDict()

    def of(self, store: EventStore, info: SessionInfo) -> SessionTally:
        """The tally of ``info``'s session at ``info.version``."""
        sid = info.session_id
        with self._lock:
            found = self._kept.pop(sid, None)  # held by this thread alone while it catches up
        tally = (
            found[1] if found is not None and found[0] == info.created_at and found[1].version <= info.version else None
        )
        try:
            tally = self._catch_up(store, sid, tally or SessionTally(), info.version)
        except StoreError:  # pruned past what it had: start again from what is readable
            tally = self._catch_up(store, sid, SessionTally(), info.version)
        with self._lock:
            self._kept[sid] = (info.created_at, tally)
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
        return tally

    @staticmethod
    def _catch_up(store: EventStore, sid: str, tally: SessionTally, upto: int) -> SessionTally:
        if tally.version < upto:
            for event in store.read(sid, tally.version, upto):
                tally.add(event)
        return tally


def path_of(events: Iterable[Event]) -> dict[str, Any]:
    """:meth:`SessionTally.path` of these events."""
    tally = SessionTally()
    for event in events:
        tally.add(event)
    return tally.path()


def rounds_view(
    tally: SessionTally,
    shown: list[dict[str, Any]],
    calls: Iterable[Mapping[str, Any]] = (),
    ledgers: tuple[Mapping[int, float | None], Mapping[int, int]] | None = None,
) -> list[dict[str, Any]]:
    """Every round of ``tally`` summarised (request, status, steps, cost, tokens, start, end,
    duration, failures), with the ``shown`` items (:func:`item_of`) in their rounds, each step's
    bar ``offset`` and ``width`` in % of its round (the waterfall).

    With ``ledgers`` (the Context's ``ROUND_COST`` and ``ROUND_STEP`` at the head) a round's cost
    and steps are the ledger's: the same numbers as ``saucer state``, also for rounds a prune
    removed from the log (listed with no events)."""
    rounds = {key: {**entry, "events": []} for key, entry in tally.rounds.items()}
    for item in shown:
        rounds.setdefault(item["round"], new_round(item["round"]))["events"].append(item)
    if ledgers is not None:
        costs, steps = ledgers
        for number in set(costs) | set(steps):
            entry = rounds.setdefault(number, new_round(number))
            if number in costs:
                entry["cost"], entry["cost_unknown"] = (costs[number] or 0.0), costs[number] is None
            if number in steps:
                entry["steps"] = steps[number]
    for call in calls:
        called = rounds.get(call.get("round"))
        if called is not None:
            called["tokens"] += int(call.get("prompt_tokens") or 0) + int(call.get("completion_tokens") or 0)
    for entry in rounds.values():
        if entry["start"] is not None and entry["end"] is not None:
            entry["duration"] = max(0.0, entry["end"] - entry["start"])
        span = entry["duration"] or 0.0
        for item in entry["events"]:
            if "duration" in item and span > 0:
                item["offset"] = round(100 * max(0.0, item["began"] - entry["start"]) / span, 3)
                item["width"] = round(100 * item["duration"] / span, 3)
    return [rounds[k] for k in sorted(rounds, key=lambda k: (k is not None, k if isinstance(k, int) else 0))]


def _terminal(result: Any) -> dict[str, Any] | None:
    """A shell-like result (stdout, stderr, exit code, duration) for terminal blocks; None otherwise."""
    if isinstance(result, Mapping) and ("stdout" in result or "stderr" in result or "exit_code" in result):
        return {
            "stdout": result.get("stdout") if isinstance(result.get("stdout"), str) else None,
            "stderr": result.get("stderr") if isinstance(result.get("stderr"), str) else None,
            "exit_code": result.get("exit_code"),
            "duration": result.get("duration") if _number(result.get("duration")) else None,
            "rest": {k: v for k, v in result.items() if k not in ("stdout", "stderr", "exit_code", "duration")},
        }
    return None


class States:
    """The Context's state after the steps the inspector showed last (a few per session), so that the
    next step (↓) costs one event instead of a hydrate (:func:`~saucer.context.queries.change_of`)."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[str, int, float], Any] = OrderedDict()

    def change(self, store: EventStore, sid: str, version: int) -> dict[str, Change]:
        """What the event at ``version`` changed, from a kept state at ``version - 1`` when there is one."""
        created = store.session_info(sid).created_at
        with self._lock:
            before = self._kept.get((sid, version - 1, created))
        if before is None:  # a hydrate there; kept too: the same step again, or ↑ after ↓, costs nothing more
            before = replay(store, sid, version - 1).state
        changes, after = change_of(store, sid, version, before)
        with self._lock:
            self._kept[(sid, version - 1, created)] = before
            self._kept[(sid, version, created)] = after
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
        return changes


def step_detail(
    store: EventStore, sid: str, version: int, calls: list[dict[str, Any]], states: States | None = None
) -> dict[str, Any]:
    """One step (or any event) in full: the timeline item, its commands with results (shell output
    as terminal blocks), the Context keys it changed before → after, its LLM calls and artifacts."""
    store.check_readable(sid, version)
    event = next(iter(store.read(sid, version - 1, version)), None) if version > 0 else None
    if event is None:
        raise LookupError(f"session {sid!r} has no event at v{version}")
    item = item_of(event, None)
    for command in item.get("commands") or []:
        result = command.get("result") or {}
        command["terminal"] = _terminal(result.get("result")) if isinstance(result, Mapping) else None
    deleted = {
        f"vars.{op['var']}" if op.get("var") is not None else op.get("name")
        for op in event.ops
        if op.get("op") == "delete" and not op.get("path")
    }
    changes: dict[str, Any] = {}  # each a Change, with the page's missing_before/missing_after added
    if version - 1 >= store.first_version(sid):
        changes = states.change(store, sid, version) if states is not None else change_of(store, sid, version)[0]
    for key, change in changes.items():
        change["missing_before"] = change["before"] is None
        change["missing_after"] = change["after"] is None and key in deleted
    meta = event.meta
    step_calls = (
        [c for c in calls if c.get("round") == event.round and c.get("step") == event.step]
        if item["kind"] == "step"
        else []
    )
    return {
        "item": item,
        "event": event,
        "changes": changes,
        "calls": step_calls,
        "artifacts": [a for a in meta.get("artifacts") or [] if isinstance(a, Mapping)],
    }


def artifact_file(event: Event, index: int, folder: str | None) -> tuple[Path, str]:
    """The file of artifact ``index`` of a step and its media type, only inside the session's log
    folder (``LOG_PATH``) and only a screenshot (PNG) or a UI tree (JSON); LookupError otherwise."""
    found = [a for a in event.meta.get("artifacts") or [] if isinstance(a, Mapping)]
    if not 0 <= index < len(found) or not isinstance(found[index].get("path"), str) or not folder:
        raise LookupError("no such artifact")
    entry = found[index]
    path = Path(entry["path"])
    if not path.is_absolute():
        path = Path(folder) / path
    root = Path(folder).resolve()
    path = path.resolve()
    if root not in path.parents or not path.is_file():
        raise LookupError("that artifact is not in the session's log folder")
    kind = {".png": "image/png", ".json": "application/json"}.get(path.suffix.lower())
    if kind is None:
        raise LookupError("only screenshots (PNG) and UI trees (JSON) are shown")
    return path, kind
