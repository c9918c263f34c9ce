"""Small helpers of the store contract (:mod:`saucer.store.testing`): operations, logs, snapshots."""

from __future__ import annotations

import time
from typing import Any

from saucer.store.base import EventStore
from saucer.store.model import Snapshot

__all__ = ["base_state", "fill", "latest", "set_op", "snapshot_at"]


def set_op(key: str, value: Any) -> list[dict[str, Any]]:
    """The operations that set the variable ``key`` to ``value``."""
    return [{"op": "set", "var": key, "value": value}]


def fill(store: EventStore, sid: str, n: int, start: int = 0) -> None:
    """Append ``n`` events to ``sid`` from version ``start``; each sets ``i`` to its version."""
    for i in range(start, start + n):
        store.append(sid, i, set_op("i", i + 1), author="test")


def snapshot_at(sid: str, version: int) -> Snapshot:
    """A snapshot of ``sid`` at ``version`` (its state names the version)."""
    return Snapshot(sid, version, time.time(), {"names": {"ROUND_STEP": {"1": version}}, "vars": {"i": version}})


def base_state(version: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Base operations and state for a log made by :func:`fill` (it sets ``i`` to the version)."""
    return set_op("i", version), {"names": {}, "vars": {"i": version}}


def latest(store: EventStore, sid: str, upto: int | None = None) -> Snapshot:
    """The snapshot :meth:`~saucer.store.EventStore.latest_snapshot` gives, which must exist."""
    snap = store.latest_snapshot(sid, upto)
    assert snap is not None, f"no snapshot of {sid!r} at or before {upto}"
    return snap
