"""The Context is a composition (issue 28): one class with collaborators, written contracts for what it writes."""

from __future__ import annotations

import ast
from pathlib import Path

from saucer.context import Context, ContextNames
from saucer.context.compat import RoundValue
from saucer.context.types import SERIALISED, serialised_record
from saucer.store.memory import MemoryStore

CONTEXT = Path(__file__).resolve().parents[2] / "src" / "saucer" / "context"


def test_context_inherits_from_nothing_and_every_collaborator_is_a_plain_class() -> None:
    assert Context.__bases__ == (object,)
    tree = ast.parse((CONTEXT / "context.py").read_text())
    classes = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    assert [c.name for c in classes] == ["Context"] and not classes[0].bases


def test_an_attribute_of_the_working_copy_is_declared_once_in_the_package() -> None:
    """No collaborator redeclares a field of the working copy (``self.state = ...`` lives in working.py only)."""
    names = {"state", "runtime", "pending", "pending_base", "caught_dropped", "step_mark", "committing", "lock"}
    names |= {"session_id", "durability", "read_only", "closed"}
    fields = names | {f"_{name}" for name in names} | {"_version", "store", "_store"}
    for path in CONTEXT.glob("*.py"):
        if path.name in ("working.py", "handle.py"):  # the copy itself; a StoreHandle's store and lock are its own
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                owner = node.value
                assert not (isinstance(owner, ast.Name) and owner.id == "self" and node.attr in fields), (
                    f"{path.name}:{node.lineno} declares self.{node.attr}, a field of WorkingCopy"
                )


def test_the_bound_hot_calls_are_the_methods_of_the_class() -> None:
    store = MemoryStore()
    ctx = Context.open(store, "s")
    Context.set(ctx, ContextNames.REQUEST, "via the class")
    assert ctx.get(ContextNames.REQUEST) == Context.get(ctx, ContextNames.REQUEST) == "via the class"
    ctx.charge({"n": 2})
    assert Context.commit(ctx) == ctx.version == 1
    assert ctx.get_var("n") == 2


def test_round_values_read_and_write_the_ledger_and_are_properties_on_the_class() -> None:
    assert isinstance(Context.current_round_cost, RoundValue)
    assert "ROUND_COST" in (Context.current_round_cost.__doc__ or "")
    ctx = Context()
    ctx.set(ContextNames.CURRENT_ROUND_ID, 4)
    ctx.current_round_cost += 0.25
    ctx.current_round_step = 2
    assert ctx.get(ContextNames.ROUND_COST) == {4: 0.25} and ctx.current_round_step == 2


def test_the_serialised_record_of_a_serialised_commit_is_read_back_by_its_contract() -> None:
    store = MemoryStore()
    engine = Context.open(store, "s", author="engine", serialise=True)
    engine.commit(meta={"kind": "start"})
    other = Context.open(store, "s", author="other")
    assert engine.compare_and_set("owner", None, "engine")
    other.update_vars(set={"owner": "other"})
    other.commit()
    engine.commit(meta={"kind": "step"})
    event = list(store.read("s", 2))[0]
    record = serialised_record(event.meta)
    assert record == {"based_on": 1, "ordered_after": [2], "changed": ["vars.owner"], "dropped": ["vars.owner"]}
    assert event.meta["kind"] == "step" and SERIALISED in event.meta


def test_serialised_record_is_none_for_a_commit_that_was_not_rebased_or_a_foreign_value() -> None:
    assert serialised_record(None) is None
    assert serialised_record({"kind": "step"}) is None
    assert serialised_record({SERIALISED: "not a record"}) is None
    assert serialised_record({SERIALISED: {"based_on": "1"}}) is None


def test_pending_operations_have_the_shapes_of_the_written_contract() -> None:
    ctx = Context.open(MemoryStore(), "s")
    ctx.set(ContextNames.CURRENT_ROUND_ID, 1)
    ctx.current_round_step = 3
    ctx.update_vars(set={"a": 1}, delete=["b"])
    ctx.incr("n")
    ctx.append(ContextNames.PREVIOUS_SUBTASKS, "done")
    ctx.compare_and_set("a", 1, 2)
    assert ctx.pending == [
        {"op": "set", "name": "CURRENT_ROUND_ID", "value": 1},
        {"op": "set", "name": "ROUND_STEP", "path": [1], "value": 3},
        {"op": "delete", "var": "b"},
        {"op": "set", "var": "a", "value": 1},
        {"op": "incr", "var": "n", "by": 1},
        {"op": "append", "name": "PREVIOUS_SUBTASKS", "value": "done"},
        {"op": "cas", "var": "a", "expected": 1, "value": 2},
    ]
