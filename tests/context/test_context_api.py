"""UFO-compatible Context API on a detached Context."""

import json

import pytest

from saucer.context import Context, ContextNames, WeavingMode


def test_names_values_equal_their_names_and_types() -> None:
    assert len(ContextNames) == 30
    for member in ContextNames:
        assert member.value == member.name
    assert ContextNames.CURRENT_ROUND_SUBTASK_AMOUNT.type is int
    assert ContextNames.ROUND_SUBTASK_AMOUNT.type == dict[int, int]
    assert ContextNames.WEAVING_MODE.default_value is WeavingMode.CREATION
    assert not ContextNames.LOGGER.durable and not ContextNames.CONSTELLATION.durable
    assert ContextNames.PREVIOUS_SUBTASKS.default_value is not ContextNames.PREVIOUS_SUBTASKS.default_value


def test_get_never_writes_and_derives_current_round_values() -> None:
    ctx = Context()
    assert ctx.get(ContextNames.CURRENT_ROUND_STEP) == 0
    assert ctx.to_dict()["ROUND_STEP"] == {}
    ctx.set(ContextNames.CURRENT_ROUND_ID, 3)
    ctx.current_round_cost += 0.5
    ctx.current_round_step = 2
    assert ctx.get(ContextNames.ROUND_COST) == {3: 0.5}
    assert ctx.get(ContextNames.CURRENT_ROUND_COST) == 0.5
    assert ctx.get(ContextNames.ROUND_STEP) == {3: 2}


def test_set_checks_key_and_type() -> None:
    ctx = Context()
    with pytest.raises(KeyError, match="NOPE"):
        ctx.set("NOPE", 1)
    with pytest.raises(TypeError, match="REQUEST"):
        ctx.set(ContextNames.REQUEST, 5)


def test_round_trip_keeps_int_round_ids_and_structural_logs() -> None:
    ctx = Context()
    ctx.set(ContextNames.CURRENT_ROUND_ID, 1)
    ctx.current_round_subtask_amount += 1
    ctx.add_to_structural_logs({"Round": 1, "SubtaskIndex": 0, "Action": "click"})
    ctx.add_to_structural_logs({"Round": 1})  # ignored: no SubtaskIndex
    data = json.loads(json.dumps(ctx.to_dict(ensure_serializable=True)))
    again = Context.from_dict(data)
    assert again.get(ContextNames.ROUND_SUBTASK_AMOUNT) == {1: 1}
    assert again.filter_structural_logs(1, 0, "Action") == ["click"]
    assert again.filter_structural_logs(1, 0, ["Action"]) == [{"Action": "click"}]
    with pytest.raises(TypeError):
        again.filter_structural_logs(1, 0, 3)  # type: ignore[arg-type]


def test_to_dict_without_copies_gives_the_same_state_as_with_them(tmp_path) -> None:
    """``to_dict(copy=False)`` (what ``saucer export`` writes) equals the copying one, value for value."""
    ctx = Context.open(f"sqlite:///{tmp_path}/s.db", "s")
    ctx.set(ContextNames.REQUEST, "r")
    ctx.add_to_structural_logs({"Round": 0, "SubtaskIndex": 0, "Step": 1, "Agent": "a"})
    ctx.update_vars(set={"v": [1, {"x": 2}]})
    ctx.commit()
    copied, shared = ctx.to_dict(ensure_serializable=True), ctx.to_dict(ensure_serializable=True, copy=False)
    assert copied == shared and shared["_vars"] == {"v": [1, {"x": 2}]}
    copied["_vars"]["v"].append(3)  # a copy is the caller's own
    assert ctx.get_var("v") == [1, {"x": 2}]
    ctx.close()
