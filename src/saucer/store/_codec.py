"""Encoding of event payloads and snapshots, shared by the durable backends.

Each record carries a CRC32 of its payload so a torn or altered record is
recognised as damaged instead of being folded into the state.
"""

from __future__ import annotations

import warnings
import zlib
from typing import Any, Iterator

import orjson

from saucer.context.events import Event
from saucer.store.base import CorruptRecordError, Snapshot


class DamagedRecord(Exception):
    """A payload that does not decode or whose checksum does not match."""


def encode_payload(event: Event) -> tuple[bytes, int]:
    """The stored payload of an event (ops and meta) and its checksum."""
    payload = orjson.dumps({"ops": event.ops, "meta": event.meta})
    return payload, zlib.crc32(payload)


def decode_payload(payload: bytes, crc: int | None) -> dict[str, Any]:
    """Decode a payload, raising :class:`DamagedRecord` when it is unreadable."""
    payload = bytes(payload)
    if crc is not None and zlib.crc32(payload) != crc:
        raise DamagedRecord("checksum mismatch")
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise DamagedRecord(f"undecodable payload: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("ops"), list):
        raise DamagedRecord("payload has no operation list")
    return data


def encode_state(state: dict[str, Any]) -> tuple[bytes, int]:
    """The stored form of a snapshot's state and its checksum."""
    blob = orjson.dumps(state)
    return blob, zlib.crc32(blob)


def decode_state(blob: bytes, crc: int | None) -> dict[str, Any]:
    """Decode a snapshot, raising :class:`DamagedRecord` when it is unreadable."""
    blob = bytes(blob)
    if crc is not None and zlib.crc32(blob) != crc:
        raise DamagedRecord("checksum mismatch")
    try:
        data = orjson.loads(blob)
    except orjson.JSONDecodeError as exc:
        raise DamagedRecord(f"undecodable snapshot: {exc}") from None
    if not isinstance(data, dict):
        raise DamagedRecord("snapshot is not an object")
    return data


def decode_rows(session_id: str, rows: list[tuple[Any, ...]]) -> Iterator[Event]:
    """Decode event rows; skip a damaged *trailing* record, refuse one in the middle."""
    for index, (version, ts, author, rnd, step, payload, crc) in enumerate(rows):
        try:
            data = decode_payload(payload, crc)
        except DamagedRecord as exc:
            if index == len(rows) - 1:
                warnings.warn(
                    f"session {session_id!r}: skipping damaged trailing record at version {version} ({exc})",
                    RuntimeWarning,
                    stacklevel=3,
                )
                return
            raise CorruptRecordError(session_id, version, str(exc)) from None
        yield Event(session_id, version, ts, author, rnd, step, data["ops"], data.get("meta") or {})


def first_good_snapshot(session_id: str, rows: list[tuple[Any, ...]]) -> Snapshot | None:
    """The newest readable snapshot; a damaged one falls back to an older one (or none)."""
    for version, ts, blob, crc in rows:
        try:
            return Snapshot(session_id, version, ts, decode_state(blob, crc))
        except DamagedRecord as exc:
            warnings.warn(
                f"session {session_id!r}: ignoring damaged snapshot at version {version} ({exc})",
                RuntimeWarning,
                stacklevel=3,
            )
    return None
