"""Export a session's whole log and final state as JSON data, and import it back.

An export stands on its own: it flattens a fork's lineage (the parent's events
up to the branch point come first; ``lineage`` says whose log held which
versions), and a pruned session's export starts at its first readable version
with the *base* state there (``base``), which its first event sets.

An import checks every event before it writes anything (each operation's
shape, target and value, then a replay of the whole log), and then writes the
session, its events and its snapshots in one transaction: all or nothing
(:meth:`~saucer.store.EventStore.import_log`).

This lives beside the Context, not in the store: checking an export means
folding its events and knowing the typed names, which a store never does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from saucer.context.events import Event, State, ValueNotStorableError, apply_ops, state_to_wire, to_wire
from saucer.context.names import DERIVED_LEDGERS, RETIRED, ContextNames, UnknownStoredNameError, stored_name
from saucer.context.types import ImportOrigin
from saucer.redaction import redact_known
from saucer.store.base import EventStore
from saucer.store.model import SessionInfo, Snapshot, check_session_id, timestamp_problem
from saucer.store.summary import SummaryDelta
from saucer.store.upcast import summary_of_v5_meta

__all__ = ["FORMAT", "export_session", "export_header", "Lineage", "import_session"]

#: Identifies the export format; bumped on incompatible changes. (``base`` and
#: ``lineage`` were added compatibly: an export without them starts at version 1.)
FORMAT = "saucer.session/1"

_OPS = frozenset({"set", "delete", "incr", "append", "cas"})
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1


def export_session(store: EventStore, session_id: str, state: Mapping[str, Any]) -> dict[str, Any]:
    """The session's info, every readable event of its lineage, its base state and ``state`` (its final state)."""
    data = export_header(store, session_id)
    tally = Lineage()
    data["events"] = [tally.add(event).to_dict(summary=True) for event in store.read(session_id)]
    data["lineage"] = tally.segments
    data["state"] = dict(state)
    return data


def export_header(store: EventStore, session_id: str) -> dict[str, Any]:
    """The fields of an export that come before its events: ``format``, ``session`` and ``base``.

    A streaming writer (``saucer export``) writes these, then each event of
    :meth:`~saucer.store.EventStore.iter_events` as it is read (feeding a
    :class:`Lineage`), then ``lineage`` and ``state``: the same export as
    :func:`export_session`, in constant memory.
    """
    info = store.session_info(session_id)
    first = store.first_version(session_id)
    base = State()
    if first:
        for event in store.read(session_id, first - 1, first):
            apply_ops(base, event.ops)  # the base event sets the whole state at the first version
    return {
        "format": FORMAT,
        "session": {
            "session_id": info.session_id,
            "version": info.version,
            "created_at": info.created_at,
            "updated_at": info.updated_at,
            "parent_id": info.parent_id,
            "parent_version": info.parent_version,
            "meta": redact_known(info.meta),  # a plan stored before plans were redacted: no known secret leaves
        },
        "base": {"version": first, "state": state_to_wire(base)},
    }


class Lineage:
    """Whose log held which versions of an export (its ``lineage``), tallied event by event."""

    def __init__(self) -> None:
        self.segments: list[dict[str, Any]] = []

    def add(self, event: Event) -> Event:
        """Count ``event`` (the next one of the export, in version order); returns it."""
        last = self.segments[-1] if self.segments else None
        if last is not None and last["session_id"] == event.session_id:
            last["to"] = event.version
        else:
            self.segments.append({"session_id": event.session_id, "from": event.version, "to": event.version})
        return event


def import_session(store: EventStore, data: Mapping[str, Any], session_id: str | None = None) -> SessionInfo:
    """Recreate an exported session (as ``session_id`` if given); return its info.

    Events keep their versions, authors, rounds, steps, timestamps and meta;
    the new session stands alone (a fork's provenance stays in its meta).
    Raises ValueError naming the field when ``data`` is not a valid export;
    nothing is written then.
    """
    if not isinstance(data, Mapping) or data.get("format") != FORMAT:
        raise ValueError(f'not a saucer session export (expected "format": "{FORMAT}")')
    session = data.get("session")
    raw_events = data.get("events")
    if not isinstance(session, Mapping) or not isinstance(session.get("session_id"), str):
        raise ValueError("export field 'session.session_id' is missing or not a string")
    if not isinstance(raw_events, list):
        raise ValueError("export field 'events' must be a list")
    target = check_session_id(session["session_id"] if session_id is None else session_id)
    first, base_state = _base(data.get("base"), raw_events)
    state = State()
    events: list[Event] = []
    for index, raw in enumerate(raw_events):
        event = _event(raw, index, target)
        expected = (first or 1) + index
        if event.version != expected:
            raise ValueError(f"export field 'events[{index}].version' is {event.version}, expected {expected}")
        try:
            apply_ops(state, event.ops)  # refuse what could not be replayed later
            wire = state_to_wire(state)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise ValueError(f"export field 'events[{index}].ops' cannot be replayed: {exc}") from None
        if index == 0 and first and wire != base_state:
            raise ValueError(f"export field 'events[0]' (version {first}) does not set the state of 'base.state'")
        events.append(event)
    meta = _mapping(session.get("meta") or {}, "session.meta")
    origin: ImportOrigin = {"imported_from": session["session_id"]}
    if first:
        origin["pruned_to"] = first
    meta.pop("pruned_to", None)
    meta.update(origin)
    now = time.time()
    head = events[-1].version if events else first
    snapshots = [Snapshot(target, first, now, base_state)] if first else []
    if head > first:
        snapshots.append(Snapshot(target, head, now, state_to_wire(state)))
    info = SessionInfo(target, head, now, events[-1].timestamp if events else now, None, None, meta)
    store.import_log(info, events, snapshots)
    return store.session_info(target)


def _base(raw: Any, events: list[Any]) -> tuple[int, dict[str, Any]]:
    """The first version of an export and the state there (wire form)."""
    empty = state_to_wire(State())
    if raw is None:
        # An export written before ``base`` existed: it starts at version 1, or,
        # for a pruned session, at its base event (which sets the whole state).
        first_raw = events[0] if events and isinstance(events[0], Mapping) else {}
        meta = first_raw.get("meta")
        if not (isinstance(meta, Mapping) and "pruned" in meta):
            return 0, empty
        event = _event(first_raw, 0, "import")
        try:
            return event.version, state_to_wire(apply_ops(State(), event.ops))
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise ValueError(f"export field 'events[0].ops' cannot be replayed: {exc}") from None
    if not isinstance(raw, Mapping):
        raise ValueError("export field 'base' must be an object")
    version = raw.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError("export field 'base.version' must be an int >= 0")
    state = raw.get("state")
    if not isinstance(state, Mapping) or set(state) - {"names", "vars"}:
        raise ValueError("export field 'base.state' must be an object with 'names' and 'vars'")
    wire = {
        "names": _mapping(state.get("names") or {}, "base.state.names"),
        "vars": _mapping(state.get("vars") or {}, "base.state.vars"),
    }
    if version == 0:
        if wire != empty:
            raise ValueError("export field 'base.state' must be empty at version 0")
        return 0, empty
    if not events:
        raise ValueError(f"export field 'events' is empty, but the export starts at version {version}")
    return version, wire


def _mapping(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"export field {field!r} must be an object")
    checked: dict[str, Any] = _json(dict(value), field)
    return checked


def _json(value: Any, field: str) -> Any:
    try:
        return to_wire(value, field)
    except ValueNotStorableError as exc:
        raise ValueError(f"export field '{exc.key}{exc.path}' cannot be stored: {exc.reason}") from None


def _event(raw: Any, index: int, target: str) -> Event:
    """One exported event, checked field by field (and each operation), for session ``target``."""
    where = f"events[{index}]"
    if not isinstance(raw, Mapping):
        raise ValueError(f"export field {where!r} must be an object")
    version = raw.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"export field '{where}.version' must be an int >= 1")
    timestamp = raw.get("timestamp")
    problem = timestamp_problem(timestamp)  # the same limit as a live event's time
    if problem is not None or not isinstance(timestamp, (int, float)):
        raise ValueError(f"export field '{where}.timestamp' {problem}")
    author = raw.get("author")
    if not isinstance(author, str) or "\x00" in author:
        raise ValueError(f"export field '{where}.author' must be a string without NUL characters")
    _json(author, f"{where}.author")
    for name in ("round", "step"):
        value = raw.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not _INT_MIN <= value <= _INT_MAX
        ):
            raise ValueError(f"export field '{where}.{name}' must be a 64-bit int or null")
    ops = raw.get("ops")
    if not isinstance(ops, list):
        raise ValueError(f"export field '{where}.ops' must be a list")
    meta = _mapping(raw.get("meta") or {}, f"{where}.meta")
    return Event(
        session_id=target,
        version=version,
        timestamp=float(timestamp),
        author=author,
        round=raw.get("round"),
        step=raw.get("step"),
        ops=[_op(op, f"{where}.ops[{i}]") for i, op in enumerate(ops)],
        meta=meta,
        summary=_summary(raw, meta, where),
    )


def _summary(raw: Mapping[str, Any], meta: Mapping[str, Any], where: str) -> SummaryDelta | None:
    """The event's summary delta: as exported, or (an export of a saucer that wrote none) what its meta meant."""
    if "summary" not in raw:
        return SummaryDelta.from_wire(summary_of_v5_meta(meta))
    if raw["summary"] is not None and not isinstance(raw["summary"], Mapping):
        raise ValueError(f"export field '{where}.summary' must be an object or null")
    return SummaryDelta.from_wire(raw["summary"])


def _op(op: Any, where: str) -> dict[str, Any]:
    """One operation, checked: its kind, its target (a durable typed name or a var), its path and values."""
    if not isinstance(op, Mapping):
        raise ValueError(f"export field {where!r} must be an object")
    kind = op.get("op")
    if kind == "sealed":
        raise ValueError(
            f"export field {where!r} holds a value encrypted at rest (bound to its session and key); "
            "import an export written with saucer export --decrypt"
        )
    if kind not in _OPS:
        raise ValueError(f"export field '{where}.op' must be one of {', '.join(sorted(_OPS))}, not {kind!r}")
    allowed = {"op", "name", "var", "path"} | {
        "set": {"value"},
        "delete": set(),
        "incr": {"by"},
        "append": {"value"},
        "cas": {"expected", "value"},
    }[kind]
    extra = set(op) - allowed
    if extra:
        raise ValueError(f"export field {where!r} has unknown fields: {', '.join(sorted(map(str, extra)))}")
    out: dict[str, Any] = {"op": kind}
    if ("name" in op) == ("var" in op):
        raise ValueError(f"export field {where!r} must have either 'name' or 'var'")
    member: ContextNames | None = None
    if "name" in op:
        name = op["name"]
        try:  # an export written before a rename or a retirement: its name as it reads today
            current = stored_name(name) if isinstance(name, str) and name not in ContextNames.__members__ else name
        except UnknownStoredNameError:
            current = None
        member = ContextNames.__members__.get(current) if isinstance(current, str) else None
        if current is None and isinstance(name, str) and name in RETIRED:
            out["name"] = name  # kept in the log as it was: it reads as retired
        elif member is None or not member.durable or current in DERIVED_LEDGERS:
            raise ValueError(f"export field '{where}.name' is {name!r}, not a stored ContextNames name")
        else:
            out["name"] = current
    else:
        if not isinstance(op["var"], str) or not op["var"]:
            raise ValueError(f"export field '{where}.var' must be a non-empty string")
        out["var"] = _json(op["var"], f"{where}.var")
    if "path" in op:
        path = op["path"]
        if (
            not isinstance(path, list)
            or not path
            or len(path) > 2
            or not all(isinstance(p, (str, int)) and not isinstance(p, bool) for p in path)
        ):
            raise ValueError(f"export field '{where}.path' must be a list of 1 or 2 keys (strings or ints)")
        out["path"] = list(path)
    for field in ("value", "expected"):
        if field in allowed:
            if field not in op:
                raise ValueError(f"export field '{where}.{field}' is missing")
            out[field] = _json(op[field], f"{where}.{field}")
    if kind == "incr":
        by = op.get("by")
        if isinstance(by, bool) or not isinstance(by, (int, float)) or not math.isfinite(by):
            raise ValueError(f"export field '{where}.by' must be a finite number")
        out["by"] = _json(by, f"{where}.by")
    if member is not None and kind in ("set", "cas") and "path" not in out:
        try:
            ok = member.accepts(member.restore(out["value"]))
        except (TypeError, ValueError, AttributeError):
            ok = False
        if not ok:
            raise ValueError(f"export field '{where}.value' is not a {member.value} value")
    return out
