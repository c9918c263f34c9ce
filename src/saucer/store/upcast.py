"""Record format versions, and the upcasters that read older records.

Every event payload and snapshot a store writes carries the *format version*
it was written with (``"v"`` in its JSON object); a store also records the
newest format it has seen (:meth:`~saucer.store.EventStore.format_version`).
Reading goes through a chain of small, pure functions, one per step
(``v1 -> v2 -> ...``), so a record written by any earlier saucer reaches the
code in today's shape; writing always uses :data:`FORMAT_VERSION`. A record,
or a store, newer than this code is refused with :class:`FormatTooNewError`
naming both versions -- never guessed at.

The versions:

1. saucer 0.1.0: a payload ``{"ops", "meta"?, "session"?}`` and a snapshot
   ``{"names", "vars"}``, with no version field (the golden stores under
   ``tests/golden`` hold real ones).
2. The same objects tagged ``"v": 2``: from here on, every record says
   which format it is in. Version 2 also allows values encrypted at rest
   (:mod:`saucer.store.crypto`): an operation ``{"op": "sealed", ...}`` and a
   snapshot's ``"sealed"`` entries, and a snapshot's ``"retired"`` names. A
   reader that knows only version 1 must not take those for plain data.
3. A snapshot may hold large values packed on their own, under
   ``"packed"`` (``{name: {"size", "zlib"}}``, see
   :class:`saucer.context.events.Packed`), and ``"sealed"`` may have a
   ``"packed"`` part; events are unchanged. A version 2 reader would take
   such a snapshot for one without those names.
4. The same objects; a stored event payload or snapshot over 512 bytes is
   zlib-compressed (its stored bytes start with ``x``, a JSON object's with
   ``{``; the checksum covers the stored bytes), and a sealed value over 512
   bytes was compressed before it was encrypted (no longer: such tokens still
   open, new ones are sealed uncompressed). A version 3 reader would take
   a compressed payload for a damaged one: a store holding version 4 records
   is refused by it instead (``saucer_format``).
5. A packed value may have ``"tails"`` (the operations on it since its base,
   packed, see :class:`saucer.context.events.Packed`): a version 4 reader
   would read the base without them.
6. An event payload may have ``"summary"``: what the commit changes in its
   session's summary (:class:`saucer.store.summary.SummaryDelta`, as its
   writer said). Before, a store read that from the event's ``meta``
   (``kind``, ``session_status``, ``reason``, ``cost``, ``cost_summary``,
   ``summary``); :func:`_event_v5` gives an older event the delta its meta
   meant then (the store reads no meta of a version 6 event). A version 5
   reader would count a version 6 event by its meta.

Adding a version: write ``_event_vN`` / ``_snapshot_vN`` (taking a version N
object, returning a version N + 1 object, without mutating its input), add
them to the tables below, bump :data:`FORMAT_VERSION`, and add a test that
reads real version N bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from saucer.store.model import FormatTooNewError

__all__ = [
    "FORMAT_VERSION",
    "FormatTooNewError",
    "record_format",
    "upcast_event",
    "upcast_snapshot",
]

#: The format this code writes, and the newest it reads.
FORMAT_VERSION = 6

_Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


def _event_v1(data: dict[str, Any]) -> dict[str, Any]:
    """v1 -> v2: the payload gains its version; its fields are unchanged."""
    return {**data, "v": 2}


def _snapshot_v1(data: dict[str, Any]) -> dict[str, Any]:
    """v1 -> v2: the snapshot gains its version; ``names`` and ``vars`` are unchanged."""
    return {**data, "v": 2}


def _event_v2(data: dict[str, Any]) -> dict[str, Any]:
    """v2 -> v3: the same payload (version 3 changed snapshots only)."""
    return {**data, "v": 3}


def _snapshot_v2(data: dict[str, Any]) -> dict[str, Any]:
    """v2 -> v3: every value stays under ``names``; version 2 packed none."""
    return {**data, "v": 3}


def _event_v3(data: dict[str, Any]) -> dict[str, Any]:
    """v3 -> v4: only how records are stored changed (compression); the fields are unchanged."""
    return {**data, "v": 4}


def _snapshot_v3(data: dict[str, Any]) -> dict[str, Any]:
    """v3 -> v4: only how records are stored changed (compression); the fields are unchanged."""
    return {**data, "v": 4}


def _event_v4(data: dict[str, Any]) -> dict[str, Any]:
    """v4 -> v5: the same payload (version 5 changed snapshots only)."""
    return {**data, "v": 5}


def _snapshot_v4(data: dict[str, Any]) -> dict[str, Any]:
    """v4 -> v5: a packed value of version 4 is its base alone (no tails)."""
    return {**data, "v": 5}


def _event_v5(data: dict[str, Any]) -> dict[str, Any]:
    """v5 -> v6: the summary delta its meta meant (see :func:`summary_of_v5_meta`), if any."""
    meta = data.get("meta")
    summary = summary_of_v5_meta(meta) if isinstance(meta, dict) else {}
    return {**data, "v": 6, **({"summary": summary} if summary else {})}


def _snapshot_v5(data: dict[str, Any]) -> dict[str, Any]:
    """v5 -> v6: the same snapshot (version 6 changed events only)."""
    return {**data, "v": 6}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def summary_of_v5_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The wire form of the :class:`~saucer.store.summary.SummaryDelta` of an event of format 5 or
    older, from its ``meta`` as the engine of those versions wrote it (frozen: new events carry
    their own): ``session_status``; a ``round_end`` ends a round; a ``step`` or ``evaluation``
    event's ``cost`` adds (None: unknown); a ``session_end``'s ``summary`` holds the final figures;
    ``cost_summary.unknown``; the ``reason`` (a ``session_end``'s own first)."""
    out: dict[str, Any] = {}
    kind = meta.get("kind")
    if isinstance(meta.get("session_status"), str):
        out["status"] = meta["session_status"]
    if kind == "round_end":
        out["rounds_add"] = 1
    if kind in ("step", "evaluation") and "cost" in meta:
        if _number(meta["cost"]):
            out["cost_add"] = float(meta["cost"])
        elif meta["cost"] is None:
            out["unknown"] = True
    reason = meta.get("reason")
    final = meta.get("summary")
    if kind == "session_end" and isinstance(final, Mapping):
        for name in ("rounds", "steps"):
            if _number(final.get(name)):
                out[f"final_{name}"] = int(final[name])
        if "cost" in final:
            if _number(final["cost"]):
                out["final_cost"] = float(final["cost"])
            elif final["cost"] is None:
                out["unknown"] = True
        if isinstance(final.get("reason"), str) and final["reason"]:
            reason = final["reason"]
    costs = meta.get("cost_summary")
    if isinstance(costs, Mapping) and costs.get("unknown"):
        out["unknown"] = True
    if isinstance(reason, str) and reason:
        out["reason"] = reason
    return out


#: ``version -> the function that turns a record of that version into the next one``.
_EVENT_UPCASTERS: dict[int, _Upcaster] = {1: _event_v1, 2: _event_v2, 3: _event_v3, 4: _event_v4, 5: _event_v5}
_SNAPSHOT_UPCASTERS: dict[int, _Upcaster] = {
    1: _snapshot_v1,
    2: _snapshot_v2,
    3: _snapshot_v3,
    4: _snapshot_v4,
    5: _snapshot_v5,
}


def record_format(data: dict[str, Any]) -> int:
    """The format version a decoded record was written with (1: no version field)."""
    version = data.get("v", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"format version {version!r} is not a positive integer")
    return version


def _upcast(data: dict[str, Any], chain: dict[int, _Upcaster], what: str) -> dict[str, Any]:
    version = record_format(data)
    if version > FORMAT_VERSION:
        raise FormatTooNewError(what, version, FORMAT_VERSION)
    while version < FORMAT_VERSION:
        data = chain[version](data)
        version = record_format(data)
    return data


def upcast_event(data: dict[str, Any], what: str = "an event") -> dict[str, Any]:
    """A decoded event payload in the :data:`FORMAT_VERSION` shape (its input is not changed)."""
    if data.get("v") == FORMAT_VERSION:
        return data
    return _upcast(data, _EVENT_UPCASTERS, what)


def upcast_snapshot(data: dict[str, Any], what: str = "a snapshot") -> dict[str, Any]:
    """A decoded snapshot in the :data:`FORMAT_VERSION` shape (its input is not changed)."""
    if data.get("v") == FORMAT_VERSION:
        return data
    return _upcast(data, _SNAPSHOT_UPCASTERS, what)
