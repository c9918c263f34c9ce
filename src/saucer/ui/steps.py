"""What a session's page shows of its steps: the timeline with time (durations, waterfall, failures),
the path its agents took, and one step in full (the step inspector). Plain data, no HTML.

Costs per round follow the rule of the kept summaries (:func:`saucer.store.summary.delta_of`:
a step's or an evaluation's cost counts, a round's end repeats them and does not), so a
round's total is what the Context's ``ROUND_COST`` ledger holds and ``saucer state`` shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from saucer.context import Context
from saucer.engine.overview import timeline_items
from saucer.store import Event, EventStore
from saucer.store.summary import delta_of

__all__ = ["shape_rounds", "path_of", "step_detail", "is_failure", "artifact_file", "SEPARATORS"]

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
    """An empty round entry of :func:`shape_rounds`."""
    return {"round": key, "request": None, "status": None, "steps": 0, "cost": 0.0, "cost_unknown": False,
            "tokens": 0, "events": [], "start": None, "end": None, "duration": None, "failures": 0, "failed_any": False}


def shape_rounds(events: list[Event], shown_from: int, calls: Iterable[Mapping[str, Any]] = (),
                 shown_to: int | None = None,
                 ledgers: tuple[Mapping[int, float | None], Mapping[int, int]] | None = None) -> tuple[list[dict[str, Any]], int | None]:
    """Every round summarised (request, status, steps, cost, tokens, start, end, duration, failures),
    with the events from version ``shown_from`` to ``shown_to`` as timeline items (each with its ``duration``
    in seconds, its bar's ``offset`` and ``width`` in % of its round, and ``failed``); and the
    version of the first failed step (None: none).

    With ``ledgers`` (the Context's ``ROUND_COST`` and ``ROUND_STEP`` at the head) a round's cost
    and steps are the ledger's: the same numbers as ``saucer state``, also for rounds a prune
    removed from the log (listed with no events)."""
    rounds: dict[Any, dict[str, Any]] = {}
    previous: float | None = None
    first_failure: int | None = None
    for event, item in zip(events, timeline_items(events)):
        entry = rounds.get(item["round"])
        if entry is None:
            entry = rounds[item["round"]] = new_round(item["round"])
        kind = item["kind"]
        time = item["time"]
        began = event.meta.get("started_at")
        start = began if _number(began) and began else previous
        if kind == "step" and start is not None and time >= start:
            item["duration"] = time - start
            item["began"] = start
        previous = time
        if entry["start"] is None:
            entry["start"] = item.get("began", time)
        entry["end"] = time
        if kind == "round_start":
            entry["request"] = item.get("request")
        elif kind == "step":
            entry["steps"] += 1
        elif kind == "round_end":
            entry["status"] = item.get("round_status")
        delta = delta_of(item["step"], item)  # the kept summaries' rule: a round's end repeats its steps' cost
        entry["cost"] += delta.cost_add
        entry["cost_unknown"] = entry["cost_unknown"] or (delta.unknown and kind in ("step", "evaluation"))
        item["failed"] = is_failure(item)
        if item["failed"]:
            entry["failed_any"] = True
            entry["failures"] += kind not in SEPARATORS  # failed steps; a failed end is shown, not counted
            if first_failure is None and item["version"] >= shown_from:
                first_failure = item["version"]
        if item["version"] >= shown_from and (shown_to is None or item["version"] <= shown_to):
            entry["events"].append(item)
    if ledgers is not None:
        costs, steps = ledgers
        for number in sorted(set(costs) | set(steps)):
            entry = rounds.get(number)
            if entry is None:
                entry = rounds[number] = new_round(number)
            if number in costs:
                entry["cost"], entry["cost_unknown"] = (costs[number] or 0.0), costs[number] is None
            if number in steps:
                entry["steps"] = steps[number]
        rounds = dict(sorted(rounds.items(), key=lambda kv: (kv[0] is not None, kv[0] if kv[0] is not None else 0)))
    for call in calls:
        entry = rounds.get(call.get("round"))
        if entry is not None:
            entry["tokens"] += int(call.get("prompt_tokens") or 0) + int(call.get("completion_tokens") or 0)
    for entry in rounds.values():
        if entry["start"] is not None and entry["end"] is not None:
            entry["duration"] = max(0.0, entry["end"] - entry["start"])
        span = entry["duration"] or 0.0
        for item in entry["events"]:
            if "duration" in item and span > 0:
                item["offset"] = round(100 * (item["began"] - entry["start"]) / span, 3)
                item["width"] = round(100 * item["duration"] / span, 3)
    return list(rounds.values()), first_failure


def path_of(events: Iterable[Event]) -> dict[str, Any]:
    """The path the session's agents took: ``nodes`` (agent and state, with how many steps ran there)
    and ``edges`` (from, to, how many times), in the order first seen."""
    nodes: dict[str, int] = {}
    edges: dict[tuple[str, str], int] = {}
    for event in events:
        meta = event.meta
        if meta.get("kind") != "step" or not meta.get("agent"):
            continue
        here = f"{meta['agent']}: {meta.get('state') or '-'}"
        nodes[here] = nodes.get(here, 0) + 1
        if meta.get("next_agent") or meta.get("next_state"):
            there = f"{meta.get('next_agent') or meta['agent']}: {meta.get('next_state') or '-'}"
            nodes.setdefault(there, 0)
            edges[(here, there)] = edges.get((here, there), 0) + 1
    order = list(nodes)
    return {
        "nodes": [{"name": n, "steps": c, "index": i} for i, (n, c) in enumerate(nodes.items())],
        "edges": [{"from": order.index(a), "to": order.index(b), "count": c, "source": a, "target": b}
                  for (a, b), c in edges.items()],
    }


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


def step_detail(store: EventStore, sid: str, version: int, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """One step (or any event) in full: the timeline item, its commands with results (shell output
    as terminal blocks), the Context keys it changed before → after, its LLM calls and artifacts."""
    store.check_readable(sid, version)
    event = next(iter(store.read(sid, version - 1, version)), None) if version > 0 else None
    if event is None:
        raise LookupError(f"session {sid!r} has no event at v{version}")
    [item] = list(timeline_items([event]))
    item["failed"] = is_failure(item)
    for command in item.get("commands") or []:
        result = command.get("result") or {}
        command["terminal"] = _terminal(result.get("result")) if isinstance(result, Mapping) else None
    deleted = {f"vars.{op['var']}" if op.get("var") is not None else op.get("name") for op in event.ops
               if op.get("op") == "delete" and not op.get("path")}
    changes: dict[str, dict[str, Any]] = {}
    if version - 1 >= store.first_version(sid):
        ctx = Context.open(store, sid, create=False, at=version)
        try:
            changes = ctx.diff(version - 1, version)
        finally:
            ctx.close()
    for key, change in changes.items():
        change["missing_before"] = change["before"] is None
        change["missing_after"] = change["after"] is None and key in deleted
    meta = event.meta
    step_calls = [c for c in calls if c.get("round") == event.round and c.get("step") == event.step] if item["kind"] == "step" else []
    return {"item": item, "event": event, "changes": changes, "calls": step_calls,
            "artifacts": [a for a in meta.get("artifacts") or [] if isinstance(a, Mapping)]}


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
