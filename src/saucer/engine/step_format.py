"""The stored shape of a step record, and the upcasters that read older shapes.

The engine stores every committed step twice: as the ``meta`` of the step's
event (:meth:`~saucer.engine.logs.StepRecord.to_meta`, what resume, retry,
experience plans and the service read back) and as a line of ``response.log``
(:meth:`~saucer.engine.logs.StepRecord.to_dict`). Both carry the *step format*
they were written in under ``"step_format"``; readers take them through
:func:`upcast_step`, a chain of small pure functions (``v1 -> v2 -> ...``),
so a record written by any earlier saucer reaches the code in today's shape,
and one written by a newer saucer is refused, naming both versions, never guessed at.

The versions:

1. saucer 0.1.0 up to record format 3 of the store: the fields of
   :class:`~saucer.engine.logs.StepRecord` (flat in the event's meta, beside
   ``kind``, ``session_status`` and ``cursor``), with no version (the golden
   stores under ``tests/golden`` and ``tests/engine/data/response-v1.log``
   hold real ones).
2. The same fields, tagged ``"step_format": 2``.

Adding a version: write ``_step_vN`` (a version N record in, a version N + 1
record out, its input unchanged), add it to :data:`_UPCASTERS`, bump
:data:`STEP_FORMAT`, and test it from real version N bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from saucer.engine.errors import EngineError

__all__ = ["STEP_FORMAT", "STEP_FORMAT_KEY", "StepFormatError", "step_format_of", "upcast_step"]

#: The step format this saucer writes, and the newest it reads.
STEP_FORMAT = 2
#: The key that says a stored step record's format (absent: version 1).
STEP_FORMAT_KEY: Final = "step_format"


class StepFormatError(EngineError, ValueError):
    """A stored step record in a format this saucer does not read (newer, or not a version)."""


def _step_v1(data: Mapping[str, Any]) -> dict[str, Any]:
    """v1 -> v2: the record gains its version; its fields are unchanged."""
    return {**data, STEP_FORMAT_KEY: 2}


_UPCASTERS: dict[int, Callable[[Mapping[str, Any]], dict[str, Any]]] = {1: _step_v1}


def step_format_of(data: Mapping[str, Any]) -> int:
    """The step format a stored record was written in (1: no version field)."""
    version = data.get(STEP_FORMAT_KEY, 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise StepFormatError(f"step format {version!r} is not a positive integer")
    return version


def upcast_step(data: Mapping[str, Any], what: str = "a step record") -> Mapping[str, Any]:
    """``data`` (an event's meta or a ``response.log`` line) in the :data:`STEP_FORMAT` shape.

    The same object when it is current; a new one otherwise (the input is
    never changed). :class:`StepFormatError` for a newer format.
    """
    version = step_format_of(data)
    if version == STEP_FORMAT:
        return data
    if version > STEP_FORMAT:
        raise StepFormatError(
            f"{what} is in step format {version}; this saucer reads up to step format {STEP_FORMAT}: "
            "upgrade saucer to read it"
        )
    while version < STEP_FORMAT:
        data = _UPCASTERS[version](data)
        version = step_format_of(data)
    return data
