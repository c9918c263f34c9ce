"""The wire form of a value: JSON-canonical, checked, owned, known secrets out (:func:`to_wire`).

Every value a Context writes goes through :func:`to_wire` once, when it is
set; operations hold that form, so a commit, a store and the fold never check
a value again (see :mod:`saucer.context.events`).
"""

from __future__ import annotations

import math
from enum import Enum
from itertools import chain
from typing import Any

import orjson

from saucer.redaction import redact_known, redact_known_text
from saucer.store.model import ValueNotStorableError

__all__ = ["MAX_DEPTH", "STATE_MAX_DEPTH", "ValueNotStorableError", "to_wire"]


#: JSON numbers every backend and reader hold exactly: signed 64-bit integers.
_INT_MIN = -(2**63)
_INT_MAX = 2**63 - 1
_dumps = orjson.dumps
_STRICT_INTEGER = orjson.OPT_STRICT_INTEGER
#: ``int_keys=True``: int dict keys are allowed at every depth.
_ANY_DEPTH = 1 << 30
#: How deeply a value may nest lists and dicts (a scalar is depth 0). Deeper
#: values are refused when they are written: the JSON encoder of every store
#: has a recursion limit, and a value it cannot encode must never reach a commit.
MAX_DEPTH = 100
#: How deeply a stored value may nest once in the state: a value at
#: :data:`MAX_DEPTH` appended under ``STRUCTURAL_LOGS[round][subtask]`` (or to a
#: list) sits up to three levels deeper. Snapshots hold it well within every
#: encoder's limit.
STATE_MAX_DEPTH = MAX_DEPTH + 3


def to_wire(value: Any, key: str, *, int_keys: bool | int = False, max_depth: int = MAX_DEPTH) -> Any:
    """Return a JSON-canonical, independent copy of ``value``, saucer's own known secrets redacted (:func:`saucer.redaction.redact_known`).

    Tuples become lists, str enums their value. Anything JSON cannot hold
    faithfully (sets, objects, NaN, ints beyond 64 bits, strings that are not
    valid Unicode, int dict keys, lists and dicts nested more than
    :data:`MAX_DEPTH` levels deep) raises :class:`ValueNotStorableError`
    naming ``key`` and the path inside it.

    ``int_keys`` allows int dict keys (stored as their decimal strings): ``True``
    at every depth, an int ``n`` in the first ``n`` levels of dicts only (the
    per-round ledgers need 1, ``STRUCTURAL_LOGS`` 2). ``max_depth`` is for
    values read back from a state (:data:`STATE_MAX_DEPTH`).
    """
    cls = value.__class__
    if cls is str:
        if value.isascii():
            return redact_known_text(value)
    elif cls is int:
        if _INT_MIN <= value <= _INT_MAX:
            return value
    elif cls is bool or value is None:
        return value
    if cls is dict and max_depth > 0:
        encoded = _flat_json(value)  # a flat dict (a structural log entry, every step): checked in C
        if encoded is not None:
            return redact_known(value.copy(), encoded=encoded)
    depth = _ANY_DEPTH if int_keys is True else int(int_keys)
    if cls is dict or cls is list:
        try:  # plain JSON data (most values): copied in one pass, without building paths
            return redact_known(_plain(value, max_depth, depth))
        except _NotPlain:
            pass  # the full check below says what is wrong, and where (or handles tuples and enums)
    try:
        return redact_known(_to_wire(value, key, "", depth, max_depth))
    except _TooDeep as exc:
        shown = exc.path if len(exc.path) <= 40 else exc.path[:40] + "..."
        raise ValueNotStorableError(key, shown, f"lists and dicts nest more than {max_depth} levels deep") from None


#: The value types of a flat dict that :func:`_flat_copy` checks in C (not float: NaN would pass).
_FLAT_VALUES = frozenset((str, int, bool, type(None)))
_STR_KEYS = frozenset((str,))


def _flat_json(value: dict[Any, Any]) -> bytes | None:
    """The JSON text of ``value`` if it is a flat dict (str keys; str, int, bool or None values) of plain
    JSON data as :func:`_plain` checks it, checked in C: the encoding refuses an unpaired surrogate and,
    with ``OPT_STRICT_INTEGER``, an int beyond 53 bits (left to the full check). None otherwise."""
    if not (_FLAT_VALUES.issuperset(map(type, value.values())) and _STR_KEYS.issuperset(map(type, value))):
        return None
    try:
        return _dumps(value, option=_STRICT_INTEGER)
    except TypeError:  # orjson.JSONEncodeError: a surrogate, or a large int (valid or not: _plain says)
        return None


def _check_str(value: str, key: str, path: str) -> str:
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueNotStorableError(key, path, f"string has an unpaired surrogate at index {exc.start}") from None
    return value


class _NotPlain(Exception):
    """The value is not plain JSON data (or is too deep): :func:`_to_wire` decides."""


def _plain(value: Any, room: int, depth: int) -> Any:
    """A copy of ``value`` if it is plain JSON data -- exact dicts with str keys (or int keys in
    the first ``depth`` levels of dicts), lists, valid strs, 64-bit ints, finite floats, bools,
    None -- nested at most ``room`` levels; else :class:`_NotPlain`. Exactly what
    :func:`_to_wire` returns for such a value."""
    cls = value.__class__
    if cls is str:
        if value.isascii() or _valid_text(value):
            return value
    elif cls is int:
        if _INT_MIN <= value <= _INT_MAX:
            return value
    elif cls is float:
        if value - value == 0.0:  # finite: inf - inf and nan - nan are nan
            return value
    elif cls is bool or value is None:
        return value
    elif room > 0:
        if cls is dict:
            if _flat_json(value) is not None:  # checked in C: a structural log entry, when a snapshot writes it
                return value.copy()
            out: dict[str, Any] = {}
            for k, v in value.items():
                c = k.__class__
                if c is str:
                    if not k.isascii() and not _valid_text(k):
                        raise _NotPlain
                elif c is int and depth > 0:
                    k = str(k)
                else:
                    raise _NotPlain
                # ASCII strings, 64-bit ints and None (most items) are taken without a call each.
                c = v.__class__
                if (c is str and v.isascii()) or v is None or (c is int and _INT_MIN <= v <= _INT_MAX):
                    out[k] = v
                else:
                    out[k] = _plain(v, room - 1, depth - 1)
            return out
        if cls is list:
            if room > 1 and value and _DICTS.issuperset(map(type, value)):
                flat = _flat_dicts(value)  # a list of flat dicts (STRUCTURAL_LOGS): all checked in C
                if flat is not None:
                    return flat
            return [_plain(v, room - 1, depth) for v in value]
    raise _NotPlain


_DICTS = frozenset((dict,))
_chain = chain.from_iterable


def _flat_dicts(items: list[dict[Any, Any]]) -> list[dict[str, Any]] | None:
    """A copy of ``items`` (exact dicts) when every one is flat plain JSON data with str keys,
    checked in a few C calls over the whole list, not a Python call per item: what the dict
    branch of :func:`_plain` returns for each. None: something else (checked one item at a time)."""
    if not (
        _STR_KEYS.issuperset(map(type, _chain(items)))
        and _FLAT_VALUES.issuperset(map(type, _chain(map(dict.values, items))))
    ):
        return None
    try:  # every str valid Unicode, every int in 53 bits (see _flat_json)
        _dumps(items, option=_STRICT_INTEGER)
    except TypeError:
        return None
    return list(map(dict.copy, items))


def _valid_text(text: str) -> bool:
    """Whether ``text`` is valid Unicode (no unpaired surrogate): what every store can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _TooDeep(Exception):
    def __init__(self, path: str) -> None:
        self.path = path


def _to_wire(value: Any, key: str, path: str, depth: int, room: int) -> Any:
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, str):
        return _check_str(str.__str__(value), key, path)
    if isinstance(value, bool) or value is None:
        return value if value is None else bool(value)
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise ValueNotStorableError(key, path, f"{value} does not fit in a 64-bit integer")
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueNotStorableError(key, path, f"{value!r} is not a finite number")
        return float(value)
    if isinstance(value, dict):
        if room <= 0:
            raise _TooDeep(path)
        out: dict[str, Any] = {}
        for k, v in value.items():
            if isinstance(k, Enum):
                k = k.value
            if isinstance(k, str):
                k = _check_str(str.__str__(k), key, path)
            elif isinstance(k, int) and not isinstance(k, bool):
                if depth <= 0:
                    raise ValueNotStorableError(
                        key, path, f"dict key {k!r} is an int; JSON keys are strings, so use {str(k)!r}"
                    )
                k = str(int(k))
            else:
                raise ValueNotStorableError(key, path, f"dict key {k!r} is not a string")
            out[k] = _to_wire(v, key, f"{path}[{k!r}]", depth - 1, room - 1)
        return out
    if isinstance(value, (list, tuple)):
        if room <= 0:
            raise _TooDeep(path)
        return [_to_wire(v, key, f"{path}[{i}]", depth, room - 1) for i, v in enumerate(value)]
    raise ValueNotStorableError(key, path, f"{type(value).__name__} is not JSON data")
