"""Snapshots of a large, growing state are spaced by the tail's size, and hydrate stays exact."""

from __future__ import annotations

from saucer.context import Context
from saucer.store.memory import MemoryStore


def _recording(store: MemoryStore) -> list[int]:
    taken: list[int] = []
    save = store.save_snapshot

    def record(snapshot):  # type: ignore[no-untyped-def]
        taken.append(snapshot.version)
        save(snapshot)

    store.save_snapshot = record  # type: ignore[method-assign]
    return taken


def test_small_state_snapshots_every_k_events() -> None:
    store = MemoryStore()
    taken = _recording(store)
    ctx = Context.open(store, "s", snapshot_every=10)
    for i in range(50):
        ctx.update_vars(set={"i": i})
        ctx.commit()
    assert taken == [10, 20, 30, 40, 50]


def test_large_growing_state_spaces_snapshots_and_replays_exactly() -> None:
    store = MemoryStore()
    taken = _recording(store)
    ctx = Context.open(store, "s", snapshot_every=10)
    steps = 1500
    for i in range(steps):
        ctx.append("log", "x" * 500 + str(i))  # ~750 KB by the end
        ctx.commit()
    # Every 10 events while the state is under 64 KB (~130 entries), then
    # further apart as it grows: the next one when the tail is worth half a snapshot.
    assert taken[:13] == list(range(10, 131, 10))
    gaps = [b - a for a, b in zip(taken, taken[1:], strict=False)]
    assert len(taken) < 20 and all(g > 10 for g in gaps[12:]) and gaps == sorted(gaps), taken
    reopened = Context.open(store, "s")
    assert reopened.get_var("log") == ctx.get_var("log") and len(reopened.get_var("log")) == steps
    # The tail a hydrate replays stays under half a snapshot's worth of events.
    last_size = 500 * taken[-1]
    assert reopened.version - taken[-1] <= last_size // (2 * 64) + 10
