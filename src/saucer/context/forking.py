"""Forking a Context: a new session that starts from another's state at a version.

:func:`create_fork` makes the new session (its meta names the parent and the
version); :func:`fork` opens the new session's Context like its parent's and
gives it its own snapshot of the fork point.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from saucer.context.commit import Committer
from saucer.context.handle import StoreHandle
from saucer.context.snapshots import Snapshotter
from saucer.context.types import ForkOrigin
from saucer.context.working import WorkingCopy
from saucer.store.base import EventStore
from saucer.store.model import check_version

__all__ = ["Forkable", "create_fork", "fork"]


class Forkable(Protocol):
    """What forking reads of a Context (and sets on its child)."""

    _work: WorkingCopy
    _committer: Committer
    _snapshots: Snapshotter
    _handle: StoreHandle | None


_C = TypeVar("_C", bound=Forkable)


def create_fork(store: EventStore, parent_id: str, session_id: str, at: int) -> None:
    """Make ``session_id``, a fork of ``parent_id`` at version ``at`` (its meta says so: :class:`ForkOrigin`)."""
    origin: ForkOrigin = {"forked_from": parent_id, "at": at}
    store.create_session(session_id, parent_id=parent_id, parent_version=at, meta=dict(origin))


def fork(parent: _C, open_child: Callable[..., _C], new_session_id: str, at: int | None, author: str | None) -> _C:
    """A writable Context for ``new_session_id`` (opened by ``open_child``, ``Context.open``), a new session
    starting from ``parent``'s state at ``at`` (its version when None); see ``Context.fork``."""
    store, sid = parent._work.require_store()
    at = parent._work.version if at is None else check_version(at, "at")
    create_fork(store, sid, new_session_id, at)
    child = open_child(
        store,
        new_session_id,
        author=author or parent._committer.author,
        durability=parent._work.durability,
        snapshot_every=parent._snapshots.every,
        keep_snapshots=parent._snapshots.keep,
    )
    if parent._handle is not None:
        # The store was opened from a URL for the parent: the child shares
        # it, and it is closed when the last of them closes.
        child._handle = parent._handle.retain()
    if at > 0 and child._snapshots.version < at:
        # The child's own snapshot of the fork point (state, not log): its
        # opens stay bounded even after the parent's snapshots are pruned.
        child._snapshots.auto()
    return child
