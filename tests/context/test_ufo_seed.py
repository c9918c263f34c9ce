"""The Context calls of seed 003 (issue 26), as a UFO user writes them: ``_sync_round_values()``,
``from_dict`` on an instance, unknown keys skipped with a warning, and one rule for what a
string names (a typed ContextName, else a free context variable) in every method."""

from __future__ import annotations

import warnings

import pytest

from saucer.context import Context, ContextNames
from saucer.store.memory import MemoryStore


def test_sync_round_values_is_a_no_op_because_values_are_derived_on_read() -> None:
    context = Context()
    context.set(ContextNames.CURRENT_ROUND_ID, 2)
    context.current_round_step = 4
    before = context.to_dict()
    assert context._sync_round_values() is None
    assert context.to_dict() == before and context.get(ContextNames.CURRENT_ROUND_STEP) == 4


def test_from_dict_on_an_instance_loads_into_it() -> None:
    source = Context()
    source.set(ContextNames.CURRENT_ROUND_ID, 1)
    source.set(ContextNames.REQUEST, "open notepad")
    source.current_round_cost = 0.25
    source.update_vars(set={"phase": "draft"})
    data = source.to_dict(ensure_serializable=True)

    context = Context()
    assert context.from_dict(data) is context  # UFO's form: loads into this Context
    assert context.get(ContextNames.REQUEST) == "open notepad"
    assert context.get(ContextNames.CURRENT_ROUND_COST) == 0.25 and context.get_var("phase") == "draft"
    made = Context.from_dict(data)  # the class form still makes a new one
    assert made is not context and made.to_dict() == context.to_dict()


def test_from_dict_into_a_stored_context_is_one_change() -> None:
    store = MemoryStore()
    context = Context.open(store, "s")
    context.from_dict({"REQUEST": "hi", "SUBTASK": "one", "_vars": {"k": 1}})
    assert context.commit() == 1
    again = Context.open(store, "s")
    assert again.get(ContextNames.SUBTASK) == "one" and again.get_var("k") == 1


def test_from_dict_skips_unknown_keys_with_one_warning_naming_them() -> None:
    context = Context()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        context.from_dict({"REQUEST": "hi", "NOT_A_NAME": 1, "also_unknown": 2})
    assert len(caught) == 1
    assert "'NOT_A_NAME'" in str(caught[0].message) and "'also_unknown'" in str(caught[0].message)
    assert context.get(ContextNames.REQUEST) == "hi"


def test_a_string_names_the_typed_name_in_every_method() -> None:
    store = MemoryStore()
    context = Context.open(store, "s")
    context.set("REQUEST", "open notepad")
    context.append("PREVIOUS_SUBTASKS", {"subtask": "a"})  # the typed list, not a variable
    context.incr("SESSION_STEP")
    assert context.compare_and_set("SUBTASK", "", "first")
    assert context.get(ContextNames.PREVIOUS_SUBTASKS) == [{"subtask": "a"}]
    assert context.get(ContextNames.SESSION_STEP) == 1 and context.get(ContextNames.SUBTASK) == "first"
    assert dict(context.vars) == {}
    context.commit()
    assert [e.version for e in context.history("PREVIOUS_SUBTASKS")] == [1]
    # A typed name's string is never a variable: refused where only variables go.
    for call in (
        lambda: context.update_vars(set={"REQUEST": "x"}),
        lambda: context.update_vars(delete=["SUBTASK"]),
        lambda: context.get_var("PREVIOUS_SUBTASKS"),
    ):
        with pytest.raises(TypeError, match="names the typed ContextNames"):
            call()
    # Any other string is a variable, in every method.
    context.append("notes", "n1")
    context.incr("retries")
    assert dict(context.vars) == {"notes": ["n1"], "retries": 1}
    context.close()
