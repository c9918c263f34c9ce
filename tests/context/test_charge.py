"""Context.charge: a step's ledger as ONE change, the same as the separate calls."""

from __future__ import annotations

import pytest

from saucer.context import Context, ContextNames
from saucer.context.replay import replay
from saucer.store.memory import MemoryStore

_ENTRY = {"Round": 1, "SubtaskIndex": 0, "Step": 1, "Agent": "a", "State": "CONTINUE", "Status": "CONTINUE"}


def _open(name: str) -> Context:
    ctx = Context.open(MemoryStore(), name)
    ctx.set(ContextNames.CURRENT_ROUND_ID, 1)
    ctx.commit()
    return ctx


def test_charge_is_the_separate_calls_as_one_batch() -> None:
    one, many = _open("one"), _open("many")
    incs = {
        ContextNames.SESSION_STEP: 1,
        ContextNames.CURRENT_ROUND_STEP: 1,
        ContextNames.SESSION_COST: 0.5,
        ContextNames.CURRENT_ROUND_COST: 0.5,
        "retries": 2,
    }
    one.charge(incs, _ENTRY)
    for key, by in incs.items():
        many.incr(key, by)
    many.add_to_structural_logs(_ENTRY)
    assert one.pending == many.pending and len(one.pending) == 6
    assert one.to_dict() == many.to_dict()
    version = one.commit()
    assert one.get(ContextNames.CURRENT_ROUND_STEP) == 1 and one.get(ContextNames.CURRENT_ROUND_COST) == 0.5
    assert one.store is not None
    replayed = replay(one.store, "one", version).state
    assert replayed.names["STRUCTURAL_LOGS"] == {1: {0: [_ENTRY]}} and replayed.vars == {"retries": 2}


def test_charge_checks_everything_before_it_applies_anything() -> None:
    ctx = _open("bad")
    ctx.update_vars(set={"label": "text"})
    ctx.commit()
    for incs, entry, error in (
        ({ContextNames.SESSION_STEP: 1, "label": 1}, _ENTRY, TypeError),  # not a number
        ({ContextNames.SESSION_STEP: 1.5}, _ENTRY, TypeError),  # an int name
        ({ContextNames.SESSION_STEP: 1}, {**_ENTRY, "x": object()}, TypeError),  # not storable
    ):
        with pytest.raises(error):
            ctx.charge(incs, entry)
        assert ctx.pending == [] and ctx.get(ContextNames.SESSION_STEP) == 0


def test_an_increment_whose_result_leaves_64_bits_is_refused() -> None:
    from saucer.context.wire import ValueNotStorableError

    ctx = _open("big")
    ctx.incr("n", 2**63 - 2)
    ctx.incr("n", 1)  # 2**63 - 1: the largest that fits
    for by in (1, 2**64, -(2**65)):
        with pytest.raises(ValueNotStorableError, match="64-bit"):
            ctx.incr("n", by)
    ctx.incr("m", -(2**63))
    with pytest.raises(ValueNotStorableError, match="64-bit"):
        ctx.charge({"m": -1})
    assert ctx.get_var("n") == 2**63 - 1 and ctx.get_var("m") == -(2**63)


def _separately(ctx: Context, incs: dict, entry: dict | None) -> object:
    """What the separate calls do: the ops they make, or the error they raise."""
    try:
        with ctx._work.lock:
            ops = [ctx._access.incr_op(key, by)[0] for key, by in incs.items()]
        return ops
    except (TypeError, ValueError) as exc:
        return type(exc)


@pytest.mark.parametrize(
    "incs",
    [
        {ContextNames.SESSION_STEP: 1, ContextNames.CURRENT_ROUND_STEP: 1},
        {ContextNames.CURRENT_ROUND_COST: 1},  # an int for a float ledger: made a float
        {ContextNames.CURRENT_ROUND_COST: 0.25, ContextNames.SESSION_COST: 0.25},
        {ContextNames.CURRENT_ROUND_SUBTASK_AMOUNT: True},  # a bool is not a number
        {ContextNames.CURRENT_ROUND_STEP: 1.0},  # a float for an int ledger
        {ContextNames.SESSION_STEP: 2**63 - 1},  # the result leaves 64 bits
        {ContextNames.CURRENT_ROUND_COST: 1e308, ContextNames.SESSION_COST: 1e308},  # then inf
        {"retries": 1, ContextNames.SESSION_STEP: 1},
    ],
)
def test_the_ledgers_fast_path_makes_what_incr_op_makes(incs: dict) -> None:
    """Context.charge reads counters and the current round's ledger entries inline: the same operations
    as incr_op's, or the same refusal, for each kind of increment; twice, so that the second reads a made entry."""
    ctx = _open("fast")
    for _ in range(2):
        expected = _separately(ctx, incs, None)
        if isinstance(expected, type):
            with pytest.raises(expected):
                ctx.charge(incs)
            assert ctx.pending == []
            return
        ctx.charge(incs)
        assert ctx.pending == expected
        ctx.commit()


def test_the_fast_path_reads_a_ledger_packed_by_a_snapshot() -> None:
    store = MemoryStore()
    ctx = Context.open(store, "packed", snapshot_every=1_000_000)
    ctx.update_dict(ContextNames.ROUND_STEP, {r: 1 for r in range(3000)})  # large enough to be packed
    ctx.set(ContextNames.CURRENT_ROUND_ID, 7)
    ctx.commit()
    ctx.snapshot()
    reopened = Context.open(store, "packed")
    assert "ROUND_STEP" in reopened._work.state.packed
    reopened.charge({ContextNames.CURRENT_ROUND_STEP: 1, ContextNames.SESSION_STEP: 1}, _ENTRY)
    assert reopened.get(ContextNames.CURRENT_ROUND_STEP) == 2
    reopened.commit()
    assert Context.open(store, "packed").get(ContextNames.ROUND_STEP)[7] == 2


def test_a_ledger_entry_of_a_new_round_starts_at_zero() -> None:
    ctx = _open("fresh")
    ctx.charge({ContextNames.CURRENT_ROUND_STEP: 1, ContextNames.CURRENT_ROUND_COST: 0.5})
    ctx.set(ContextNames.CURRENT_ROUND_ID, 2)
    ctx.charge({ContextNames.CURRENT_ROUND_STEP: 1, ContextNames.CURRENT_ROUND_COST: 0.5})
    assert ctx.get(ContextNames.ROUND_STEP) == {1: 1, 2: 1}
    assert ctx.get(ContextNames.ROUND_COST) == {1: 0.5, 2: 0.5}
    assert all(type(v) is float for v in ctx.get(ContextNames.ROUND_COST).values())
