"""The Context API (UFO's, plus AG2's context vars and atomic operations)."""

from __future__ import annotations

import json
import logging
import math
import warnings

import pytest

from saucer.context import Context, ContextNames, ValueNotStorableError, WeavingMode

N = ContextNames


# ---------------------------------------------------------------- reads


def test_get_never_writes_detached() -> None:
    ctx = Context()
    before = ctx.to_dict()
    for member in ContextNames:
        ctx.get(member)
    ctx.current_round_step, ctx.current_round_cost, ctx.current_round_subtask_amount  # noqa: B018
    assert ctx.to_dict() == before
    assert ctx.get(N.ROUND_STEP) == {} and ctx.get(N.ROUND_COST) == {} and ctx.get(N.ROUND_SUBTASK_AMOUNT) == {}


def test_get_never_writes_attached(db_url: str) -> None:
    ctx = Context.open(db_url, "s")
    ctx.set(N.CURRENT_ROUND_ID, 2)
    ctx.commit()
    before = ctx.to_dict()
    for member in ContextNames:
        ctx.get(member)
    ctx.get_var("nothing")
    dict(ctx.vars)
    assert ctx.pending == []
    assert ctx.to_dict() == before
    assert ctx.commit() == 1  # nothing to commit: no event
    assert len(ctx.history()) == 1
    ctx.close()


def test_get_default_only_when_the_name_has_none() -> None:
    ctx = Context()
    assert ctx.get(N.REQUEST, "fallback") == ""  # the name's own default wins
    assert ctx.get(N.APPLICATION_WINDOW_INFO, "fallback") == "fallback"
    assert ctx.get(N.LOGGER, "fallback") == "fallback"
    assert ctx.get("REQUEST") == ""  # names work as strings too


def test_get_unknown_name_is_a_key_error() -> None:
    with pytest.raises(KeyError, match="NOT_A_NAME"):
        Context().get("NOT_A_NAME")


def test_current_round_values_derive_from_the_ledgers() -> None:
    ctx = Context()
    ctx.set(N.CURRENT_ROUND_ID, 1)
    ctx.current_round_step = 4
    ctx.current_round_cost += 0.25
    ctx.current_round_subtask_amount += 2
    ctx.set(N.CURRENT_ROUND_ID, 2)
    assert ctx.get(N.CURRENT_ROUND_STEP) == 0
    ctx.current_round_step += 1
    ctx.current_round_cost = 1.5
    assert ctx.get(N.ROUND_STEP) == {1: 4, 2: 1}
    assert ctx.get(N.ROUND_COST) == {1: 0.25, 2: 1.5}
    assert ctx.get(N.ROUND_SUBTASK_AMOUNT) == {1: 2}
    assert ctx.get(N.CURRENT_ROUND_COST) == 1.5 and ctx.current_round_cost == 1.5
    assert isinstance(ctx.get(N.CURRENT_ROUND_COST), float)
    ctx.set(N.CURRENT_ROUND_ID, 1)
    assert (ctx.current_round_step, ctx.current_round_cost, ctx.current_round_subtask_amount) == (4, 0.25, 2)
    ctx.set(N.CURRENT_ROUND_COST, 3)  # an int cost is stored as a float
    assert ctx.get(N.ROUND_COST)[1] == 3.0 and isinstance(ctx.get(N.ROUND_COST)[1], float)


# --------------------------------------------------------------- writes


def test_set_unknown_name_is_a_key_error_naming_it() -> None:
    with pytest.raises(KeyError, match="NOPE"):
        Context().set("NOPE", 1)


@pytest.mark.parametrize(
    "name, value",
    [
        (N.REQUEST, 5),
        (N.ID, "1"),
        (N.ID, True),
        (N.ID, 1.5),
        (N.SESSION_COST, "0.1"),
        (N.PREVIOUS_SUBTASKS, "not a list"),
        (N.ROUND_STEP, {1: "x"}),
        (N.ROUND_STEP, {"one": 1}),
        (N.ROUND_COST, [1.0]),
        (N.TOOL_INFO, []),
        (N.STRUCTURAL_LOGS, {1: [1]}),
        (N.STRUCTURAL_LOGS, {"a": {0: []}}),
        (N.STRUCTURAL_LOGS, {1: {0: ["not a dict"]}}),
        (N.WEAVING_MODE, "weaving"),
        (N.CURRENT_ROUND_STEP, 1.5),
        (N.LOGGER, "a logger"),
    ],
)
def test_set_wrong_type_is_a_type_error_naming_the_key(name: ContextNames, value: object) -> None:
    ctx = Context()
    before = ctx.to_dict()
    with pytest.raises(TypeError, match=name.value):
        ctx.set(name, value)
    assert ctx.to_dict() == before


def test_set_accepts_the_declared_types() -> None:
    ctx = Context()
    logger = logging.getLogger("saucer.test")
    ctx.set(N.LOGGER, logger)
    ctx.set(N.SESSION_COST, 1)
    ctx.set(N.WEAVING_MODE, "editing")
    ctx.set(N.PREVIOUS_SUBTASKS, ("a", "b"))
    ctx.set(N.APPLICATION_WINDOW, object())
    ctx.set(N.APPLICATION_WINDOW_INFO, {"title": "x", "rect": [0, 0, 1, 1]})
    assert ctx.get(N.LOGGER) is logger
    assert ctx.get(N.SESSION_COST) == 1.0 and isinstance(ctx.get(N.SESSION_COST), float)
    assert ctx.get(N.WEAVING_MODE) is WeavingMode.EDITING
    assert ctx.get(N.PREVIOUS_SUBTASKS) == ["a", "b"]  # tuples are stored as lists, live and replayed


def test_update_dict_merge_form() -> None:
    ctx = Context()
    ctx.set(N.TOOL_INFO, {"a": 1})
    ctx.update_dict(N.TOOL_INFO, {"b": 2})
    ctx.update_dict("TOOL_INFO", {"a": 3})
    assert ctx.get(N.TOOL_INFO) == {"a": 3, "b": 2}
    ctx.update_dict(N.ROUND_STEP, {1: 2})
    ctx.update_dict(N.ROUND_STEP, {2: 5})
    assert ctx.get(N.ROUND_STEP) == {1: 2, 2: 5}
    with pytest.raises(TypeError, match="REQUEST"):
        ctx.update_dict(N.REQUEST, {"a": 1})
    with pytest.raises(TypeError, match="TOOL_INFO"):
        ctx.update_dict(N.TOOL_INFO, ["not", "a", "dict"])  # type: ignore[arg-type]


def test_update_dict_many_names_form() -> None:
    ctx = Context()
    ctx.update_dict({N.REQUEST: "open notepad", "MODE": "normal", N.CURRENT_ROUND_STEP: 3, N.CURRENT_ROUND_ID: 7})
    assert ctx.get(N.REQUEST) == "open notepad"
    assert ctx.get(N.MODE) == "normal"
    assert ctx.get(N.ROUND_STEP) == {7: 3}  # the round id is applied first
    with pytest.raises(KeyError, match="BOGUS"):
        ctx.update_dict({N.REQUEST: "x", "BOGUS": 1})
    with pytest.raises(TypeError, match="ID"):
        ctx.update_dict({N.REQUEST: "changed", N.ID: "not an int"})
    assert ctx.get(N.REQUEST) == "open notepad"  # all checked before any is written


def test_update_dict_many_names_is_one_change(db_url: str) -> None:
    ctx = Context.open(db_url, "s", durability="strict")
    ctx.update_dict({N.REQUEST: "r", N.SUBTASK: "s", N.SESSION_STEP: 2})
    assert ctx.version == 1
    assert len(ctx.history()[0].ops) == 3
    ctx.close()


def test_to_dict_ensure_serializable_drops_runtime_values_and_warns_once() -> None:
    ctx = Context()
    ctx.set(N.LOGGER, logging.getLogger("a"))
    ctx.set(N.REQUEST_LOGGER, logging.getLogger("b"))
    ctx.set(N.APPLICATION_WINDOW, object())
    ctx.set(N.CONSTELLATION, object())
    ctx.set(N.REQUEST, "hello")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = ctx.to_dict(ensure_serializable=True)
        again = ctx.to_dict(ensure_serializable=True)
    assert len(caught) == 2  # at most one per call
    assert "LOGGER" in str(caught[0].message) and "CONSTELLATION" in str(caught[0].message)
    for name in ("LOGGER", "REQUEST_LOGGER", "EVALUATION_LOGGER", "APPLICATION_WINDOW", "CONSTELLATION"):
        assert data[name] is None
    assert data == again
    json.dumps(data)
    assert data["REQUEST"] == "hello" and data["WEAVING_MODE"] == "creation"
    raw = ctx.to_dict()
    assert isinstance(raw["LOGGER"], logging.Logger)


def test_to_dict_without_runtime_values_does_not_warn() -> None:
    ctx = Context()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ctx.to_dict(ensure_serializable=True)


def test_from_dict_is_a_classmethod_returning_a_new_context() -> None:
    class Sub(Context):
        pass

    original = Context()
    original.set(N.REQUEST, "r")
    restored = Sub.from_dict(original.to_dict())
    assert type(restored) is Sub
    assert restored is not original and restored.get(N.REQUEST) == "r"


def test_int_round_ids_survive_to_dict_json_from_dict() -> None:
    ctx = Context()
    ctx.set(N.CURRENT_ROUND_ID, 2)
    ctx.current_round_step = 3
    ctx.current_round_cost = 0.5
    ctx.current_round_subtask_amount = 1
    ctx.add_to_structural_logs({"Round": 2, "SubtaskIndex": 0, "Action": "type", "Cost": 0.1})
    ctx.update_vars(set={"status": "ok"})
    data = json.loads(json.dumps(ctx.to_dict(ensure_serializable=True)))
    again = Context.from_dict(data)
    assert again.get(N.ROUND_STEP) == {2: 3}
    assert again.get(N.ROUND_COST) == {2: 0.5}
    assert again.get(N.ROUND_SUBTASK_AMOUNT) == {2: 1}
    assert all(isinstance(k, int) for k in again.get(N.ROUND_STEP))
    assert again.current_round_step == 3 and again.current_round_cost == 0.5
    assert list(again.get(N.STRUCTURAL_LOGS)) == [2]
    assert again.filter_structural_logs(2, 0, "Action") == ["type"]
    assert again.get_var("status") == "ok"
    assert again.to_dict(ensure_serializable=True) == ctx.to_dict(ensure_serializable=True)


def test_structural_logs() -> None:
    ctx = Context()
    ctx.add_to_structural_logs({"Round": 0, "SubtaskIndex": 1, "Action": "click", "Target": "OK"})
    ctx.add_to_structural_logs({"Round": 0, "SubtaskIndex": 1, "Action": "type"})
    ctx.add_to_structural_logs({"Round": 0, "Action": "ignored"})  # no SubtaskIndex
    ctx.add_to_structural_logs({"SubtaskIndex": 0, "Action": "ignored"})  # no Round
    assert ctx.filter_structural_logs(0, 1, "Action") == ["click", "type"]
    assert ctx.filter_structural_logs(0, 1, ["Action", "Target"]) == [
        {"Action": "click", "Target": "OK"},
        {"Action": "type", "Target": None},
    ]
    assert ctx.filter_structural_logs(5, 5, "Action") == []
    with pytest.raises(TypeError):
        ctx.filter_structural_logs(0, 1, 3)  # type: ignore[arg-type]
    assert ctx.get(N.STRUCTURAL_LOGS) == {
        0: {
            1: [
                {"Round": 0, "SubtaskIndex": 1, "Action": "click", "Target": "OK"},
                {"Round": 0, "SubtaskIndex": 1, "Action": "type"},
            ]
        }
    }


def test_attach_command_dispatcher() -> None:
    ctx = Context()
    dispatcher = object()
    ctx.attach_command_dispatcher(dispatcher)
    assert ctx.command_dispatcher is dispatcher
    assert "command_dispatcher" not in ctx.to_dict()


# ----------------------------------------------------------------- vars


def test_vars_is_a_read_only_copy() -> None:
    ctx = Context()
    ctx.update_vars(set={"a": [1]})
    view = ctx.vars
    with pytest.raises(TypeError):
        view["a"] = 2  # type: ignore[index]
    view["a"].append(2)
    assert ctx.vars == {"a": [1]}
    assert ctx.get_var("missing", "d") == "d"


def test_update_vars_deletes_first_then_sets_in_one_change(db_url: str) -> None:
    ctx = Context.open(db_url, "s", durability="strict")
    ctx.update_vars(set={"a": 1, "b": 2})
    ctx.update_vars(set={"a": 10, "c": 3}, delete=["a", "b", "never-set"])
    assert dict(ctx.vars) == {"a": 10, "c": 3}  # "a" deleted, then set again
    events = ctx.history()
    assert len(events) == 2
    assert [op["op"] for op in events[1].ops] == ["delete", "delete", "delete", "set", "set"]
    ctx.delete_var("c")
    assert dict(ctx.vars) == {"a": 10}
    with pytest.raises(TypeError):
        ctx.update_vars(delete="a")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ctx.update_vars(set={1: "x"})  # type: ignore[dict-item]
    ctx.close()


# ---------------------------------------------------------- atomic ops


def test_incr_append_cas_on_vars() -> None:
    ctx = Context()
    assert ctx.incr("n") == 1
    assert ctx.incr("n", by=4) == 5
    assert ctx.incr("f", by=0.5) == 0.5
    ctx.append("log", "a")
    ctx.append("log", {"b": [1, 2]})
    assert ctx.get_var("log") == ["a", {"b": [1, 2]}]
    assert ctx.compare_and_set("status", None, "idle") is True
    assert ctx.compare_and_set("status", "busy", "done") is False
    assert ctx.compare_and_set("status", "idle", "busy") is True
    assert ctx.get_var("status") == "busy"
    ctx.update_vars(set={"s": "text", "flag": True})
    with pytest.raises(TypeError, match="vars.s"):
        ctx.incr("s")
    with pytest.raises(TypeError):
        ctx.incr("flag")
    with pytest.raises(TypeError):
        ctx.incr("n", by="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="vars.s"):
        ctx.append("s", 1)
    assert ctx.get_var("n") == 5 and ctx.get_var("s") == "text"


def test_atomic_ops_on_typed_names() -> None:
    ctx = Context()
    assert ctx.incr(N.SESSION_STEP) == 1
    assert ctx.incr(N.SESSION_STEP, 2) == 3
    assert ctx.incr(N.SESSION_COST, 1) == 1.0 and isinstance(ctx.get(N.SESSION_COST), float)
    ctx.set(N.CURRENT_ROUND_ID, 4)
    assert ctx.incr(N.CURRENT_ROUND_STEP) == 1
    assert ctx.incr(N.CURRENT_ROUND_STEP) == 2
    assert ctx.get(N.ROUND_STEP) == {4: 2}  # the atomic op lands in the round ledger
    ctx.incr(N.CURRENT_ROUND_COST, 1)
    assert ctx.get(N.ROUND_COST) == {4: 1.0} and isinstance(ctx.get(N.ROUND_COST)[4], float)
    ctx.incr(N.CURRENT_ROUND_SUBTASK_AMOUNT)
    assert ctx.current_round_subtask_amount == 1
    ctx.append(N.PREVIOUS_SUBTASKS, "open file")
    ctx.append(N.PREVIOUS_SUBTASKS, ("save", 1))
    assert ctx.get(N.PREVIOUS_SUBTASKS) == ["open file", ["save", 1]]
    assert ctx.compare_and_set(N.REQUEST, "", "go") is True
    assert ctx.compare_and_set(N.REQUEST, "", "again") is False
    assert ctx.compare_and_set(N.CURRENT_ROUND_STEP, 2, 10) is True
    assert ctx.get(N.ROUND_STEP) == {4: 10}
    assert ctx.compare_and_set(N.ROUND_STEP, {4: 10}, {4: 11, 5: 0}) is True
    assert ctx.get(N.ROUND_STEP) == {4: 11, 5: 0}
    ctx.set(N.CURRENT_ROUND_ID, 9)
    assert ctx.compare_and_set(N.CURRENT_ROUND_STEP, 0, 1) is True  # unset reads as 0, as get() does
    with pytest.raises(TypeError, match="REQUEST"):
        ctx.incr(N.REQUEST)
    with pytest.raises(TypeError, match="CURRENT_ROUND_STEP"):
        ctx.incr(N.CURRENT_ROUND_STEP, 0.5)
    with pytest.raises(TypeError, match="SESSION_STEP"):
        ctx.incr(N.SESSION_STEP, 0.5)
    with pytest.raises(TypeError, match="SESSION_STEP"):
        ctx.append(N.SESSION_STEP, 1)
    with pytest.raises(TypeError, match="REQUEST"):
        ctx.compare_and_set(N.REQUEST, "go", 5)
    with pytest.raises(TypeError):
        ctx.incr(N.LOGGER)


def test_incr_refuses_a_result_that_cannot_be_stored() -> None:
    ctx = Context()
    ctx.update_vars(set={"big": 2**62, "huge": 1e308})
    with pytest.raises(ValueNotStorableError, match="vars.big"):
        ctx.incr("big", 2**62)
    with pytest.raises(ValueNotStorableError, match="vars.huge"):
        ctx.incr("huge", 1e308)
    assert ctx.get_var("big") == 2**62 and ctx.get_var("huge") == 1e308


# ------------------------------------------------------------- aliasing


def test_mutating_a_value_after_writing_it_does_not_change_the_context() -> None:
    ctx = Context()
    subtasks = ["a"]
    tools = {"t": {"args": [1]}}
    var = {"nested": [1, {"x": 1}]}
    ctx.set(N.PREVIOUS_SUBTASKS, subtasks)
    ctx.set(N.TOOL_INFO, tools)
    ctx.update_vars(set={"v": var})
    item = {"k": [1]}
    ctx.append("items", item)
    subtasks.append("b")
    tools["t"]["args"].append(2)
    var["nested"][1]["x"] = 2
    item["k"].append(2)
    assert ctx.get(N.PREVIOUS_SUBTASKS) == ["a"]
    assert ctx.get(N.TOOL_INFO) == {"t": {"args": [1]}}
    assert ctx.get_var("v") == {"nested": [1, {"x": 1}]}
    assert ctx.get_var("items") == [{"k": [1]}]


def test_mutating_what_get_returned_does_not_change_the_context(db_url: str) -> None:
    ctx = Context.open(db_url, "s")
    ctx.set(N.PREVIOUS_SUBTASKS, ["a"])
    ctx.set(N.ROUND_STEP, {1: 1})
    ctx.update_vars(set={"v": {"l": [1]}})
    ctx.commit()
    ctx.get(N.PREVIOUS_SUBTASKS).append("b")
    ctx.get(N.ROUND_STEP)[2] = 2
    ctx.get_var("v")["l"].append(2)
    ctx.vars["v"]["l"].append(3)
    assert ctx.get(N.PREVIOUS_SUBTASKS) == ["a"]
    assert ctx.get(N.ROUND_STEP) == {1: 1}
    assert ctx.get_var("v") == {"l": [1]}
    assert ctx.pending == []
    ctx.history()[0].ops.clear()  # nor does mutating what history() returned
    assert len(ctx.history()[0].ops) == 3
    ctx.close()


def test_pending_ops_do_not_alias_the_state(db_url: str) -> None:
    ctx = Context.open(db_url, "s")
    ctx.update_vars(set={"l": [1]})
    ctx.append("l", 2)  # mutates the live list; the pending "set" must still say [1]
    ctx.commit()
    reopened = Context.open(db_url, "s")
    assert reopened.get_var("l") == [1, 2]
    ctx.close()
    reopened.close()


# ------------------------------------------------------ unstorable values


class Thing:
    pass


@pytest.mark.parametrize(
    "value, path",
    [
        ({1, 2}, ""),
        (Thing(), ""),
        (math.nan, ""),
        (math.inf, ""),
        ({"a": [1, {"b": {3}}]}, "['a'][1]['b']"),
        ({"a": [1.0, math.nan]}, "['a'][1]"),
        ({1: "int key"}, ""),
        ({"k": {2: "int key"}}, "['k']"),
        ({"k": b"bytes"}, "['k']"),
        ([2**70], "[0]"),
        ({"s": "lone \ud800 surrogate"}, "['s']"),
        ({("tuple", "key"): 1}, ""),
    ],
)
def test_unstorable_var_values_are_refused_with_key_and_path(value: object, path: str) -> None:
    ctx = Context()
    with pytest.raises(ValueNotStorableError) as info:
        ctx.update_vars(set={"good": 1, "bad": value})
    assert info.value.key == "vars.bad"
    assert info.value.path == path
    assert f"vars.bad{path}" in str(info.value)
    assert dict(ctx.vars) == {}  # nothing of the change was applied


@pytest.mark.parametrize(
    "name, value, path",
    [
        (N.TOOL_INFO, {"t": {1, 2}}, "['t']"),
        (N.TOOL_INFO, {1: "int key"}, ""),  # would silently become "1"
        (N.APPLICATION_WINDOW_INFO, {"rect": [0, math.nan]}, "['rect'][1]"),
        (N.PREVIOUS_SUBTASKS, [Thing()], "[0]"),
        (N.DEVICE_INFO, [{"id": object()}], "[0]['id']"),
        (N.STRUCTURAL_LOGS, {1: {0: [{5: "int key inside an entry"}]}}, "['1']['0'][0]"),
        (N.ID, 2**64, ""),
    ],
)
def test_unstorable_typed_values_are_refused_with_key_and_path(name: ContextNames, value: object, path: str) -> None:
    ctx = Context()
    before = ctx.to_dict()
    with pytest.raises(ValueNotStorableError) as info:
        ctx.set(name, value)
    assert info.value.key == name.value and info.value.path == path
    assert isinstance(info.value, TypeError)
    assert ctx.to_dict() == before


def test_unstorable_values_in_atomic_ops_are_refused(db_url: str) -> None:
    ctx = Context.open(db_url, "s")
    with pytest.raises(ValueNotStorableError, match="vars.l"):
        ctx.append("l", {1, 2})
    with pytest.raises(ValueNotStorableError, match="PREVIOUS_SUBTASKS"):
        ctx.append(N.PREVIOUS_SUBTASKS, Thing())
    with pytest.raises(ValueNotStorableError, match="vars.c"):
        ctx.compare_and_set("c", None, {1: "int key"})
    with pytest.raises(ValueNotStorableError):
        ctx.add_to_structural_logs({"Round": 1, "SubtaskIndex": 1, "obj": Thing()})
    assert ctx.pending == [] and dict(ctx.vars) == {}
    ctx.close()


def test_int_keys_are_fine_where_the_type_says_round_ids() -> None:
    ctx = Context()
    ctx.set(N.ROUND_COST, {1: 0.5, "2": 1})
    assert ctx.get(N.ROUND_COST) == {1: 0.5, 2: 1.0}
    ctx.set(N.STRUCTURAL_LOGS, {1: {2: [{"a": 1}]}})
    assert ctx.filter_structural_logs(1, 2, "a") == [1]


def test_compare_and_set_compares_stored_forms() -> None:
    ctx = Context()
    ctx.update_vars(set={"t": (1, 2)})  # stored, and read back, as [1, 2]
    assert ctx.compare_and_set("t", (1, 2), "x") is True
    ctx.set(N.ROUND_STEP, {1: 2})
    assert ctx.compare_and_set(N.ROUND_STEP, {"1": 2}, {1: 3}) is True
    assert ctx.get(N.ROUND_STEP) == {1: 3}
