"""Opening a session for a Context: the arguments checked, the session found or made.

:func:`check_open_args` refuses what ``Context.open`` cannot take before anything
is touched; :func:`attach` finds the session in the store (or makes it) and checks
that a reader's version is readable. Loading its state is :class:`~saucer.context.loading.Loader`'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from saucer.context.commit import SessionCreation
from saucer.context.working import DURABILITIES, check_text
from saucer.store.base import EventStore
from saucer.store.model import SessionExistsError, check_session_id, check_version

__all__ = ["attach", "check_open_args"]


def check_open_args(
    session_id: object,
    author: object,
    durability: object,
    at: int | None,
    snapshot_every: object,
    keep_snapshots: object,
) -> int | None:
    """Refuse the arguments of ``Context.open`` that it cannot take; return ``at`` checked."""
    if durability not in DURABILITIES:
        raise ValueError(f"durability must be one of {', '.join(DURABILITIES)}, not {durability!r}")
    if not isinstance(snapshot_every, int) or snapshot_every < 1:
        raise ValueError(f"snapshot_every must be an int >= 1, not {snapshot_every!r}")
    if not isinstance(keep_snapshots, int) or keep_snapshots < 1:
        raise ValueError(f"keep_snapshots must be an int >= 1, not {keep_snapshots!r}")
    if at is not None:
        at = check_version(at, "at")
    if not isinstance(session_id, str):
        check_session_id(session_id)  # raises
    check_text(author, "author")
    return at


def attach(
    store: EventStore,
    session_id: str,
    *,
    at: int | None,
    create: bool,
    meta: dict[str, Any] | None,
    participants: Iterable[str] | None = None,
) -> SessionCreation | None:
    """Find ``session_id`` in ``store``, creating it unless ``create`` is False or ``at`` is given;
    return how it was made when this call made it (None: it existed)."""
    creation: SessionCreation | None = None
    if not create and at is None and participants is None:
        return None  # the load reads the session's head: SessionNotFoundError there if it is unknown
    if not store.exists(session_id):
        if at is not None or not create:
            store.session_info(session_id)  # raises SessionNotFoundError
        made = SessionCreation(meta, None if participants is None else list(participants))
        try:
            store.create_session(session_id, meta=made.meta, participants=made.participants)
            creation = made
        except SessionExistsError:
            pass  # another writer created it just now: open theirs
    if participants is not None and creation is None:
        declared = store.session_info_without_plan(session_id)[0].participants
        if declared != frozenset(participants):
            raise ValueError(
                f"session {session_id!r} exists, and its participants were declared when it was made; "
                "a participant adds others with Context.add_participants"
            )
    if at is not None:
        store.check_readable(session_id, at)
    return creation
