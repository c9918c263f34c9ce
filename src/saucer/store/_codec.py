"""Encoding of event payloads and snapshots, shared by the durable backends.

Each record carries a CRC32 of its stored bytes so a torn or altered record is
recognised as damaged instead of being folded into the state, and the format
version it was written in (``"v"``): older records are upcast on read
(:mod:`saucer.store.upcast`), newer ones refused.

Records over :data:`COMPRESS_OVER` bytes are stored zlib-compressed (level
:data:`COMPRESS_LEVEL`) and inflated with a cap (:mod:`saucer.store.inflate`). Measured on real engine sessions (``bench/store_scale.py``),
that is what keeps most events inside their table's page: SQLite moves a row of
a ``WITHOUT ROWID`` table over ~1 KB to overflow pages of its own, each 4 KB and
mostly empty; compressed, a step's record (commands, results, cursor) is 40-50%
of its JSON, and the file for 10^4 sessions about a third of what it was.
"""

from __future__ import annotations

import base64
import warnings
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import orjson

from saucer.store.inflate import InflateError, check_record_size, inflate
from saucer.store.model import CorruptRecordError, Event, Snapshot
from saucer.store.summary import SummaryDelta
from saucer.store.upcast import FORMAT_VERSION, record_format, upcast_event, upcast_snapshot


class DamagedRecord(Exception):
    """A payload that does not decode or whose checksum does not match."""


def encode_payload(event: Event, owner: str | None = None) -> tuple[bytes, int]:
    """The stored payload of an event (ops and meta) and its checksum.

    An event stored in the log of another session than its own (``owner``: a
    fork's copy of its parent's history) also records its own session, so it
    stays attributed to the session where it was made.
    """
    # An empty meta is left out: most events have none, and it is per row.
    data: dict[str, Any] = {"v": FORMAT_VERSION, "ops": event.ops}
    if event.meta:
        data["meta"] = event.meta
    if event.summary is not None:
        data["summary"] = event.summary.to_wire()
    if owner is not None and event.session_id != owner:
        data["session"] = event.session_id
    payload = orjson.dumps(data)
    if len(payload) > COMPRESS_OVER:  # the size is checked only then: the limit is far above it
        check_record_size(len(payload), f"session {event.session_id!r}: the event at version {event.version}")
        payload = zlib.compress(payload, COMPRESS_LEVEL)
    return payload, zlib.crc32(payload)


def decode_payload(payload: bytes, crc: int | None, what: str = "an event") -> dict[str, Any]:
    """Decode a payload into the current format, raising :class:`DamagedRecord` when it
    is unreadable and :class:`FormatTooNewError` when it is newer than this code."""
    payload = bytes(payload)
    if crc is not None and zlib.crc32(payload) != crc:
        raise DamagedRecord("checksum mismatch")
    if payload[:1] != b"{":  # JSON objects start with "{"; anything else is zlib (format 4)
        try:
            payload = inflate(payload)
        except InflateError as exc:
            raise DamagedRecord(f"undecodable payload: {exc}") from None
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise DamagedRecord(f"undecodable payload: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("ops"), list):
        raise DamagedRecord("payload has no operation list")
    try:
        return upcast_event(data, what)
    except ValueError as exc:
        raise DamagedRecord(str(exc)) from None


def payload_format(payload: bytes) -> int:
    """The format version a stored payload or snapshot was written in (for ``saucer store migrate``)."""
    blob = bytes(payload)
    if blob[:1] != b"{":
        try:
            blob = inflate(blob)
        except InflateError as exc:
            raise DamagedRecord(f"undecodable record: {exc}") from None
    try:
        data = orjson.loads(blob)
        return record_format(data) if isinstance(data, dict) else 1
    except (orjson.JSONDecodeError, ValueError) as exc:
        raise DamagedRecord(f"undecodable record: {exc}") from None


#: Event payloads and snapshots larger than this are stored zlib-compressed
#: (format 4; snapshots since format 1 over 4 KB). Below it a record fits its
#: page anyway and compression would only cost time.
COMPRESS_OVER = 512
#: zlib level: on engine records, level 6 is 0-15% smaller than level 1 for the
#: large ones (a start event's tool list: 3.6 KB against 4.2 KB from 14 KB) at
#: ~0.1 ms per 14 KB; 9 gains nothing more.
COMPRESS_LEVEL = 6


def encode_state(state: dict[str, Any]) -> tuple[bytes, int]:
    """The stored form of a snapshot's state and its checksum (of the stored bytes)."""
    blob = orjson.dumps({"v": FORMAT_VERSION, **state})
    check_record_size(len(blob), "a snapshot")
    if len(blob) > COMPRESS_OVER:
        blob = zlib.compress(blob, COMPRESS_LEVEL)
    return blob, zlib.crc32(blob)


def decode_state(blob: bytes, crc: int | None, what: str = "a snapshot") -> dict[str, Any]:
    """Decode a snapshot's state (current format, without its ``"v"``), raising
    :class:`DamagedRecord` when it is unreadable and :class:`FormatTooNewError`
    when it is newer than this code."""
    blob = bytes(blob)
    if crc is not None and zlib.crc32(blob) != crc:
        raise DamagedRecord("checksum mismatch")
    if blob[:1] != b"{":  # JSON objects start with "{"; anything else is zlib
        try:
            blob = inflate(blob)
        except InflateError as exc:
            raise DamagedRecord(f"undecodable snapshot: {exc}") from None
    try:
        data = orjson.loads(blob)
    except orjson.JSONDecodeError as exc:
        raise DamagedRecord(f"undecodable snapshot: {exc}") from None
    if not isinstance(data, dict):
        raise DamagedRecord("snapshot is not an object")
    try:
        data = upcast_snapshot(data, what)
    except ValueError as exc:
        raise DamagedRecord(str(exc)) from None
    data.pop("v", None)  # a fresh object: the version is the record's, not the state's
    return data


def decode_rows(session_id: str, rows: Sequence[tuple[Any, ...]], head: int | None = None) -> Iterator[Event]:
    """Decode event rows ``(version, ts, author, round, step, payload, crc)`` in version order.

    A damaged record is skipped with a warning only if it is the session's
    *trailing* record: its version is ``head`` (the session's latest version)
    or, when ``head`` is not given, it is the last row. A damaged record with
    readable records after it raises :class:`CorruptRecordError` for this
    session only.
    """
    last = len(rows) - 1
    for index, (version, ts, author, rnd, step, payload, crc) in enumerate(rows):
        try:
            data = decode_payload(payload, crc, f"session {session_id!r}: the event at version {version}")
        except DamagedRecord as exc:
            trailing = version == head if head is not None else index == last
            if trailing:
                warnings.warn(
                    f"session {session_id!r}: skipping damaged trailing record at version {version} ({exc})",
                    RuntimeWarning,
                    stacklevel=3,
                )
                return
            raise CorruptRecordError(session_id, version, str(exc)) from None
        origin = data.get("session")
        yield Event(
            origin if isinstance(origin, str) else session_id,
            version,
            ts,
            author,
            rnd,
            step,
            data["ops"],
            data.get("meta") or {},
            SummaryDelta.from_wire(data.get("summary")),
        )


def head_event(session_id: str, version: int, row: Sequence[Any]) -> Event | None:
    """The newest event of a session from its row ``(ts, author, round, step, payload, crc)``;
    None when the record is damaged (a listing shows no last event for it, silently)."""
    ts, author, rnd, step, payload, crc = row
    try:
        data = decode_payload(payload, crc)
    except DamagedRecord:
        return None
    origin = data.get("session")
    return Event(
        origin if isinstance(origin, str) else session_id,
        version,
        ts,
        author,
        rnd,
        step,
        data["ops"],
        data.get("meta") or {},
        SummaryDelta.from_wire(data.get("summary")),
    )


def quarantine_payload(payload: bytes, reason: str) -> tuple[bytes, int]:
    """The payload that replaces a damaged record: no operations; the reason
    and the original bytes (base64) in ``meta``, for forensics."""
    replacement = orjson.dumps(
        {
            "v": FORMAT_VERSION,
            "ops": [],
            "meta": {
                "damaged": reason,
                "original_base64": base64.b64encode(bytes(payload)).decode("ascii"),
            },
        }
    )
    return replacement, zlib.crc32(replacement)


def first_good_snapshot(session_id: str, rows: Iterable[tuple[Any, ...]]) -> Snapshot | None:
    """The newest readable snapshot; a damaged one falls back to an older one (or none)."""
    for version, ts, blob, crc in rows:
        try:
            return Snapshot(
                session_id,
                version,
                ts,
                decode_state(blob, crc, f"session {session_id!r}: the snapshot at version {version}"),
            )
        except DamagedRecord as exc:
            warnings.warn(
                f"session {session_id!r}: ignoring damaged snapshot at version {version} ({exc})",
                RuntimeWarning,
                stacklevel=3,
            )
    return None


def formats_of(rows: Iterable[tuple[Any, ...]]) -> dict[int, int]:
    """``{version: format}`` of stored ``(version, payload or snapshot)`` rows; damaged ones are left out."""
    out: dict[int, int] = {}
    for version, blob in rows:
        try:
            out[version] = payload_format(blob)
        except DamagedRecord:
            continue
    return out
