"""Decompression of stored records with a cap: a small record never inflates into all of memory.

Records over a few hundred bytes are stored zlib-compressed (events,
snapshots, sealed values, the packed values of snapshots). zlib inflates up
to ~1000 times, so a 4.6 MB record could ask for 4.6 GB: every stored
compressed blob is inflated here, streamed, and refused as soon as it would
pass its cap -- the size a packed value declares, and never more than
:data:`MAX_INFLATED_BYTES`. Writes keep to the same limit
(:func:`check_record_size`), so what is written is always readable.
"""

from __future__ import annotations

import zlib

from saucer.store.model import StoreError

__all__ = ["MAX_INFLATED_BYTES", "InflateError", "RecordTooLargeError", "check_record_size", "inflate"]

#: The most bytes one stored record (an event's payload, a snapshot, a sealed or packed value) holds uncompressed.
MAX_INFLATED_BYTES = 256 * 1024 * 1024
_CHUNK = 1 << 20


class InflateError(ValueError):
    """A compressed record that does not inflate, or would inflate past its cap."""


class RecordTooLargeError(StoreError, ValueError):
    """A record to write is larger than :data:`MAX_INFLATED_BYTES` uncompressed (nothing was written)."""


def check_record_size(size: int, what: str) -> None:
    """:class:`RecordTooLargeError` when a record of ``size`` bytes (uncompressed) may not be stored."""
    if size > MAX_INFLATED_BYTES:
        raise RecordTooLargeError(
            f"{what} is {size:,} bytes of JSON, more than a record may hold ({MAX_INFLATED_BYTES:,}); nothing was written"
        )


def inflate(blob: bytes, limit: int = MAX_INFLATED_BYTES) -> bytes:
    """``blob`` decompressed (zlib), streamed: :class:`InflateError` when it is damaged or would
    exceed ``limit`` bytes (capped by :data:`MAX_INFLATED_BYTES`), before that much is held."""
    limit = min(limit, MAX_INFLATED_BYTES)
    inflater = zlib.decompressobj()
    out = bytearray()
    data = memoryview(blob)
    try:
        while True:
            # Never asks for more than the room left (+1 to see an overflow): memory stays within the cap.
            room = limit - len(out) + 1
            out += inflater.decompress(data, min(room, _CHUNK))
            if len(out) > limit:
                raise InflateError(f"inflates to more than {limit:,} bytes")
            data = memoryview(inflater.unconsumed_tail)
            if not data:
                break
        if not inflater.eof:
            out += inflater.flush(limit - len(out) + 1)
            if len(out) > limit:
                raise InflateError(f"inflates to more than {limit:,} bytes")
            if not inflater.eof:
                raise InflateError("incomplete or truncated compressed data")
    except zlib.error as exc:
        raise InflateError(str(exc)) from None
    return bytes(out)
