"""to_wire's one-pass copy of plain JSON data gives exactly what the full check gives (or refuses alike)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from saucer.context import wire
from saucer.context.wire import MAX_DEPTH, ValueNotStorableError, to_wire

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(["\ud800", "é", "ok"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=4), st.just("\udfff"), st.integers(-3, 3)), inner, max_size=4),
    ),
    max_leaves=16,
)


def _full(value: object, depth: int, room: int = MAX_DEPTH) -> object:
    return wire._to_wire(value, "k", "", depth, room)


@settings(max_examples=400, deadline=None)
@given(_values, st.sampled_from([0, 1, 2, True]))
def test_the_fast_copy_is_the_full_check(value: object, int_keys: int) -> None:
    depth = 1 << 30 if int_keys is True else int_keys
    try:
        expected = _full(value, depth)
    except ValueNotStorableError:
        with pytest.raises(ValueNotStorableError):
            to_wire(value, "k", int_keys=int_keys)
        return
    got = to_wire(value, "k", int_keys=int_keys)
    assert repr(got) == repr(expected)  # repr: nan == nan, and -0.0 stays -0.0
    if isinstance(value, (dict, list)):
        assert got is not value  # a copy the caller's value does not alias


def test_depth_and_non_finite_numbers_are_refused_with_their_path() -> None:
    deep: list = []
    for _ in range(MAX_DEPTH):
        deep = [deep]
    with pytest.raises(ValueNotStorableError, match="nest more than"):
        to_wire({"a": deep}, "k")
    with pytest.raises(ValueNotStorableError, match=r"k\['b'\]\[1\]"):
        to_wire({"b": [1.0, math.inf]}, "k")
    with pytest.raises(ValueNotStorableError, match="unpaired surrogate"):
        to_wire({"b": ["\ud800"]}, "k")


def test_a_flat_dict_is_copied_checked_and_its_known_secrets_redacted() -> None:
    """The flat-dict path (a structural log entry, every step): a copy, refusals as the full check's,
    and a registered secret replaced as in any other value."""
    from saucer.redaction import REDACTED, register_secret

    secret = "flat-dict-secret-0123456789"
    register_secret(secret)
    entry = {"Round": 0, "Step": 2**62, "Agent": "a", "Ok": True, "None": None, "Subtask": f"use {secret}"}
    got = to_wire(entry, "STRUCTURAL_LOGS")
    assert got == {**entry, "Subtask": f"use {REDACTED}"} and got is not entry
    assert entry["Subtask"] == f"use {secret}"  # the caller's value is left alone
    clean = {"Round": 0, "Agent": "a"}
    copied = to_wire(clean, "k")
    assert copied == clean and copied is not clean
    with pytest.raises(ValueNotStorableError, match="unpaired surrogate"):
        to_wire({"Agent": "\udc80"}, "k")
    with pytest.raises(ValueNotStorableError, match="64-bit"):
        to_wire({"Step": 2**63}, "k")
    with pytest.raises(ValueNotStorableError, match="unpaired surrogate"):
        to_wire({"\ud800": 1}, "k")


class _Str(str):
    pass


_flat_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["\ud800", "é", "ok", _Str("sub")]),
    st.lists(st.integers(), max_size=1),
)
_entries = st.lists(
    st.dictionaries(st.sampled_from(["a", "b", "\udfff", _Str("a2"), 1]), _flat_scalars, max_size=3), max_size=5
)


@settings(max_examples=400, deadline=None)
@given(_entries, st.sampled_from([0, 1, 2]))
def test_a_list_of_flat_dicts_is_checked_in_one_pass_as_one_at_a_time(entries: list, depth: int) -> None:
    """The list-of-flat-dicts path (a structural log, in every snapshot) refuses, converts and copies
    exactly as the check of one entry at a time; its copies alias none of the caller's dicts."""
    try:
        expected = _full(entries, depth)
    except ValueNotStorableError:
        with pytest.raises(ValueNotStorableError):
            to_wire(entries, "k", int_keys=depth)
        return
    got = to_wire(entries, "k", int_keys=depth)
    assert repr(got) == repr(expected)
    assert [type(k) for e in got for k in e] == [type(k) for e in expected for k in e]
    assert [type(v) for e in got for v in e.values()] == [type(v) for e in expected for v in e.values()]
    assert not {id(e) for e in got} & {id(e) for e in entries}


def test_copy_json_copies_a_list_of_flat_dicts_apart() -> None:
    from saucer.store.model import copy_json

    entries = [{"a": 1, "b": "x"}, {"c": None}]
    got = copy_json(entries)
    assert got == entries and all(g is not e for g, e in zip(got, entries, strict=True))
    nested = [{"a": [1]}, {"b": 2}]
    deep = copy_json(nested)
    assert deep == nested and deep[0]["a"] is not nested[0]["a"]
