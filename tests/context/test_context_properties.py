"""Property: whatever sequence of writes, live state == replayed from scratch == replayed from a snapshot.

Random sequences of sets, deletes, incr, append, compare-and-set and
update_vars on context vars and typed names (tuples, nested dicts, int-keyed
ledgers, structural logs), with commits and snapshots at random points, go
through a real SQLite store (so every value makes the JSON round trip). The
states are compared strictly: same types (int is not float, list is not
tuple, int keys are not str keys), same values.
"""

from __future__ import annotations

import math
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.support.context import CountingStore

from saucer.context import Context, ContextNames, WeavingMode
from saucer.store import open_store
from saucer.store.base import EventStore, Snapshot

N = ContextNames

# ------------------------------------------------------------ strategies

keys = st.sampled_from(["a", "b", "c", "n", "l", "d", "ключ", "k 1"])
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=-5, max_value=5),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=3).map(tuple),  # tuples are stored as lists, live too
        st.dictionaries(st.text(max_size=4), inner, max_size=4),
    ),
    max_leaves=10,
)
# Values that cannot be stored: each must be refused without changing anything.
unstorable = st.sampled_from([{1, 2}, object(), math.nan, {"x": math.inf}, {1: "int key"}, [2**64], "\ud800"])
values = st.one_of(json_values, json_values, json_values, unstorable)
numbers = st.one_of(st.integers(min_value=-1000, max_value=1000), st.floats(min_value=-1e6, max_value=1e6))
round_ids = st.integers(min_value=0, max_value=3)
round_keys = st.one_of(round_ids, round_ids.map(str))
int_ledgers = st.dictionaries(round_keys, st.integers(min_value=-100, max_value=100), max_size=3)
float_ledgers = st.dictionaries(round_keys, numbers, max_size=3)
entries = st.dictionaries(st.sampled_from(["Action", "Target", "Cost"]), json_values, max_size=3)
structural_logs = st.dictionaries(
    round_keys, st.dictionaries(round_keys, st.lists(entries, max_size=2), max_size=2), max_size=2
)

ops = st.one_of(
    st.tuples(st.just("set_var"), keys, values),
    st.tuples(st.just("update_vars"), st.dictionaries(keys, values, max_size=3), st.lists(keys, max_size=3)),
    st.tuples(st.just("delete_var"), keys),
    st.tuples(st.just("incr"), keys, numbers),
    st.tuples(st.just("append"), keys, values),
    st.tuples(st.just("cas"), keys, st.booleans(), values),
    st.tuples(st.just("set"), st.just(N.REQUEST), st.text(max_size=5)),
    st.tuples(st.just("set"), st.just(N.PREVIOUS_SUBTASKS), st.lists(json_values, max_size=3).map(tuple)),
    st.tuples(st.just("append"), st.just(N.PREVIOUS_SUBTASKS), values),
    st.tuples(st.just("set"), st.just(N.CURRENT_ROUND_ID), round_ids),
    st.tuples(st.just("set"), st.just(N.CURRENT_ROUND_STEP), st.integers(min_value=0, max_value=50)),
    st.tuples(st.just("incr"), st.just(N.CURRENT_ROUND_STEP), st.integers(min_value=-3, max_value=3)),
    st.tuples(st.just("set"), st.just(N.CURRENT_ROUND_COST), numbers),
    st.tuples(st.just("incr"), st.just(N.CURRENT_ROUND_COST), numbers),
    st.tuples(st.just("cost+="), numbers),
    st.tuples(st.just("incr"), st.just(N.CURRENT_ROUND_SUBTASK_AMOUNT), st.integers(min_value=0, max_value=3)),
    st.tuples(st.just("incr"), st.just(N.SESSION_STEP), st.integers(min_value=0, max_value=3)),
    st.tuples(st.just("incr"), st.just(N.SESSION_COST), numbers),
    st.tuples(st.just("set"), st.just(N.ROUND_STEP), int_ledgers),
    st.tuples(st.just("set"), st.just(N.ROUND_COST), float_ledgers),
    st.tuples(st.just("set"), st.just(N.STRUCTURAL_LOGS), structural_logs),
    st.tuples(st.just("log"), round_ids, round_ids, entries),
    st.tuples(st.just("set"), st.just(N.TOOL_INFO), st.dictionaries(st.text(max_size=3), values, max_size=3)),
    st.tuples(
        st.just("update_dict"), st.just(N.TOOL_INFO), st.dictionaries(st.text(max_size=3), json_values, max_size=2)
    ),
    st.tuples(st.just("update_dict"), st.just(N.ROUND_STEP), int_ledgers),
    st.tuples(st.just("set"), st.just(N.APPLICATION_WINDOW_INFO), values),
    st.tuples(st.just("set"), st.just(N.WEAVING_MODE), st.sampled_from(list(WeavingMode) + ["editing"])),
    st.tuples(st.just("cas"), st.just(N.REQUEST), st.booleans(), st.text(max_size=3)),
    st.tuples(st.just("cas"), st.just(N.CURRENT_ROUND_STEP), st.booleans(), st.integers(min_value=0, max_value=9)),
    st.tuples(st.just("cas"), st.just(N.ROUND_COST), st.booleans(), float_ledgers),
    st.tuples(
        st.just("many"),
        st.fixed_dictionaries(
            {N.REQUEST: st.text(max_size=3), N.CURRENT_ROUND_ID: round_ids, N.CURRENT_ROUND_STEP: st.integers(0, 9)}
        ),
    ),
    st.just(("commit",)),
    st.just(("commit",)),
    st.just(("snapshot",)),
)


def _apply(ctx: Context, op: tuple[Any, ...]) -> None:
    kind = op[0]
    try:
        if kind == "set_var":
            ctx.update_vars(set={op[1]: op[2]})
        elif kind == "update_vars":
            ctx.update_vars(set=op[1], delete=op[2])
        elif kind == "delete_var":
            ctx.delete_var(op[1])
        elif kind == "incr":
            ctx.incr(op[1], op[2])
        elif kind == "append":
            ctx.append(op[1], op[2])
        elif kind == "cas":
            key, use_current, new = op[1], op[2], op[3]
            current = ctx.get(key) if isinstance(key, ContextNames) else ctx.get_var(key)
            ctx.compare_and_set(key, current if use_current else new, new)
        elif kind == "set":
            ctx.set(op[1], op[2])
        elif kind == "cost+=":
            ctx.current_round_cost += op[1]
        elif kind == "log":
            ctx.add_to_structural_logs({"Round": op[1], "SubtaskIndex": op[2], **op[3]})
        elif kind == "update_dict":
            ctx.update_dict(op[1], op[2])
        elif kind == "many":
            ctx.update_dict(op[1])
        elif kind == "commit":
            ctx.commit()
        elif kind == "snapshot":
            ctx.commit()
            ctx.snapshot()
    except (TypeError, ValueError):
        pass  # refused (wrong type, unstorable, not a number/list): nothing may have changed


# ------------------------------------------------------------- comparison


def _strict(a: Any, b: Any, where: str = "") -> None:
    assert type(a) is type(b), f"{where}: {type(a).__name__} {a!r} != {type(b).__name__} {b!r}"
    if isinstance(a, dict):
        assert a.keys() == b.keys(), f"{where}: keys {list(a)} != {list(b)}"
        for k in a:
            _strict(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, list):
        assert len(a) == len(b), f"{where}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            _strict(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and a == 0.0:
        assert math.copysign(1, a) == math.copysign(1, b), f"{where}: {a!r} != {b!r}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _state(ctx: Context) -> dict[str, Any]:
    return {"names": ctx.to_dict(), "vars": dict(ctx.vars)}


class NoSnapshots(CountingStore):
    """The same store, with its snapshots hidden: opening replays every event."""

    def _snapshot(self, session_id: str, upto: int | None) -> Snapshot | None:
        return None

    def save_snapshot(self, snapshot: Snapshot) -> None:
        pass


@pytest.fixture(scope="module")
def store() -> Iterator[EventStore]:
    with tempfile.TemporaryDirectory() as tmp:
        s = open_store(f"sqlite:///{Path(tmp) / 'prop.db'}")
        yield s
        s.close()


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(program=st.lists(ops, min_size=1, max_size=30))
def test_live_equals_replayed_from_scratch_and_from_a_snapshot(
    store: EventStore, program: list[tuple[Any, ...]]
) -> None:
    sid = uuid.uuid4().hex
    ctx = Context.open(store, sid, snapshot_every=10**9)
    seen: dict[int, dict[str, Any]] = {0: _state(ctx)}
    for op in program:
        _apply(ctx, op)
        if op[0] in ("commit", "snapshot"):
            seen[ctx.version] = _state(ctx)
    ctx.commit()
    live = _state(ctx)
    seen[ctx.version] = live

    # 1. from scratch: every event through the fold, no snapshot
    scratch = Context.open(NoSnapshots(store), sid)
    _strict(live, _state(scratch), "scratch")
    # 2. from the newest snapshot taken during the run (if any) plus the tail
    tail = Context.open(store, sid)
    _strict(live, _state(tail), "snapshot+tail")
    # 3. from a snapshot of exactly the final state
    ctx.snapshot()
    final = Context.open(store, sid)
    _strict(live, _state(final), "snapshot")
    # every committed version reads back as it was live
    for version, state in seen.items():
        _strict(state, _state(Context.open(NoSnapshots(store), sid, at=version)), f"v{version} scratch")
        _strict(state, _state(Context.open(store, sid, at=version)), f"v{version}")


@settings(max_examples=60, deadline=None)
@given(program=st.lists(ops, min_size=1, max_size=30))
def test_detached_live_equals_its_dict_round_trip(program: list[tuple[Any, ...]]) -> None:
    ctx = Context()
    for op in program:
        if op[0] not in ("commit", "snapshot"):
            _apply(ctx, op)
    again = Context.from_dict(ctx.to_dict())
    _strict(_state(ctx), _state(again), "from_dict")
