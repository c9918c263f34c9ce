"""ContextNames: the 30 names of UFO's documented table, with types, defaults, durability."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from saucer.context import Context, ContextNames, WeavingMode

# name -> (type, default, durable), as ARCHITECTURE.md's table gives them
TABLE: dict[str, tuple[Any, Any, bool]] = {
    "ID": (int, 0, True),
    "MODE": (str, "", True),
    "CURRENT_ROUND_ID": (int, 0, True),
    "REQUEST": (str, "", True),
    "SUBTASK": (str, "", True),
    "PREVIOUS_SUBTASKS": (list, [], True),
    "HOST_MESSAGE": (list, [], True),
    "ROUND_RESULT": (str, "", True),
    "SESSION_COST": (float, 0.0, True),
    "ROUND_COST": (dict[int, float | None], {}, True),  # None: the round's cost is unknown
    "CURRENT_ROUND_COST": (float, 0.0, True),
    "SESSION_STEP": (int, 0, True),
    "ROUND_STEP": (dict[int, int], {}, True),
    "CURRENT_ROUND_STEP": (int, 0, True),
    "ROUND_SUBTASK_AMOUNT": (dict[int, int], {}, True),
    "CURRENT_ROUND_SUBTASK_AMOUNT": (int, 0, True),
    "APPLICATION_WINDOW": (object, None, False),
    "APPLICATION_WINDOW_INFO": (Any, None, True),
    "APPLICATION_PROCESS_NAME": (str, "", True),
    "APPLICATION_ROOT_NAME": (str, "", True),
    "CONTROL_REANNOTATION": (list, [], True),
    "LOG_PATH": (str, "", True),
    "LOGGER": (logging.Logger, None, False),
    "REQUEST_LOGGER": (logging.Logger, None, False),
    "EVALUATION_LOGGER": (logging.Logger, None, False),
    "STRUCTURAL_LOGS": (dict[int, dict[int, list[dict]]], {}, True),
    "TOOL_INFO": (dict, {}, True),
    "DEVICE_INFO": (list, [], True),
    "CONSTELLATION": (object, None, False),
    "WEAVING_MODE": (WeavingMode, WeavingMode.CREATION, True),
}


def test_there_are_exactly_the_30_documented_names() -> None:
    assert len(ContextNames) == 30
    assert [m.name for m in ContextNames] == list(TABLE)
    for member in ContextNames:
        assert member.value == member.name
        assert ContextNames(member.name) is member


@pytest.mark.parametrize("name", list(TABLE))
def test_type_default_and_durability_follow_the_table(name: str) -> None:
    tp, default, durable = TABLE[name]
    member = ContextNames[name]
    assert member.type == tp
    assert member.default_value == default
    assert type(member.default_value) is type(default)
    assert member.durable is durable


def test_the_three_names_ufo_got_wrong() -> None:
    assert ContextNames.CURRENT_ROUND_SUBTASK_AMOUNT.type is int
    assert ContextNames.ROUND_SUBTASK_AMOUNT.type == dict[int, int]
    assert ContextNames.WEAVING_MODE.type is WeavingMode
    assert isinstance(WeavingMode.CREATION, str)


def test_runtime_only_names() -> None:
    runtime = {m.name for m in ContextNames if not m.durable}
    assert runtime == {
        "APPLICATION_WINDOW",
        "LOGGER",
        "REQUEST_LOGGER",
        "EVALUATION_LOGGER",
        "CONSTELLATION",
    }


def test_mutable_defaults_are_fresh_per_read_and_per_context() -> None:
    for member in ContextNames:
        if isinstance(member.default_value, (list, dict)):
            assert member.default_value is not member.default_value
    a, b = Context(), Context()
    got = a.get(ContextNames.PREVIOUS_SUBTASKS)
    got.append("leak")
    assert a.get(ContextNames.PREVIOUS_SUBTASKS) == []
    assert b.get(ContextNames.PREVIOUS_SUBTASKS) == []
    tools = a.get(ContextNames.TOOL_INFO)
    tools["x"] = 1
    assert a.get(ContextNames.TOOL_INFO) == {} == b.get(ContextNames.TOOL_INFO)


def test_every_name_reads_its_default_on_a_fresh_context() -> None:
    ctx = Context()
    for member in ContextNames:
        assert ctx.get(member) == member.default_value
        assert ctx.get(member.value) == member.default_value


def test_derived_flags() -> None:
    assert {m.name for m in ContextNames if m.derived} == {
        "CURRENT_ROUND_STEP",
        "CURRENT_ROUND_COST",
        "CURRENT_ROUND_SUBTASK_AMOUNT",
    }
